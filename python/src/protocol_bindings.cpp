// xmesh._core: the protocol's face (runtime/protocol): kinds, error kinds, received messages
// and their frames, inboxes. The typed bodies' classes: body_classes.cpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "agent_bodies.hpp"
#include "bodies.hpp"
#include "debug_bodies.hpp"
#include "link_bodies.hpp"
#include "node_bodies.hpp"
#include "sync_bodies.hpp"
#include "body_bindings.hpp"
#include "inbox.hpp"
#include "json_py.hpp"
#include "py_common.hpp"
#include "wire.hpp"

// The protocol's enums, generated from runtime/protocol/kinds.def and errors.def.
void bind_protocol(py::module_& m) {
  py::enum_<Kind> kinds(m, "Kind", py::arithmetic());  // from runtime/protocol/kinds.def, the one list
#define XMESH_KIND(name, number, wire_name) kinds.value(#name, Kind::name);
#include "kinds.def"
#undef XMESH_KIND
  m.def("error_kinds", []() {
    std::vector<std::pair<std::string, std::string>> out;  // (Name, wire name), from errors.def
#define XMESH_ERROR(name, wire_name) out.emplace_back(#name, wire_name);
#include "errors.def"
#undef XMESH_ERROR
    return out;
  }, "The error kinds of runtime/protocol/errors.def as (name, wire name): xmesh._base.protocol.ErrorKind.");
}

// Received messages: payload frames (buffer protocol, no copy), Message, Inbox.
template <class T>
T parse_body(PyMessage& p) {
  return body_py::from_json_checked<T>(p.m.header.body);
}

void bind_messages(py::module_& m) {
  py::class_<Frame>(m, "Frame", py::buffer_protocol())
      .def_buffer([](Frame& f) {
        return py::buffer_info(f.msg.data(), 1, py::format_descriptor<uint8_t>::format(), 1, {f.msg.size()}, {1},
                               /*readonly=*/false);
      })
      .def("__len__", [](Frame& f) { return f.msg.size(); })
      .def("bytes", [](Frame& f) { return py::bytes(static_cast<const char*>(f.msg.data()), f.msg.size()); });

  py::class_<PyMessage>(m, "Message")
      .def_property_readonly("kind", [](PyMessage& p) { return p.m.header.kind; })
      .def_property_readonly("sender", [](PyMessage& p) { return p.m.header.sender; })
      .def_property_readonly("sender_addr", [](PyMessage& p) { return p.m.sender_addr; })
      .def_property_readonly("gathered", [](PyMessage& p) { return p.m.gathered; },
                             "It came through a cast tree: its answer goes up the tree (node.reply).")
      .def_property_readonly("corr", [](PyMessage& p) { return p.m.header.corr; })
      .def_property_readonly("index", [](PyMessage& p) { return p.m.header.index; })
      .def_property_readonly("actor", [](PyMessage& p) { return p.m.header.actor; })
      .def_property_readonly("method", [](PyMessage& p) { return p.m.header.method; })
      .def_property_readonly("body", [](PyMessage& p) { return to_py(p.m.header.body.is_null() ? json::object() : p.m.header.body); })
      .def_property_readonly("ctx", [](PyMessage& p) { return to_py(p.m.header.ctx); })
      .def_property_readonly("frames", [](PyMessage& p) {
        if (!p.frames_cache) p.frames_cache = frames_to_py(p.m.frames);
        return p.frames_cache;
      })
      // The typed bodies (runtime/protocol/bodies.hpp); ValueError naming a bad field.
      .def("proc_exited", &parse_body<ProcExitedBody>)
      .def("cancel", &parse_body<CancelBody>)
      .def("configure", &parse_body<ConfigureBody>)
      .def("adopt", &parse_body<AdoptBody>)
      .def("peer_dead", &parse_body<PeerDeadBody>)
      .def("reload", &parse_body<ReloadBody>)
      .def("fault", &parse_body<ErrorBody>)
      .def("proc_info", &parse_body<ProcInfoBody>)
      .def("spawn_actor", &parse_body<SpawnActorBody>)
      .def("call_body", &parse_body<CallBody>)
      .def_property_readonly("has_body", [](PyMessage& p) {
        return p.m.header.body.is_object() && !p.m.header.body.empty();
      })
      .def("refuse", &parse_body<RefuseBody>)
      .def("debug_event", &parse_body<DebugEventBody>)
      .def("debug_command", &parse_body<DebugCommandBody>)
      .def("__repr__", [](PyMessage& p) {
        return std::string("<xmesh message ") + kind_name(p.m.header.kind) + " from " + p.m.header.sender + ">";
      });


  py::class_<Inbox, std::shared_ptr<Inbox>>(m, "Inbox")
      .def("pop", &pop_inbox, py::arg("timeout") = py::none(),
           "Waits for the next message (None on timeout or when closed and empty).")
      .def("fileno", &Inbox::fd)
      .def("close", &Inbox::close)
      .def_property_readonly("closed", &Inbox::closed)
      .def("__len__", &Inbox::size);

  py::enum_<WaitOutcome>(m, "WaitOutcome")
      .value("Ready", WaitOutcome::Ready)
      .value("Woken", WaitOutcome::Woken)
      .value("Timeout", WaitOutcome::Timeout);
}
