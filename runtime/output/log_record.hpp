// The record format of the per-rank log files host agents keep (<log dir>/rank<r>.log, see
// layout.hpp), defined once: the agent writes records with format_record and readers (the
// Python `mesh.logs()` / `xmesh logs`, through xmesh._core.parse_log_record) read them with
// parse_record. One record per line:
//
//   <epoch seconds, 6 decimals>\t<flag>\t<actor>\t<text>\n
//
// flag o / e for stdout / stderr; O / E when the text had no newline of its own (a partial line,
// or a piece of a line too long for one record). The text holds no newline; the actor no tab.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace xmesh {

struct LogRecordFields {
  double time = 0;
  std::string stream;  // "stdout" or "stderr"
  bool partial = false;  // the text had no newline of its own
  std::string actor, text;
};

// One line, newline included. stream: 'o' (stdout) or 'e' (stderr).
std::string format_record(double time, char stream, bool whole_line, std::string_view actor, std::string_view text);
// nullopt for a line that is not a record (a torn write, another file); a trailing newline is
// allowed.
std::optional<LogRecordFields> parse_record(std::string_view line);

}  // namespace xmesh
