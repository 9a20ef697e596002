// Input through the Jupyter stdin channel, for input() in a cell and the debugger prompt
// (python/xmesh/_debug/controller.py): `xmesh._kernel_ext.input_request`. It waits without
// the GIL (the runtime's Python threads go on: supervision, debug events), and an interrupt
// while it waits becomes KeyboardInterrupt (xeus 2.4's blocking recv surfaces SIGINT as a
// zmq::error_t with EINTR; see PLATFORM-NOTES). Must run on the shell (main) thread.
#include <cerrno>
#include <string>

#include <pybind11/pybind11.h>

#include "stdin_channel.hpp"
#include <xeus/xinterpreter.hpp>
#include <zmq.hpp>

namespace py = pybind11;

namespace xmesh::kernel {

void bind_stdin(py::module_& m) {
  m.def("input_request", [](const std::string& prompt, bool password) {
    auto& interpreter = xeus::get_interpreter();
    std::string value;
    bool interrupted = false;
    interpreter.register_input_handler([&value](const std::string& v) { value = v; });
    {
      py::gil_scoped_release release;
      try {
        interpreter.input_request(prompt, password);
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) {
          interpreter.register_input_handler(nullptr);
          throw;
        }
        interrupted = true;
      }
    }
    interpreter.register_input_handler(nullptr);
    if (interrupted) {
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // the handler raised
      PyErr_SetNone(PyExc_KeyboardInterrupt);
      throw py::error_already_set();
    }
    return value;
  }, py::arg("prompt"), py::arg("password") = false);
}

}  // namespace xmesh::kernel
