#include "log_record.hpp"

#include <cstdio>
#include <cstdlib>

namespace xmesh {

std::string format_record(double time, char stream, bool whole_line, std::string_view actor, std::string_view text) {
  char head[48];
  int n = snprintf(head, sizeof(head), "%.6f\t%c\t", time, whole_line ? stream : static_cast<char>(stream - 32));
  std::string out(head, static_cast<size_t>(n));
  out.reserve(out.size() + actor.size() + text.size() + 2);
  out.append(actor);
  out += '\t';
  out.append(text);
  out += '\n';
  return out;
}

std::optional<LogRecordFields> parse_record(std::string_view line) {
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  size_t t1 = line.find('\t');
  if (t1 == std::string_view::npos || t1 == 0 || t1 + 2 >= line.size() || line[t1 + 2] != '\t') return std::nullopt;
  std::string stamp(line.substr(0, t1));
  char* end = nullptr;
  double time = std::strtod(stamp.c_str(), &end);
  if (end != stamp.c_str() + stamp.size()) return std::nullopt;
  LogRecordFields r;
  r.time = time;
  switch (line[t1 + 1]) {
    case 'o': r.stream = "stdout"; break;
    case 'e': r.stream = "stderr"; break;
    case 'O': r.stream = "stdout"; r.partial = true; break;
    case 'E': r.stream = "stderr"; r.partial = true; break;
    default: return std::nullopt;
  }
  std::string_view rest = line.substr(t1 + 3);
  size_t t3 = rest.find('\t');
  if (t3 == std::string_view::npos) return std::nullopt;
  r.actor = std::string(rest.substr(0, t3));
  r.text = std::string(rest.substr(t3 + 1));
  return r;
}

}  // namespace xmesh
