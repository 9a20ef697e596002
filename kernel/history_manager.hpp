// The kernel's input history, answering history_request as IPython's kernel does.
//
// xeus 2.4.1's in-memory manager is not protocol compliant (line numbers as strings, flat
// output entries, off-by-one ranges), so jupyter_kernel_test's history test fails with it.
// Entries are [session, line, input] or, with output=True, [session, line, [input, output]];
// `range` takes lines [start, stop) of a session (0 means the current one); `search` matches a
// glob against the whole input like IPython's sqlite GLOB, `unique` keeps the latest of equal
// inputs, `n` keeps the last n matches.
#pragma once
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "xeus/xhistory_manager.hpp"

namespace xmesh::kernel {

class HistoryManager : public xeus::xhistory_manager {
 public:
  // Called by the interpreter after each execution that xeus will store: its execution count
  // and the text/plain form of its result, if any. xeus 2.4.1 passes every input with line 1
  // (it reads the count from the request, where it never is), so the line comes from here.
  void record_execution(int line, std::optional<std::string> output);

 private:
  struct Entry {
    int line;
    std::string input;
    std::optional<std::string> output;
  };

  void configure_impl() override {}
  void store_inputs_impl(int session, int line, const std::string& input, const std::string& output) override;
  nl::json get_tail_impl(int n, bool raw, bool output) const override;
  nl::json get_range_impl(int session, int start, int stop, bool raw, bool output) const override;
  nl::json search_impl(const std::string& pattern, bool raw, bool output, int n, bool unique) const override;

  nl::json entry_json(const Entry& e, bool output) const;
  static nl::json reply(nl::json history);

  static constexpr int kSession = 1;  // this kernel process's session number
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  std::optional<Entry> pending_;
};

}  // namespace xmesh::kernel
