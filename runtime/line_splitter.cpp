#include "line_splitter.hpp"

namespace xmesh {

std::string LineSplitter::feed(const char* data, size_t n, int64_t now_ms) {
  if (partial_.empty()) partial_since_ = now_ms;
  partial_.append(data, n);
  std::string out;
  size_t start = 0;
  while (true) {
    size_t nl = partial_.find('\n', start);
    size_t limit = start + max_line_;
    if (nl != std::string::npos && nl < limit) {
      out.append(partial_, start, nl + 1 - start);
      start = nl + 1;
    } else if (partial_.size() >= limit) {
      out.append(partial_, start, max_line_);
      out.push_back('\n');  // a cut, shown as a line break
      start = limit;
    } else {
      break;
    }
  }
  partial_.erase(0, start);
  if (start > 0) partial_since_ = now_ms;
  return out;
}

std::string LineSplitter::flush_partial(int64_t now_ms, int64_t wait_ms) {
  if (partial_.empty()) return "";
  if (wait_ms >= 0 && now_ms - partial_since_ < wait_ms) return "";
  std::string out;
  out.swap(partial_);
  return out;
}

}  // namespace xmesh
