// Splits a byte stream (a proc's stdout or stderr pipe) into chunks of whole lines for
// forwarding. A line longer than max_line is cut into pieces rather than dropped: each piece is
// a chunk of its own without a newline, continued by what comes next (log records flag it O/E,
// `xmesh logs` joins them, the display shows each piece on a line and the line's own newline
// only ends the last one). A partial line is released when it has waited long enough or the
// stream ends.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace xmesh {

class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line = 64 * 1024) : max_line_(max_line) {}
  // Appends bytes; returns what is now available: runs of whole lines (each chunk ending in
  // '\n') and pieces of a long line (max_line bytes, no newline), in order; possibly none.
  std::vector<std::string> feed(const char* data, size_t n, int64_t now_ms);
  // Returns the pending partial line if it has waited at least wait_ms (or always when
  // wait_ms < 0), and clears it.
  std::string flush_partial(int64_t now_ms, int64_t wait_ms);
  bool has_partial() const { return !partial_.empty(); }

 private:
  size_t max_line_;
  std::string partial_;
  int64_t partial_since_ = 0;
};

}  // namespace xmesh
