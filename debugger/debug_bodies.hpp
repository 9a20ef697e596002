// The bodies of the debugger's messages (debugger/): a pdb session's events and the commands for it.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bodies.hpp"
#include "wire.hpp"

namespace xmesh {

// DebugEvent (proc -> controller): a pdb session stopped (prompt), runs, ended, or needs the
// source of files the proc does not have (sources).
struct DebugEventBody {
  static constexpr const char* what = "DebugEvent";
  static constexpr Kind kind = Kind::DebugEvent;  // the message it is the body of
  std::string ev;             // "prompt", "running", "ended", "sources", "pause" (reason: "pausing",
                              // "idle"; for each actor rank a pause reached)
  std::string sid;            // the session, unique in its proc
  std::string out;            // pdb's output since the last event
  bool stop = false;          // prompt: a new stop (not the answer to a command)
  bool gone = false;          // ended: the controller asked about a session that had ended
  nlohmann::json stack = nlohmann::json::array();  // prompt+stop: [[file, line, function], ...]
  std::vector<std::string> files;                  // sources: the files it asks for
  // prompt: where it stopped.
  std::optional<std::string> actor, host, cell, reason, function, file;
  std::optional<int64_t> rank, pid, line;
  std::optional<nlohmann::json> coords, sizes;
  void check() const;
  template <class F>
  static void fields(F&& f) {
    f("ev", &DebugEventBody::ev, Need::Required);
    f("sid", &DebugEventBody::sid, Need::Required);
    f("out", &DebugEventBody::out, Need::Optional);
    f("stop", &DebugEventBody::stop, Need::Optional);
    f("gone", &DebugEventBody::gone, Need::Optional);
    f("stack", &DebugEventBody::stack, Need::Optional);
    f("files", &DebugEventBody::files, Need::Optional);
    f("actor", &DebugEventBody::actor, Need::Optional);
    f("host", &DebugEventBody::host, Need::Optional);
    f("cell", &DebugEventBody::cell, Need::Optional);
    f("reason", &DebugEventBody::reason, Need::Optional);
    f("function", &DebugEventBody::function, Need::Optional);
    f("file", &DebugEventBody::file, Need::Optional);
    f("rank", &DebugEventBody::rank, Need::Optional);
    f("pid", &DebugEventBody::pid, Need::Optional);
    f("line", &DebugEventBody::line, Need::Optional);
    f("coords", &DebugEventBody::coords, Need::Optional);
    f("sizes", &DebugEventBody::sizes, Need::Optional);
  }
};
XMESH_BODY_JSON(DebugEventBody)

// DebugCommand (controller -> proc): a pdb command, continue, or requested sources, for one
// session ("*": every session of the proc).
struct DebugCommandBody {
  static constexpr const char* what = "DebugCommand";
  static constexpr Kind kind = Kind::DebugCommand;  // the message it is the body of
  std::string sid;
  std::optional<std::string> cmd;
  bool resume = false;                    // clear breakpoints and continue
  std::optional<nlohmann::json> sources;  // {file: text or null}
  // Attach to running actors (sid unused): stop the ranks pause_ranks of the actor mesh named
  // pause_actor where they run (unpause: withdraw a pause that has not stopped them yet;
  // pause_idle: an idle one stops at the start of its next call, else it is only reported).
  std::optional<std::string> pause_actor;
  std::vector<int64_t> pause_ranks;
  bool unpause = false;
  bool pause_idle = false;
  template <class F>
  static void fields(F&& f) {
    f("sid", &DebugCommandBody::sid, Need::Required);
    f("cmd", &DebugCommandBody::cmd, Need::Optional);
    f("resume", &DebugCommandBody::resume, Need::Optional);
    f("sources", &DebugCommandBody::sources, Need::Optional);
    f("pause_actor", &DebugCommandBody::pause_actor, Need::Optional);
    f("pause_ranks", &DebugCommandBody::pause_ranks, Need::Optional);
    f("unpause", &DebugCommandBody::unpause, Need::Optional);
    f("pause_idle", &DebugCommandBody::pause_idle, Need::Optional);
  }
};
XMESH_BODY_JSON(DebugCommandBody)

}  // namespace xmesh
