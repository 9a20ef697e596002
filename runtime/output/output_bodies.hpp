// The bodies of output's messages (output/): a proc's lines, the marker a flush wrote.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bodies.hpp"
#include "wire.hpp"

namespace xmesh {

// Log (agent -> controller): complete lines of one proc stream; the text is the payload frame.
struct LogBody {
  static constexpr const char* what = "Log";
  static constexpr Kind kind = Kind::Log;  // the message it is the body of
  std::string alloc;
  int64_t rank = 0;
  int64_t pid = 0;
  std::string stream = "stdout";  // "stdout" or "stderr"
  double time = 0;                // when the agent read them (seconds since the epoch)
  std::string cell, actor;        // the context of the last output marker (the call's cell)
  uint64_t mark = 0;              // the last output marker passed on this stream
  bool eof = false;               // the stream ended (the proc closed it or exited)
  void check() const;
  template <class F>
  static void fields(F&& f) {
    f("alloc", &LogBody::alloc, Need::Required);
    f("rank", &LogBody::rank, Need::Required);
    f("pid", &LogBody::pid, Need::Optional);
    f("stream", &LogBody::stream, Need::Required);
    f("time", &LogBody::time, Need::Optional);
    f("cell", &LogBody::cell, Need::Optional);
    f("actor", &LogBody::actor, Need::Optional);
    f("mark", &LogBody::mark, Need::Optional);
    f("eof", &LogBody::eof, Need::Optional);
  }
};
XMESH_BODY_JSON(LogBody)

// FlushOutput (controller -> actor host) is answered with the output marker it wrote.
struct FlushOutputReply {
  static constexpr const char* what = "FlushOutput reply";
  uint64_t m = 0;
  template <class F>
  static void fields(F&& f) {
    f("m", &FlushOutputReply::m, Need::Required);
  }
};
XMESH_BODY_JSON(FlushOutputReply)

}  // namespace xmesh
