// The xmesh kernel's interpreter: xeus-python's IPython-based interpreter with the xmesh
// runtime wired in (python/xmesh/_kernel/interpreter.py does the Python side).
#pragma once
#include "history_manager.hpp"
#include "xeus-python/xinterpreter.hpp"

namespace xmesh::kernel {

class XmeshInterpreter : public xpyt::interpreter {
 public:
  explicit XmeshInterpreter(HistoryManager& history);
  ~XmeshInterpreter() override;

 protected:
  void configure_impl() override;
  nl::json execute_request_impl(int execution_count, const std::string& code, bool silent, bool store_history,
                                nl::json user_expressions, bool allow_stdin) override;
  nl::json kernel_info_request_impl() override;
  void shutdown_request_impl() override;

 private:
  void record_history_output(int execution_count);
  void call_hook(const char* name, const std::string& arg);  // a function of xmesh._kernel.interpreter
  void begin_cell(bool allow_stdin);

  HistoryManager& history_;
  py::object hooks_;  // the xmesh._kernel.interpreter module
};

}  // namespace xmesh::kernel
