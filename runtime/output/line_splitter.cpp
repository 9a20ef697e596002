#include "line_splitter.hpp"

namespace xmesh {

std::vector<std::string> LineSplitter::feed(const char* data, size_t n, int64_t now_ms) {
  if (partial_.empty()) partial_since_ = now_ms;
  partial_.append(data, n);
  std::vector<std::string> out;
  std::string lines;
  size_t start = 0;
  while (true) {
    size_t nl = partial_.find('\n', start);
    size_t limit = start + max_line_;
    if (nl != std::string::npos && nl < limit) {
      lines.append(partial_, start, nl + 1 - start);
      start = nl + 1;
    } else if (partial_.size() >= limit) {
      if (!lines.empty()) out.push_back(std::move(lines));
      lines.clear();
      out.push_back(partial_.substr(start, max_line_));  // continued by what comes next
      start = limit;
    } else {
      break;
    }
  }
  if (!lines.empty()) out.push_back(std::move(lines));
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
