// xmesh._core: the data plane's face (runtime/data): buffers a node lends, the transfers a
// DataPlane makes, the RDMA probe, device memory.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "data_bodies.hpp"
#include "body_bindings.hpp"
#include "bindings.hpp"
#include "data_node.hpp"
#include "data_plane.hpp"
#include "device_memory.hpp"
#include "ibverbs_probe.hpp"
#include "py_common.hpp"
#include "util.hpp"

namespace {
// The CUDA driver for device memory (runtime/data/device_memory.hpp), or a RuntimeError saying why
// there is none.
std::shared_ptr<DeviceMemory> cuda_or_throw() {
  std::string why;
  auto driver = load_cuda_driver(&why);
  if (!driver) throw std::runtime_error(why);
  return driver;
}

// What a node lends, and the probes of what this machine can do.
void bind_buffers(py::module_& m) {
  node_class(m)
      .def("lend_buffer", [](Node& n, uintptr_t addr, uint64_t size, bool writable, bool device) {
        return DataNode::of(n).buffers().lend(reinterpret_cast<void*>(addr), size, writable, device ? cuda_or_throw() : nullptr);
      }, py::arg("addr"), py::arg("size"), py::arg("writable"), py::arg("device") = false,
         "Lends memory as an RDMA buffer (device: the CUDA driver's memory, staged per lease): its id.")
      .def("drop_buffer", [](Node& n, uint64_t id) { return DataNode::of(n).buffers().drop(id); },
           "Lends it no more: the leases still holding it (-1: not lent).")
      .def("buffer_held", [](Node& n, uint64_t id) { return DataNode::of(n).buffers().holds(id); },
           "Whether a buffer is lent, or dropped with a lease still holding it.");

  m.def("buffer_info", [](const py::object& o, bool writable) {
    Py_buffer v;
    if (PyObject_GetBuffer(o.ptr(), &v, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) != 0) {
      PyErr_Clear();
      if (writable && PyObject_GetBuffer(o.ptr(), &v, PyBUF_C_CONTIGUOUS) == 0) {
        PyBuffer_Release(&v);
        throw py::value_error("the memory is read-only (a destination must be writable)");
      }
      throw py::value_error("the memory is not C-contiguous (copy it into a contiguous buffer first)");
    }
    auto out = py::make_tuple(reinterpret_cast<uintptr_t>(v.buf), static_cast<uint64_t>(v.len), bool(v.readonly));
    PyBuffer_Release(&v);
    return out;
  }, py::arg("obj"), py::arg("writable") = false,
     "(address, bytes, read-only) of a C-contiguous buffer-protocol object; ValueError naming why not.");
  m.def("probe_ibverbs", [] {
    const auto& p = probe_ibverbs();
    py::dict d;
    d["usable"] = p.usable;
    d["device"] = p.device;
    d["listed"] = p.listed;
    d["why"] = p.why;
    return d;
  }, "Whether RDMA through libibverbs carries a loopback transfer here (runtime/data/ibverbs_probe.hpp).");
  m.def("host_key", &host_key, "Which machine and process namespace this is (same key: copies by pid).");

}

// The transfers a process makes (runtime/data/data_plane.hpp).
void bind_transfers(py::module_& m) {
  py::class_<DataPlane::Stats>(m, "DataPlaneStats")
      .def_readonly("ops", &DataPlane::Stats::ops)
      .def_readonly("bytes", &DataPlane::Stats::bytes)
      .def_readonly("same_host", &DataPlane::Stats::same_host)
      .def_readonly("streamed", &DataPlane::Stats::streamed)
      .def_readonly("in_messages", &DataPlane::Stats::in_messages)
      .def_readonly("rdma", &DataPlane::Stats::rdma)
      .def_readonly("failed", &DataPlane::Stats::failed)
      .def_readonly("late_leases", &DataPlane::Stats::late_leases);
  m.def("check_device_memory", [](uintptr_t addr, uint64_t size) {
    auto driver = cuda_or_throw();
    if (!driver->holds(reinterpret_cast<const void*>(addr), size))
      throw py::value_error("it is not " + std::to_string(size) + " bytes of device memory known to " + driver->name());
  }, py::arg("addr"), py::arg("size"),
     "Raises (RuntimeError: no CUDA driver, saying why; ValueError: not its memory) unless [addr, addr + size) is "
     "device memory of the CUDA driver (runtime/data/device_memory.hpp).");
  using Op = std::tuple<std::string, uint64_t, uint64_t, uint64_t, uintptr_t, bool, bool>;
  py::class_<DataPlane, std::shared_ptr<DataPlane>>(m, "DataPlane")
      .def(py::init([](const std::shared_ptr<Node>& node, size_t threads) {
             return std::make_shared<DataPlane>(*node, threads);
           }),
           py::arg("node"), py::arg("threads") = 0, py::keep_alive<1, 2>())
      .def("submit", [](DataPlane& d, const std::vector<Op>& ops, const py::object& timeout_s, const py::object& keep) {
        std::vector<DataOp> todo;
        for (auto& [owner, buffer, offset, size, local, write, device] : ops)
          todo.push_back({owner, buffer, offset, size, reinterpret_cast<char*>(local), write,
                          device ? cuda_or_throw() : nullptr});
        // Seconds (None: no limit); past what an int of milliseconds holds (24 days) is no limit.
        const double ms = timeout_s.is_none() ? -1 : timeout_s.cast<double>() * 1000;
        const int timeout_ms = ms < 0 || ms > 2147483647.0 ? -1 : static_cast<int>(ms);
        PyObject* held = keep.ptr();
        Py_INCREF(held);
        auto let_go = [held] { release_later(held); };
        try {
          py::gil_scoped_release release;
          return d.submit(std::move(todo), timeout_ms, let_go);
        } catch (...) {
          Py_DECREF(held);
          throw;
        }
      }, py::arg("ops"), py::arg("timeout"), py::arg("keepalive"),
         "ops: [(owner address, buffer id, offset, size, local address, write, local on the CUDA device)]; keepalive stays referenced "
         "until no data thread uses the local memory. Returns the Call the transfer answers.")
      .def("stats", &DataPlane::stats);
}
}  // namespace

// The data plane (runtime/data/data_plane.hpp, buffer_registry.hpp): the memory a process lends, and
// the transfers it makes.
// The data plane's message bodies, bound before the messages that return them (bindings.hpp).
void bind_data_bodies(py::module_& m) {
  bind_body<BufferLeaseBody>(m, "BufferLeaseBody", "BufferLease: a lease on a range of an RDMA buffer, for reading or writing.");
  bind_body<BufferLeaseReply>(m, "BufferLeaseReply", "Where a leased range is: the owner's pid, the address there, the lease.");
  bind_body<BufferReleaseBody>(m, "BufferReleaseBody", "BufferRelease / BufferDrop: a lease ended, or a buffer lent no more.");
}

void bind_data_plane(py::module_& m) {
  bind_buffers(m);
  bind_transfers(m);
}
