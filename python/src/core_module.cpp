// xmesh._core: the pybind11 face of libxmesh. Everything that waits releases the GIL and
// waits in slices of at most 100 ms, checking for signals between slices, so Ctrl-C works
// in the middle of a wait (DESIGN §4).
//
// One binding file per subsystem (bindings.hpp lists them); this file makes the module, its
// exceptions, and calls them bottom up.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <thread>

#include "bindings.hpp"
#include "py_common.hpp"
#include "keys.hpp"
#include "shape.hpp"
#include "transport.hpp"

using namespace xmesh;

namespace {
void translate_shape_error(const ShapeError& e) {
  switch (e.type) {
    case ShapeError::TypeErr: PyErr_SetString(PyExc_TypeError, e.what()); return;
    case ShapeError::IndexErr: PyErr_SetString(PyExc_IndexError, e.what()); return;
    case ShapeError::KeyErr: PyErr_SetString(PyExc_KeyError, e.what()); return;
    default: PyErr_SetString(PyExc_ValueError, e.what()); return;
  }
}
}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "xmesh runtime core (libxmesh)";
  py::register_exception<SendError>(m, "SendError", PyExc_RuntimeError);
  py::register_exception<KeyFileError>(m, "KeyFileError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ShapeError& e) {
      translate_shape_error(e);
    }
  });

  // Registered first, so it runs after the runtime's own atexit handlers (py_common.hpp): from
  // here on daemon threads park in their waits, and those already taking the GIL back get it
  // (while this gives it up) before the interpreter finalizes.
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    python_exiting().store(true);
    py::gil_scoped_release release;
    for (int i = 0; i < 500 && python_restoring().load() > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }));
  python_main_thread().store(py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>());
  bind_process(m);
  bind_protocol(m);
  bind_bodies(m);
  bind_data_bodies(m);
  bind_output_bodies(m);
  bind_debug_bodies(m);
  bind_sync_bodies(m);
  bind_messages(m);
  bind_layout(m);
  bind_calls(m);
  bind_node(m);
  bind_data_plane(m);
  bind_shape(m);
  bind_output(m);
  bind_debugger(m);
  bind_workspace(m);
}
