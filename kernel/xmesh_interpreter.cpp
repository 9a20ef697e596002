#include "xmesh_interpreter.hpp"

#include "build_info.hpp"
#include "interrupts.hpp"
#include "util.hpp"

namespace xmesh::kernel {

XmeshInterpreter::XmeshInterpreter(HistoryManager& history) : history_(history) {}

// The base class gives the GIL back only in its own destructor, after ours ran.
XmeshInterpreter::~XmeshInterpreter() {
  py::gil_scoped_acquire acquire;
  hooks_ = py::object();
}

void XmeshInterpreter::configure_impl() {
  xpyt::interpreter::configure_impl();
  py::gil_scoped_acquire acquire;
  hooks_ = py::module::import("xmesh._kernel.interpreter");
  hooks_.attr("setup")(m_ipython_shell);
  set_idle_interrupt_handler([this] {
    py::gil_scoped_acquire gil;
    try {
      hooks_.attr("on_idle_interrupt")();
    } catch (py::error_already_set& e) {
      log_diag("kernel", std::string("idle interrupt handler failed: ") + e.what());
    }
  });
}

nl::json XmeshInterpreter::execute_request_impl(int execution_count, const std::string& code, bool silent,
                                                bool store_history, nl::json user_expressions, bool allow_stdin) {
  nl::json reply;
  {
    ExecutingScope executing;
    begin_cell(allow_stdin);
    reply = xpyt::interpreter::execute_request_impl(execution_count, code, silent, store_history,
                                                    std::move(user_expressions), allow_stdin);
    // The flush barrier and the cell's late-output slot, before the reply ends the cell.
    call_hook("end_cell", "");
  }
  if (store_history && !silent) record_history_output(execution_count);
  return reply;
}

void XmeshInterpreter::begin_cell(bool allow_stdin) {
  py::gil_scoped_acquire acquire;
  try {
    // The request's header tags the cell's output; allow_stdin says whether the debugger may
    // prompt (nbclient and nbconvert run cells without stdin).
    hooks_.attr("begin_cell")(parent_header().dump(), allow_stdin);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_KeyboardInterrupt)) log_diag("kernel", std::string("begin_cell failed: ") + e.what());
  }
}

void XmeshInterpreter::call_hook(const char* name, const std::string& arg) {
  py::gil_scoped_acquire acquire;
  try {
    if (arg.empty())
      hooks_.attr(name)();
    else
      hooks_.attr(name)(arg);
  } catch (py::error_already_set& e) {
    // An interrupt landing in the hook, or a bug there: the cell itself is not affected.
    if (!e.matches(PyExc_KeyboardInterrupt)) log_diag("kernel", std::string(name) + " failed: " + e.what());
  }
}

void XmeshInterpreter::record_history_output(int execution_count) {
  // IPython's displayhook keeps the text/plain form of each result it displayed, under its own
  // count (already advanced past this cell); reuse it rather than formatting the result again.
  std::optional<std::string> output;
  py::gil_scoped_acquire acquire;
  try {
    int ipython_count = m_ipython_shell.attr("execution_count").cast<int>() - 1;
    py::object reprs = m_ipython_shell.attr("history_manager").attr("output_hist_reprs");
    py::object texts = reprs.attr("get")(ipython_count);
    if (!texts.is_none() && py::len(texts) > 0) output = py::str(texts[py::int_(-1)]).cast<std::string>();
  } catch (py::error_already_set&) {
    // No history manager on the shell, or an odd entry: the input is stored without output.
  }
  history_.record_execution(execution_count, std::move(output));
}

nl::json XmeshInterpreter::kernel_info_request_impl() {
  nl::json info = xpyt::interpreter::kernel_info_request_impl();
  info["implementation"] = "xmesh";
  info["implementation_version"] = XMESH_VERSION;
  info["banner"] = std::string("xmesh ") + XMESH_VERSION + " (protocol " + std::to_string(XMESH_PROTOCOL_VERSION) +
                   "): Python " + PY_VERSION + " driving process and actor meshes\n";
  info["help_links"] = nl::json::array();
  return info;
}

void XmeshInterpreter::shutdown_request_impl() {
  set_idle_interrupt_handler({});
  py::gil_scoped_acquire acquire;
  try {
    hooks_.attr("shutdown")();
  } catch (py::error_already_set& e) {
    log_diag("kernel", std::string("runtime shutdown failed: ") + e.what());
  }
}

}  // namespace xmesh::kernel
