// Splits a byte stream (a proc's stdout or stderr pipe) into chunks of whole lines for
// forwarding. A line longer than max_line is cut into pieces rather than dropped; a partial
// line is released when it has waited long enough or the stream ends.
#pragma once
#include <cstdint>
#include <string>

namespace xmesh {

class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line = 64 * 1024) : max_line_(max_line) {}
  // Appends bytes; returns the complete lines now available (each ending in '\n', or cut at
  // max_line), possibly empty.
  std::string feed(const char* data, size_t n, int64_t now_ms);
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
