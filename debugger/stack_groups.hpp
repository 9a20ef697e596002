// Stacks for the debugger's `where`: parsing the thread dumps a proc writes without taking the
// GIL (CPython's faulthandler format), and merging the stacks of many ranks into groups, each
// shown once with its count and rank set, the way a parallel debugger's stack view does.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace xmesh {

struct StackFrame {
  std::string file;
  int64_t line = 0;
  std::string function;
  bool operator==(const StackFrame& o) const { return line == o.line && file == o.file && function == o.function; }
};

struct ThreadStack {
  uint64_t ident = 0;    // the thread's pthread id, as threading.get_ident() gives it
  bool current = false;  // the thread that wrote the dump
  std::vector<StackFrame> frames;  // outermost first
};

// Parses faulthandler's dump_traceback(all_threads=True) text:
//   Thread 0x00007f0e4a3fe6c0 (most recent call first):
//     File "/x/y.py", line 12 in f
// Lines it does not understand are skipped; frames come back outermost first.
std::vector<ThreadStack> parse_thread_dump(const std::string& text);

struct RankStack {
  int64_t rank = 0;
  std::string state;  // what the rank is doing: "stopped", "running", ...
  std::vector<StackFrame> frames;
};

struct StackGroup {
  std::string state;
  std::vector<StackFrame> frames;
  std::vector<int64_t> ranks;  // sorted
};

// Ranks with the same state and the same frames form one group. Groups come largest first
// (ties: by lowest rank), so the odd rank out (the hung one) stands out at the end.
std::vector<StackGroup> group_stacks(const std::vector<RankStack>& stacks);

}  // namespace xmesh
