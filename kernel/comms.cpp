// Jupyter comms for Python (ipywidgets and anything on the `comm` package), over xeus's comm
// manager: `_kernel_ext.Comm` is one xeus::xcomm; `register_target` makes a target whose comms,
// opened by the front end, are handed to a Python callback. python/xmesh/_kernel/comms.py builds
// the `comm` package's API on these. Handlers run on the shell thread, which takes the GIL for them.
#include "comms.hpp"

#include <memory>
#include <string>

#include <xeus/xcomm.hpp>
#include <xeus/xinterpreter.hpp>

#include "json_py.hpp"

namespace xmesh::kernel {

namespace {

py::list buffers_to_py(const xeus::buffer_sequence& buffers) {
  py::list out;
  for (const auto& b : buffers) out.append(py::memoryview(py::bytes(b.data(), b.size())));
  return out;
}

xeus::buffer_sequence buffers_from_py(const py::object& buffers) {
  xeus::buffer_sequence out;
  if (buffers.is_none()) return out;
  for (py::handle b : buffers) {
    py::object raw = py::isinstance<py::memoryview>(b) ? b.attr("tobytes")() : py::reinterpret_borrow<py::object>(b);
    std::string bytes = py::bytes(raw).cast<std::string>();
    out.emplace_back(bytes.begin(), bytes.end());
  }
  return out;
}

py::dict message_to_py(const xeus::xmessage& m) {
  py::dict d;
  d["header"] = to_py(m.header());
  d["parent_header"] = to_py(m.parent_header());
  d["metadata"] = to_py(m.metadata());
  d["content"] = to_py(m.content());
  d["buffers"] = buffers_to_py(m.buffers());
  return d;
}

nl::json json_or_empty(const py::object& o) { return o.is_none() ? nl::json::object() : from_py(o); }

// The target of a name, registered (with no callback for front-end opens) if it was not: a comm
// the kernel opens needs one.
xeus::xtarget* target_named(const std::string& name) {
  auto& manager = xeus::get_interpreter().comm_manager();
  if (xeus::xtarget* t = manager.target(name)) return t;
  manager.register_comm_target(name, [](xeus::xcomm&&, xeus::xmessage) {});
  return manager.target(name);
}

// Calls a Python handler with a message, from the shell thread: an error in it is the
// handler's, reported like an unraisable one, never a kernel failure.
void call_with_message(const std::shared_ptr<py::object>& handler, const xeus::xmessage& m) {
  py::gil_scoped_acquire gil;
  if (!handler || handler->is_none()) return;
  try {
    (*handler)(message_to_py(m));
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("a comm's message handler");
  }
}

class Comm {
 public:
  Comm(const std::string& target_name, const std::string& comm_id)
      : comm_(target_named(target_name), comm_id.empty() ? xeus::new_xguid() : xeus::xguid(comm_id)) {
    wire();
  }
  explicit Comm(xeus::xcomm&& comm) : comm_(std::move(comm)) { wire(); }
  Comm(Comm&&) = default;  // (a copy would register the comm twice)
  Comm(const Comm&) = delete;

  std::string comm_id() const { return std::string(comm_.id()); }
  std::string target_name() const { return comm_.target().name(); }
  void open(const py::object& data, const py::object& metadata, const py::object& buffers) {
    comm_.open(json_or_empty(metadata), json_or_empty(data), buffers_from_py(buffers));
  }
  void send(const py::object& data, const py::object& metadata, const py::object& buffers) {
    comm_.send(json_or_empty(metadata), json_or_empty(data), buffers_from_py(buffers));
  }
  void close(const py::object& data, const py::object& metadata, const py::object& buffers) {
    comm_.close(json_or_empty(metadata), json_or_empty(data), buffers_from_py(buffers));
  }
  void on_message(py::object handler) { *on_message_ = std::move(handler); }
  void on_close(py::object handler) { *on_close_ = std::move(handler); }

 private:
  void wire() {
    auto on_message = on_message_, on_close = on_close_;
    comm_.on_message([on_message](xeus::xmessage m) { call_with_message(on_message, m); });
    comm_.on_close([on_close](xeus::xmessage m) { call_with_message(on_close, m); });
  }

  xeus::xcomm comm_;
  std::shared_ptr<py::object> on_message_ = std::make_shared<py::object>(py::none());
  std::shared_ptr<py::object> on_close_ = std::make_shared<py::object>(py::none());
};

}  // namespace

void bind_comms(py::module_& m) {
  py::class_<Comm>(m, "Comm", "One Jupyter comm (a xeus::xcomm): opened here or by the front end.")
      .def(py::init<const std::string&, const std::string&>(), py::arg("target_name"), py::arg("comm_id") = "")
      .def_property_readonly("comm_id", &Comm::comm_id)
      .def_property_readonly("target_name", &Comm::target_name)
      .def("open", &Comm::open, py::arg("data") = py::none(), py::arg("metadata") = py::none(),
           py::arg("buffers") = py::none())
      .def("send", &Comm::send, py::arg("data") = py::none(), py::arg("metadata") = py::none(),
           py::arg("buffers") = py::none())
      .def("close", &Comm::close, py::arg("data") = py::none(), py::arg("metadata") = py::none(),
           py::arg("buffers") = py::none())
      .def("on_message", &Comm::on_message, "handler(msg) for each comm_msg (msg: a dict as ipykernel gives)")
      .def("on_close", &Comm::on_close, "handler(msg) when the front end closes it");
  m.def("register_target", [](const std::string& name, py::object callback) {
    auto cb = std::make_shared<py::object>(std::move(callback));
    xeus::get_interpreter().comm_manager().register_comm_target(name, [cb](xeus::xcomm&& comm, xeus::xmessage m) {
      py::gil_scoped_acquire gil;
      try {
        (*cb)(Comm(std::move(comm)), message_to_py(m));
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("a comm target's callback");
      }
    });
  }, "Calls callback(comm, msg) for each comm the front end opens on target `name`.");
  m.def("unregister_target", [](const std::string& name) {
    xeus::get_interpreter().comm_manager().unregister_comm_target(name);
  });
}

}  // namespace xmesh::kernel
