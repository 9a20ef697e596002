// xmesh._kernel_ext: the Jupyter kernel as an extension module of the Python that runs it
// (`python -m xmesh.kernel -f CONNECTION_FILE`, the argv of the kernelspecs `python -m
// xmesh.kernel install` writes). `serve` runs xeus 2.4 on the calling (main) thread: the shell
// channel there, control, heartbeat, iopub and stdin on xeus's threads, cells through the
// IPython shell of python/xmesh/_kernel/shell.py, which reaches the kernel through the other
// functions here (streams, display, input, comms, the thread-safe iopub channel).
#include <pybind11/pybind11.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "build_info.hpp"
#include "comms.hpp"
#include "history_manager.hpp"
#include "interrupts.hpp"
#include "iopub_side_channel.hpp"
#include "json_py.hpp"
#include "python_debugger.hpp"
#include "stdin_channel.hpp"
#include "xeus/xeus_context.hpp"
#include "xeus/xkernel.hpp"
#include "xeus/xkernel_configuration.hpp"
#include "xmesh_interpreter.hpp"

namespace py = pybind11;
using namespace xmesh::kernel;

namespace {

XmeshInterpreter* g_interpreter = nullptr;  // while serve() runs
unsigned long g_main_thread = 0;            // the thread serve() runs on: xeus's shell thread

bool on_main_thread() { return g_interpreter && PyThread_get_thread_ident() == g_main_thread; }

void serve(const std::string& connection_file, const std::string& python) {
  if (g_interpreter) throw std::runtime_error("this process already serves a kernel");
  if (py::module_::import("threading").attr("current_thread")().not_equal(
          py::module_::import("threading").attr("main_thread")()))
    throw std::runtime_error("serve() runs on the main thread (it takes SIGINT for the cells)");
  xeus::xconfiguration config;
  try {
    config = xeus::load_configuration(connection_file);
  } catch (const std::exception& e) {
    throw std::invalid_argument("cannot read the connection file " + connection_file + ": " + e.what());
  }
  // Before xeus starts a thread: every thread inherits the blocked SIGINT.
  install_interrupt_handling();
  // Jupyter launchers may close our std streams; writing diagnostics must not kill us. xeus's
  // own chatter on std::clog ("Run with XEUS ...") would land in `xmesh run`'s output.
  signal(SIGPIPE, SIG_IGN);
  if (std::getenv("JPY_PARENT_PID")) std::clog.setstate(std::ios_base::failbit);

  auto history = std::make_unique<HistoryManager>();
  auto interpreter = std::make_unique<XmeshInterpreter>(*history);
  nl::json debugger_config;
  debugger_config["python"] = python;
  auto context = xeus::make_context<zmq::context_t>();
  zmq::context_t& zmq_context = context->m_context;
  const std::string user_name = xeus::get_user_name();
  XmeshInterpreter& interpreter_ref = *interpreter;
  {
    xeus::xkernel kernel(config, user_name, std::move(context), std::move(interpreter), make_stdin_guarded_server,
                         std::move(history), nullptr, make_python_debugger, debugger_config);
    static_cast<StdinGuardedServer&>(kernel.get_server()).route_replies_to(interpreter_ref);
    // Late output of finished cells and output of other threads go through this channel.
    make_iopub_side_channel(zmq_context, config.m_signature_scheme, config.m_key, user_name);
    g_interpreter = &interpreter_ref;
    g_main_thread = PyThread_get_thread_ident();
    kernel.start();  // configure (the shell, which releases the GIL), then serve until shutdown
    g_interpreter = nullptr;
    close_iopub_side_channel();  // before the context goes with the kernel
  }
  set_idle_interrupt_handler({});
}

XmeshInterpreter& interpreter() {
  if (!g_interpreter) throw std::runtime_error("no kernel is being served in this process");
  return *g_interpreter;
}

// Output of a stream: through xeus on the main thread (in order with the cell's other
// messages), through the side channel from any other, under the latest request's header.
// False when no kernel is served (any more): the caller writes elsewhere.
bool publish_stream(const std::string& name, const std::string& text) {
  if (!g_interpreter) return false;
  if (on_main_thread()) {
    g_interpreter->publish_stream(name, text);
    return true;
  }
  return publish_from_any_thread("stream", {{"name", name}, {"text", text}}, g_interpreter->latest_parent());
}

// False when no kernel is served (any more): nothing to show it in.
bool display(const py::dict& data, const py::object& metadata, const py::object& transient, bool update) {
  if (!g_interpreter) return false;
  nl::json d = xmesh::from_py(data), m = metadata.is_none() ? nl::json::object() : xmesh::from_py(metadata),
           t = transient.is_none() ? nl::json::object() : xmesh::from_py(transient);
  if (!on_main_thread()) {
    nl::json content = {{"data", d}, {"metadata", m}, {"transient", t}};
    return publish_from_any_thread(update ? "update_display_data" : "display_data", content,
                                   g_interpreter->latest_parent());
  }
  if (update)
    g_interpreter->update_display_data(d, m, t);
  else
    g_interpreter->display_data(d, m, t);
  return true;
}

}  // namespace

PYBIND11_MODULE(_kernel_ext, m) {
  m.doc() = "The xmesh Jupyter kernel (kernel/kernel_module.cpp): serve() and what its IPython shell calls.";
  m.def("serve", &serve, py::arg("connection_file"), py::arg("python"),
        "Serves the kernel of the connection file until it is shut down (main thread only; python: the "
        "interpreter debugpy names for subprocesses).");
  m.def("version", [] { return std::string(XMESH_VERSION); });
  m.def("cell_file", &cell_file, "The file a cell's code is compiled as (what the front end's debugger expects).");
  m.def("publish_stream", &publish_stream, py::arg("name"), py::arg("text"),
        "A stream message (stdout/stderr) from any thread; False when no kernel is served.");
  m.def("display", &display, py::arg("data"), py::arg("metadata") = py::none(), py::arg("transient") = py::none(),
        py::arg("update") = false);
  m.def("clear_output", [](bool wait) {
    if (!g_interpreter) return false;
    if (!on_main_thread())
      return publish_from_any_thread("clear_output", {{"wait", wait}}, g_interpreter->latest_parent());
    g_interpreter->clear_output(wait);
    return true;
  }, py::arg("wait") = false, "False when no kernel is served.");
  m.def("publish_execution_result", [](int count, const py::dict& data, const py::object& metadata) {
    interpreter().publish_execution_result(count, xmesh::from_py(data),
                                           metadata.is_none() ? nl::json::object() : xmesh::from_py(metadata));
  });
  m.def("parent_header", [] { return xmesh::to_py(interpreter().latest_parent()); },
        "The header of the latest request (ipykernel's get_parent()).");
  bind_stdin(m);
  bind_iopub(m);
  bind_comms(m);
}
