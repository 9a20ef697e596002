// xmesh-kernel: the Jupyter kernel. xeus 2.4 serves the protocol (shell on the main thread,
// control on its own), xeus-python 0.14 runs cells through IPython, and the embedded Debian
// Python imports xmesh, whose _core module loads the same libxmesh.so this program links.
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>

#include "build_info.hpp"
#include "history_manager.hpp"
#include "interrupts.hpp"
#include "iopub_side_channel.hpp"
#include "remote_breakpoints.hpp"
#include "pybind11/embed.h"
#include "util.hpp"
#include "xeus/xeus_context.hpp"
#include "xeus/xkernel.hpp"
#include "xeus/xkernel_configuration.hpp"
#include "xeus/xserver_shell_main.hpp"
#include "stdin_channel.hpp"
#include "xmesh_interpreter.hpp"

namespace py = pybind11;

namespace {

const char* kPython = XMESH_KERNEL_PYTHON;

std::string option_value(int argc, char* argv[], const char* name) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return "";
}

bool has_flag(int argc, char* argv[], const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

// The embedded interpreter must believe it is /usr/bin/python3 (sys.executable is what
// multiprocessing, debugpy and the procs' launcher use) and must not parse the kernel's argv.
void start_python() {
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  config.parse_argv = 0;
  config.install_signal_handlers = 1;
  auto check = [&](PyStatus st) {
    if (PyStatus_Exception(st)) {
      PyConfig_Clear(&config);
      Py_ExitStatusException(st);
    }
  };
  check(PyConfig_SetBytesString(&config, &config.program_name, kPython));
  check(PyConfig_SetBytesString(&config, &config.executable, kPython));
  // sys.argv is just the program: IPython's application would parse the kernel's options.
  char* py_argv[] = {const_cast<char*>(kPython)};
  check(PyConfig_SetBytesArgv(&config, 1, py_argv));
  check(Py_InitializeFromConfig(&config));
  PyConfig_Clear(&config);
}

}  // namespace

int main(int argc, char* argv[]) {
  if (has_flag(argc, argv, "--version")) {
    std::cout << "xmesh-kernel " << XMESH_VERSION << " (protocol " << XMESH_PROTOCOL_VERSION << ")\n";
    return 0;
  }
  std::string connection_file = option_value(argc, argv, "-f");
  if (connection_file.empty()) {
    std::cerr << "usage: xmesh-kernel -f CONNECTION_FILE (Jupyter starts it through the 'xmesh' kernelspec)\n";
    return 2;
  }
  // Before any thread exists, so that every thread inherits the blocked SIGINT.
  xmesh::kernel::install_interrupt_handling();
  // Jupyter launchers may close our std streams; writing diagnostics must not kill us. xeus's
  // own chatter on std::clog ("Run with XEUS ...") would land in `xmesh run`'s output.
  signal(SIGPIPE, SIG_IGN);
  if (std::getenv("JPY_PARENT_PID")) std::clog.setstate(std::ios_base::failbit);

  xeus::xconfiguration config;
  try {
    config = xeus::load_configuration(connection_file);
  } catch (const std::exception& e) {
    std::cerr << "xmesh-kernel: cannot read connection file " << connection_file << ": " << e.what() << "\n";
    return 2;
  }

  // debugpy (JupyterLab's visual debugger) warns about frozen modules on stderr, which is the
  // cell's: the embedded interpreter cannot take -Xfrozen_modules=off, and the warning is not
  // the user's business (ipykernel keeps it in its log).
  setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1", 0);
  start_python();
  auto history = std::make_unique<xmesh::kernel::HistoryManager>();
  auto& history_ref = *history;
  auto interpreter = std::make_unique<xmesh::kernel::XmeshInterpreter>(history_ref);
  nl::json debugger_config;
  debugger_config["python"] = kPython;

  {
    auto context = xeus::make_context<zmq::context_t>();
    zmq::context_t& zmq_context = context->m_context;
    std::string user_name = xeus::get_user_name();
    auto& interpreter_ref = *interpreter;
    xeus::xkernel kernel(config, user_name, std::move(context), std::move(interpreter),
                         xmesh::kernel::make_stdin_guarded_server, std::move(history), nullptr,
                         xmesh::kernel::make_xmesh_debugger, debugger_config);
    static_cast<xmesh::kernel::StdinGuardedServer&>(kernel.get_server()).route_replies_to(interpreter_ref);
    // Late output of finished cells is published from runtime threads through this channel.
    xmesh::kernel::make_iopub_side_channel(zmq_context, config.m_signature_scheme, config.m_key, user_name);
    kernel.start();
    xmesh::kernel::close_iopub_side_channel();  // before the context goes with the kernel
  }
  xmesh::kernel::set_idle_interrupt_handler({});
  Py_Finalize();
  return 0;
}
