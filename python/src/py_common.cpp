// What the binding files share (py_common.hpp).
#include "py_common.hpp"

#include <mutex>
#include <vector>

#include "json_py.hpp"

namespace {
// ---- Payload frames --------------------------------------------------------------------
// Large buffers are sent without copying: ZeroMQ keeps a pointer to the Python buffer and
// calls free_buffer when done, possibly on its own I/O thread where the GIL cannot be taken.
// Releases are queued and done on the next call into the module that holds the GIL.
struct HeldBuffer {
  Py_buffer view;
};
std::mutex g_release_mu;
std::vector<HeldBuffer*> g_release;
// Python objects whose memory a data thread used (a transfer's source or destination), let go
// the same way: the thread that finished with them cannot take the GIL.
std::vector<PyObject*> g_release_objects;

}  // namespace

void free_buffer(void*, void* hint) {
  std::lock_guard<std::mutex> g(g_release_mu);
  g_release.push_back(static_cast<HeldBuffer*>(hint));
}

void release_later(PyObject* object) {
  std::lock_guard<std::mutex> g(g_release_mu);
  g_release_objects.push_back(object);
}

void drain_releases() {
  std::vector<HeldBuffer*> todo;
  std::vector<PyObject*> objects;
  {
    std::lock_guard<std::mutex> g(g_release_mu);
    todo.swap(g_release);
    objects.swap(g_release_objects);
  }
  for (auto* h : todo) {
    PyBuffer_Release(&h->view);
    delete h;
  }
  for (auto* o : objects) Py_DECREF(o);
}

std::vector<zmq::message_t> to_frames(const py::handle& frames) {
  drain_releases();
  std::vector<zmq::message_t> out;
  if (frames.is_none()) return out;
  for (auto f : frames) {
    auto* h = new HeldBuffer;
    if (PyObject_GetBuffer(f.ptr(), &h->view, PyBUF_SIMPLE) != 0) {
      delete h;
      PyErr_Clear();
      // PickleBuffers of non-contiguous data and the like: fall back to a contiguous copy.
      py::bytes b = py::module_::import("builtins").attr("bytes")(py::module_::import("builtins").attr("memoryview")(f));
      std::string s = b;
      out.emplace_back(s.data(), s.size());
      continue;
    }
    if (static_cast<size_t>(h->view.len) < kZeroCopyMin) {
      out.emplace_back(h->view.buf, static_cast<size_t>(h->view.len));
      PyBuffer_Release(&h->view);
      delete h;
    } else {
      out.emplace_back(h->view.buf, static_cast<size_t>(h->view.len), free_buffer, h);
    }
  }
  return out;
}

py::list frames_to_py(std::vector<zmq::message_t>& frames) {
  py::list l;
  for (auto& f : frames) {
    if (f.size() < kZeroCopyMin) {  // small: a bytes copy is cheaper than a Frame object
      l.append(py::bytes(static_cast<const char*>(f.data()), f.size()));
      continue;
    }
    auto fr = std::make_unique<Frame>();
    fr->msg.move(f);
    l.append(py::cast(std::move(fr)));
  }
  frames.clear();
  return l;
}

py::object pop_inbox(Inbox& box, const py::object& timeout) {
  std::optional<Message> got;
  bool ok = wait_sliced(
      [&](int ms) {
        got = box.pop(ms);
        return got.has_value() || box.closed();
      },
      opt_timeout(timeout));
  if (!ok || !got) return py::none();
  auto pm = std::make_unique<PyMessage>();
  pm->m = std::move(*got);
  return py::cast(std::move(pm));
}

Header make_header(int kind, const py::object& body, const std::string& actor, const std::string& method,
                   uint64_t corr, int64_t index, const py::object& ctx) {
  if (!kind_known(kind)) throw py::value_error("unknown message kind " + std::to_string(kind));
  Header h;
  h.kind = static_cast<Kind>(kind);
  h.body = from_py(body);
  if (!h.body.is_null() && !h.body.is_object()) throw py::type_error("message body must be a dict");
  h.actor = actor;
  h.method = method;
  h.corr = corr;
  h.index = index;
  h.ctx = from_py(ctx);
  return h;
}

py::object decode_text(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}
