#include "xmesh_interpreter.hpp"

#include <pybind11/eval.h>
#include <pybind11/stl.h>

#include "build_info.hpp"
#include "interrupts.hpp"
#include "json_py.hpp"
#include "util.hpp"

namespace xmesh::kernel {

using namespace pybind11::literals;

XmeshInterpreter::XmeshInterpreter(HistoryManager& history) : history_(history) { xeus::register_interpreter(this); }

XmeshInterpreter::~XmeshInterpreter() {
  released_.reset();  // the GIL back, to drop the Python objects
  shell_ = py::object();
  hooks_ = py::object();
}

nl::json XmeshInterpreter::latest_parent() const {
  std::lock_guard<std::mutex> g(parent_mu_);
  return latest_parent_;
}

void XmeshInterpreter::configure_impl() {
  {
    py::gil_scoped_acquire acquire;
    shell_ = py::module_::import("xmesh._kernel.shell").attr("start")();
    hooks_ = py::module_::import("xmesh._kernel.interpreter");
    hooks_.attr("setup")(shell_);
  }
  set_idle_interrupt_handler([this] {
    py::gil_scoped_acquire gil;
    try {
      hooks_.attr("on_idle_interrupt")();
    } catch (py::error_already_set& e) {
      log_diag("kernel", std::string("idle interrupt handler failed: ") + e.what());
    }
  });
  // From here on the GIL is taken per request: between them the runtime's Python threads run.
  released_ = std::make_unique<py::gil_scoped_release>();
}

nl::json XmeshInterpreter::execute_request_impl(int execution_count, const std::string& code, bool silent,
                                                bool store_history, nl::json user_expressions, bool allow_stdin) {
  {
    std::lock_guard<std::mutex> g(parent_mu_);
    latest_parent_ = parent_header();
  }
  nl::json reply;
  {
    ExecutingScope executing;
    begin_cell(allow_stdin);
    reply = run_cell(code, silent, store_history, user_expressions, allow_stdin);
    // The flush barrier and the cell's late-output slot, before the reply ends the cell.
    call_hook("end_cell");
  }
  if (store_history && !silent) record_history_output(execution_count);
  return reply;
}

nl::json XmeshInterpreter::run_cell(const std::string& code, bool silent, bool store_history,
                                    const nl::json& user_expressions, bool allow_stdin) {
  py::gil_scoped_acquire acquire;
  shell_.attr("last_error") = py::none();
  try {
    shell_.attr("run_cell_for_kernel")(code, "store_history"_a = store_history, "silent"_a = silent,
                                       "allow_stdin"_a = allow_stdin);
  } catch (py::error_already_set& e) {
    // Only what IPython itself could not handle (an interrupt between its steps): the cell's
    // error, never a dead kernel.
    py::list error, traceback;
    traceback.append(py::str(e.what()));
    error.append(e.type().attr("__name__"));
    error.append(py::str(e.value()));
    error.append(traceback);
    shell_.attr("last_error") = error;
  }
  nl::json reply;
  py::object payload = shell_.attr("payload_manager");
  reply["payload"] = from_py(payload.attr("read_payload")());
  payload.attr("clear_payload")();
  if (!shell_.attr("last_error").is_none()) {
    nl::json error = error_reply(silent);
    error["payload"] = reply["payload"];
    return error;
  }
  reply["status"] = "ok";
  reply["user_expressions"] = from_py(shell_.attr("user_expressions")(to_py(user_expressions)));
  return reply;
}

// The cell's error (shell.last_error: [ename, evalue, traceback lines]), published unless silent.
nl::json XmeshInterpreter::error_reply(bool silent) {
  py::list error = shell_.attr("last_error");
  const std::string ename = py::str(error[0]), evalue = py::str(error[1]);
  std::vector<std::string> traceback;
  for (py::handle line : py::list(error[2])) traceback.push_back(py::str(line));
  if (!silent) publish_execution_error(ename, evalue, traceback);
  return {{"status", "error"}, {"ename", ename}, {"evalue", evalue}, {"traceback", traceback}};
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

void XmeshInterpreter::call_hook(const char* name) {
  py::gil_scoped_acquire acquire;
  try {
    hooks_.attr(name)();
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
    int ipython_count = shell_.attr("execution_count").cast<int>() - 1;
    py::object reprs = shell_.attr("history_manager").attr("output_hist_reprs");
    py::object texts = reprs.attr("get")(ipython_count);
    if (!texts.is_none() && py::len(texts) > 0) output = py::str(texts[py::int_(-1)]).cast<std::string>();
  } catch (py::error_already_set&) {
    // No history manager on the shell, or an odd entry: the input is stored without output.
  }
  history_.record_execution(execution_count, std::move(output));
}

nl::json XmeshInterpreter::complete_request_impl(const std::string& code, int cursor_pos) {
  py::gil_scoped_acquire acquire;
  nl::json reply = from_py(shell_.attr("complete_for_kernel")(code, cursor_pos));
  reply["status"] = "ok";
  return reply;
}

nl::json XmeshInterpreter::inspect_request_impl(const std::string& code, int cursor_pos, int detail_level) {
  py::gil_scoped_acquire acquire;
  nl::json reply = from_py(shell_.attr("inspect_for_kernel")(code, cursor_pos, detail_level));
  reply["status"] = "ok";
  return reply;
}

nl::json XmeshInterpreter::is_complete_request_impl(const std::string& code) {
  py::gil_scoped_acquire acquire;
  return from_py(shell_.attr("is_complete_for_kernel")(code));
}

nl::json XmeshInterpreter::kernel_info_request_impl() {
  nl::json info;
  info["implementation"] = "xmesh";
  info["implementation_version"] = XMESH_VERSION;
  info["banner"] = std::string("xmesh ") + XMESH_VERSION + " (protocol " + std::to_string(XMESH_PROTOCOL_VERSION) +
                   "): Python " + PY_VERSION + " driving process and actor meshes\n";
  info["debugger"] = true;
  info["language_info"] = {{"name", "python"},
                           {"version", PY_VERSION},
                           {"mimetype", "text/x-python"},
                           {"file_extension", ".py"},
                           {"pygments_lexer", "ipython3"},
                           {"codemirror_mode", {{"name", "ipython"}, {"version", 3}}},
                           {"nbconvert_exporter", "python"}};
  info["help_links"] = nl::json::array();
  info["status"] = "ok";
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

nl::json XmeshInterpreter::internal_request_impl(const nl::json& content) {
  py::gil_scoped_acquire acquire;
  try {
    py::exec(py::str(content.value("code", "")), py::module_::import("__main__").attr("__dict__"));
    return {{"status", "ok"}};
  } catch (py::error_already_set& e) {
    return {{"status", "error"}, {"ename", "InternalError"}, {"evalue", e.what()}, {"traceback", nl::json::array()}};
  }
}

}  // namespace xmesh::kernel
