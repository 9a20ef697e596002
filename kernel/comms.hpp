// Jupyter comms for Python, on xeus's comm manager (comms.cpp): the `Comm` class and
// `register_target` / `unregister_target` of the kernel module.
#pragma once
#include <pybind11/pybind11.h>

namespace xmesh::kernel {

namespace py = pybind11;

void bind_comms(py::module_& m);

}  // namespace xmesh::kernel
