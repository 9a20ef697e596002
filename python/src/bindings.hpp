// The binding files of xmesh._core, one per subsystem of libxmesh (python/README.md): each
// binds its layer's types; core_module.cpp makes the module and calls them in layer order.
#pragma once
#include <pybind11/pybind11.h>

#include <memory>

#include "node.hpp"

namespace py = pybind11;

void bind_process(py::module_& m);    // base_bindings.cpp: versions, directories, processes
void bind_layout(py::module_& m);     // base_bindings.cpp: the runtime directory's layout
void bind_shape(py::module_& m);      // base_bindings.cpp: shapes and slices
void bind_protocol(py::module_& m);   // protocol_bindings.cpp: Kind, error kinds
void bind_bodies(py::module_& m);     // protocol_bindings.cpp: the typed bodies
// Each subsystem's typed bodies, in its own binding file, before the messages that return them.
void bind_data_bodies(py::module_& m);    // data_bindings.cpp
void bind_output_bodies(py::module_& m);  // output_bindings.cpp
void bind_debug_bodies(py::module_& m);   // debugger_bindings.cpp
void bind_sync_bodies(py::module_& m);    // workspace_bindings.cpp
void bind_messages(py::module_& m);   // protocol_bindings.cpp: Message, Frame, Inbox
void bind_calls(py::module_& m);      // node_bindings.cpp: Call, the one wait, the waker
void bind_node(py::module_& m);       // node_bindings.cpp: Node
void bind_data_plane(py::module_& m); // data_bindings.cpp: lent buffers, DataPlane
void bind_output(py::module_& m);     // output_bindings.cpp: the output tracker, LogRouter
void bind_debugger(py::module_& m);   // debugger_bindings.cpp
void bind_workspace(py::module_& m);  // workspace_bindings.cpp

// The Node class bound by bind_node, for the files that add a subsystem's methods to it.
using NodeClass = py::class_<xmesh::Node, std::shared_ptr<xmesh::Node>>;
inline NodeClass node_class(py::module_& m) { return py::reinterpret_borrow<NodeClass>(m.attr("Node")); }
