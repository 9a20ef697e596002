// The xmesh kernel's interpreter: xeus's interpreter base running cells through the IPython
// shell of python/xmesh/_kernel/shell.py, in the Python that loaded the kernel module (any
// CPython 3.10-3.13: the kernel is an extension module, xmesh._kernel_ext). The xmesh hooks of
// python/xmesh/_kernel/interpreter.py run around each cell. The GIL is released while xeus
// waits for messages and taken for each request.
#pragma once
#include <memory>
#include <mutex>
#include <string>

#include <pybind11/pybind11.h>
#include <xeus/xinterpreter.hpp>

#include "history_manager.hpp"

namespace xmesh::kernel {

namespace py = pybind11;

class XmeshInterpreter : public xeus::xinterpreter {
 public:
  explicit XmeshInterpreter(HistoryManager& history);
  ~XmeshInterpreter() override;

  // The parent header of the latest execute request, as JSON (any thread): what output from
  // other threads is published under.
  nl::json latest_parent() const;

 private:
  void configure_impl() override;
  nl::json execute_request_impl(int execution_count, const std::string& code, bool silent, bool store_history,
                                nl::json user_expressions, bool allow_stdin) override;
  nl::json complete_request_impl(const std::string& code, int cursor_pos) override;
  nl::json inspect_request_impl(const std::string& code, int cursor_pos, int detail_level) override;
  nl::json is_complete_request_impl(const std::string& code) override;
  nl::json kernel_info_request_impl() override;
  void shutdown_request_impl() override;
  // Code the debugger needs run on the shell thread (debugpy.listen), sent by the control thread.
  nl::json internal_request_impl(const nl::json& content) override;

  nl::json run_cell(const std::string& code, bool silent, bool store_history, const nl::json& user_expressions,
                    bool allow_stdin);
  nl::json error_reply(bool silent);
  void record_history_output(int execution_count);
  void call_hook(const char* name);
  void begin_cell(bool allow_stdin);

  HistoryManager& history_;
  mutable std::mutex parent_mu_;
  nl::json latest_parent_ = nl::json::object();
  py::object shell_;  // the IPython shell (xmesh._kernel.shell.XmeshShell)
  py::object hooks_;  // the xmesh._kernel.interpreter module
  std::unique_ptr<py::gil_scoped_release> released_;  // the GIL, given back between requests
};

}  // namespace xmesh::kernel
