// The host agent's requests and answers (runtime/hostd/ serves them; controllers, in C++ tests and
// in Python, send them): spawning and stopping procs, attaching to an allocation, its status,
// its log directories, the procs.json it writes. The agent's API between two programs, so
// here, beside the wire it travels on.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bodies.hpp"
#include "wire.hpp"

namespace xmesh {

// SpawnProcs (controller -> agent): start the procs of one allocation on this host.
struct SpawnRank {
  static constexpr const char* what = "SpawnProcs rank";
  int64_t rank = 0;
  nlohmann::json coords = nlohmann::json::object();
  std::string addr;  // its node address; empty: the agent's default (runtime/base/layout.hpp)
  StringMap env;     // added to the allocation's environment for this rank
  template <class F>
  static void fields(F&& f) {
    f("rank", &SpawnRank::rank, Need::Required);
    f("coords", &SpawnRank::coords, Need::Optional);
    f("addr", &SpawnRank::addr, Need::Optional);
    f("env", &SpawnRank::env, Need::Optional);
  }
};
XMESH_BODY_JSON(SpawnRank)

struct SpawnProcsBody {
  static constexpr const char* what = "SpawnProcs";
  static constexpr Kind kind = Kind::SpawnProcs;  // the message it is the body of
  std::string alloc;                 // the allocation's id: 1-16 lowercase hex digits
  std::string name;                 // its name ("" unless named)
  std::vector<std::string> argv;     // what each proc runs
  StringMap env;                     // the environment of every proc
  std::string cwd;
  std::vector<SpawnRank> ranks;      // at least one
  nlohmann::json shape = nlohmann::json::object();  // the whole mesh's (runtime/base/shape.hpp JSON)
  int64_t controller_pid = 0;
  void check() const;
  template <class F>
  static void fields(F&& f) {
    f("alloc", &SpawnProcsBody::alloc, Need::Required);
    f("name", &SpawnProcsBody::name, Need::Optional);
    f("argv", &SpawnProcsBody::argv, Need::Required);
    f("env", &SpawnProcsBody::env, Need::Required);
    f("cwd", &SpawnProcsBody::cwd, Need::Optional);
    f("ranks", &SpawnProcsBody::ranks, Need::Required);
    f("shape", &SpawnProcsBody::shape, Need::Optional);
    f("controller_pid", &SpawnProcsBody::controller_pid, Need::Optional);
  }
};
XMESH_BODY_JSON(SpawnProcsBody)

// A proc the agent started (SpawnProcs reply), or found (Attach reply, Status).
struct ProcEntry {
  static constexpr const char* what = "proc";
  int64_t rank = 0;
  int64_t pid = 0;
  std::string addr;
  bool alive = true;
  nlohmann::json coords = nlohmann::json::object();
  std::string state;  // "stopped", "in the kernel" when not running normally ("" when it is)
  uint64_t log_lost_bytes = 0;  // bytes its log file could not keep (a full disk), and why
  std::string log_error;
  template <class F>
  static void fields(F&& f) {
    f("rank", &ProcEntry::rank, Need::Required);
    f("pid", &ProcEntry::pid, Need::Required);
    f("addr", &ProcEntry::addr, Need::Optional);
    f("alive", &ProcEntry::alive, Need::Optional);
    f("state", &ProcEntry::state, Need::Optional);
    f("log_lost_bytes", &ProcEntry::log_lost_bytes, Need::Optional);
    f("log_error", &ProcEntry::log_error, Need::Optional);
    f("coords", &ProcEntry::coords, Need::Optional);
  }
};
XMESH_BODY_JSON(ProcEntry)

struct SpawnProcsReply {
  static constexpr const char* what = "SpawnProcs reply";
  std::string alloc, host;
  std::vector<ProcEntry> procs;
  std::string logdir;  // where the agent writes their log records
  template <class F>
  static void fields(F&& f) {
    f("alloc", &SpawnProcsReply::alloc, Need::Required);
    f("host", &SpawnProcsReply::host, Need::Optional);
    f("procs", &SpawnProcsReply::procs, Need::Required);
    f("logdir", &SpawnProcsReply::logdir, Need::Optional);
  }
};
XMESH_BODY_JSON(SpawnProcsReply)

// StopProcs (controller -> agent): stop an allocation, by id or (a live named one) by name.
struct StopProcsBody {
  static constexpr const char* what = "StopProcs";
  static constexpr Kind kind = Kind::StopProcs;  // the message it is the body of
  std::string alloc, name;
  bool immediately = false;  // SIGKILL now, not SIGTERM and a grace period
  // Who asks, when not the allocation's own controller ("the xmesh panel", "`xmesh stop` (pid
  // N)"): the procs' exits then say they were stopped by it, not "exited with code 143".
  std::string by;
  void check() const;
  template <class F>
  static void fields(F&& f) {
    f("alloc", &StopProcsBody::alloc, Need::Optional);
    f("name", &StopProcsBody::name, Need::Optional);
    f("immediately", &StopProcsBody::immediately, Need::Optional);
    f("by", &StopProcsBody::by, Need::Optional);
  }
};
XMESH_BODY_JSON(StopProcsBody)

// Gateway (controller -> agent): a controller outside the cluster reaches the other agents'
// ports through this agent's (socks_route.hpp): their "host:port" addresses, resolved here.
struct GatewayBody {
  static constexpr const char* what = "Gateway";
  static constexpr Kind kind = Kind::Gateway;  // the message it is the body of
  std::vector<std::string> agents;
  template <class F>
  static void fields(F&& f) {
    f("agents", &GatewayBody::agents, Need::Required);
  }
};
XMESH_BODY_JSON(GatewayBody)

struct StopProcsReply {
  static constexpr const char* what = "StopProcs reply";
  std::string alloc, name;
  template <class F>
  static void fields(F&& f) {
    f("alloc", &StopProcsReply::alloc, Need::Required);
    f("name", &StopProcsReply::name, Need::Optional);
  }
};
XMESH_BODY_JSON(StopProcsReply)

// Attach (controller -> agent): take over a live named allocation, or only look (observe).
struct AttachBody {
  static constexpr const char* what = "Attach";
  static constexpr Kind kind = Kind::Attach;  // the message it is the body of
  std::string name;
  int64_t controller_pid = 0;
  bool observe = false;  // `xmesh sync --reload`: reach the procs without owning them
  template <class F>
  static void fields(F&& f) {
    f("name", &AttachBody::name, Need::Required);
    f("controller_pid", &AttachBody::controller_pid, Need::Optional);
    f("observe", &AttachBody::observe, Need::Optional);
  }
};
XMESH_BODY_JSON(AttachBody)

// The controller that owned an allocation before an Attach.
struct PreviousOwner {
  static constexpr const char* what = "previous owner";
  std::string addr, id;
  int64_t pid = 0;
  bool attached = false;  // it was still connected (it is now refused)
  template <class F>
  static void fields(F&& f) {
    f("addr", &PreviousOwner::addr, Need::Optional);
    f("id", &PreviousOwner::id, Need::Optional);
    f("pid", &PreviousOwner::pid, Need::Optional);
    f("attached", &PreviousOwner::attached, Need::Optional);
  }
};
XMESH_BODY_JSON(PreviousOwner)

struct AttachReply {
  static constexpr const char* what = "Attach reply";
  std::string alloc, name;
  nlohmann::json shape = nlohmann::json::object();
  double created = 0;      // seconds since the epoch
  std::string host;
  std::string job_cookie;  // what the procs accept
  std::vector<ProcEntry> procs;
  PreviousOwner previous;
  template <class F>
  static void fields(F&& f) {
    f("alloc", &AttachReply::alloc, Need::Required);
    f("name", &AttachReply::name, Need::Required);
    f("shape", &AttachReply::shape, Need::Optional);
    f("created", &AttachReply::created, Need::Optional);
    f("host", &AttachReply::host, Need::Optional);
    f("job_cookie", &AttachReply::job_cookie, Need::Optional);
    f("procs", &AttachReply::procs, Need::Required);
    f("previous", &AttachReply::previous, Need::Optional);
  }
};
XMESH_BODY_JSON(AttachReply)

// Status (-> agent) is answered with what the agent runs.
struct AllocationStatus {
  static constexpr const char* what = "allocation status";
  std::string alloc, name;
  std::string controller;  // the owning controller's node id
  int64_t controller_pid = 0;
  bool attached = false;   // its controller is connected
  nlohmann::json shape = nlohmann::json::object();
  double created = 0;
  bool stopping = false;
  std::vector<ProcEntry> procs;
  template <class F>
  static void fields(F&& f) {
    f("alloc", &AllocationStatus::alloc, Need::Required);
    f("name", &AllocationStatus::name, Need::Optional);
    f("controller", &AllocationStatus::controller, Need::Optional);
    f("controller_pid", &AllocationStatus::controller_pid, Need::Optional);
    f("attached", &AllocationStatus::attached, Need::Optional);
    f("shape", &AllocationStatus::shape, Need::Optional);
    f("created", &AllocationStatus::created, Need::Optional);
    f("stopping", &AllocationStatus::stopping, Need::Optional);
    f("procs", &AllocationStatus::procs, Need::Optional);
  }
};
XMESH_BODY_JSON(AllocationStatus)

// What an agent's one TCP port (PortMux) did so far: connections taken, spliced to the agent or
// to a proc, lanes handed over to their proc, refused, closed before authenticating to make room
// for newer ones (a flood of half-open connections).
struct PortCounts {
  static constexpr const char* what = "port counts";
  uint64_t accepted = 0, relayed_to_agent = 0, relayed_to_procs = 0, lanes_handed_over = 0, refused = 0;
  uint64_t evicted = 0;
  // A controller reached back: its connections taken (for the agent, handed to procs); as a
  // gateway: connections relayed to other agents' ports.
  uint64_t back = 0, relayed_to_remote = 0;
  template <class F>
  static void fields(F&& f) {
    f("accepted", &PortCounts::accepted, Need::Optional);
    f("back", &PortCounts::back, Need::Optional);
    f("relayed_to_remote", &PortCounts::relayed_to_remote, Need::Optional);
    f("relayed_to_agent", &PortCounts::relayed_to_agent, Need::Optional);
    f("relayed_to_procs", &PortCounts::relayed_to_procs, Need::Optional);
    f("lanes_handed_over", &PortCounts::lanes_handed_over, Need::Optional);
    f("refused", &PortCounts::refused, Need::Optional);
    f("evicted", &PortCounts::evicted, Need::Optional);
  }
};
XMESH_BODY_JSON(PortCounts)

struct StatusReply {
  static constexpr const char* what = "Status reply";
  int64_t pid = 0;
  std::string host, version, build;
  int protocol = 0;
  std::string runtime_dir, workspace;  // the agent's runtime directory and workspace root
  // The interpreter its procs run and its version ("3.12.1"), when it was started in a Python
  // environment (HostAgentOptions::python); "" otherwise.
  std::string python, python_version;
  uint64_t sync_bytes_received = 0;
  std::vector<AllocationStatus> allocations;
  PortCounts port;  // all 0 for an agent without a TCP port
  template <class F>
  static void fields(F&& f) {
    f("pid", &StatusReply::pid, Need::Required);
    f("host", &StatusReply::host, Need::Optional);
    f("version", &StatusReply::version, Need::Optional);
    f("build", &StatusReply::build, Need::Optional);
    f("protocol", &StatusReply::protocol, Need::Optional);
    f("runtime_dir", &StatusReply::runtime_dir, Need::Optional);
    f("workspace", &StatusReply::workspace, Need::Optional);
    f("python", &StatusReply::python, Need::Optional);
    f("python_version", &StatusReply::python_version, Need::Optional);
    f("sync_bytes_received", &StatusReply::sync_bytes_received, Need::Optional);
    f("allocations", &StatusReply::allocations, Need::Required);
    f("port", &StatusReply::port, Need::Optional);
  }
};
XMESH_BODY_JSON(StatusReply)

// ReadLog (controller -> agent): the per-rank log files stay on each host and are read through
// its agent. `dir` is a log directory's name under the agent's logs root ("<name>-<alloc>");
// with no `file` the reply lists its files, else it carries up to max_bytes of `file` from
// `offset` as its payload. With neither, the reply lists the log directories (size 0).
struct ReadLogBody {
  static constexpr const char* what = "ReadLog";
  static constexpr Kind kind = Kind::ReadLog;  // the message it is the body of
  std::string dir;
  std::string file;       // "procs.json" or a rank's log file ("" lists the directory)
  int64_t offset = 0;
  int64_t max_bytes = 8 << 20;
  template <class F>
  static void fields(F&& f) {
    f("dir", &ReadLogBody::dir, Need::Required);
    f("file", &ReadLogBody::file, Need::Optional);
    f("offset", &ReadLogBody::offset, Need::Optional);
    f("max_bytes", &ReadLogBody::max_bytes, Need::Optional);
  }
  void check() const;
};
XMESH_BODY_JSON(ReadLogBody)

struct LogFileEntry {
  static constexpr const char* what = "log file entry";
  std::string name;
  int64_t size = 0;
  template <class F>
  static void fields(F&& f) {
    f("name", &LogFileEntry::name, Need::Required);
    f("size", &LogFileEntry::size, Need::Required);
  }
};
XMESH_BODY_JSON(LogFileEntry)

// The answer to ReadLog: the directory's files (a listing), or the size of the file read (its
// bytes from the offset are the payload).
struct ReadLogReply {
  static constexpr const char* what = "ReadLog reply";
  std::vector<LogFileEntry> files;
  int64_t size = 0;
  template <class F>
  static void fields(F&& f) {
    f("files", &ReadLogReply::files, Need::Optional);
    f("size", &ReadLogReply::size, Need::Optional);
  }
};
XMESH_BODY_JSON(ReadLogReply)

// Not a message: procs.json in an allocation's log directory (layout.hpp), written by the agent
// when it starts the procs, read by `mesh.logs()` and `xmesh logs` also after they ended.
struct RankMeta {
  static constexpr const char* what = "procs.json rank";
  int64_t pid = 0;
  nlohmann::json coords = nlohmann::json::object();
  template <class F>
  static void fields(F&& f) {
    f("pid", &RankMeta::pid, Need::Optional);
    f("coords", &RankMeta::coords, Need::Optional);
  }
};
XMESH_BODY_JSON(RankMeta)

struct AllocationMeta {
  static constexpr const char* what = "procs.json";
  std::string alloc, name, host;
  nlohmann::json shape = nlohmann::json::object();
  double created = 0;                     // seconds since the epoch
  std::map<std::string, RankMeta> ranks;  // by rank, as a decimal string
  template <class F>
  static void fields(F&& f) {
    f("alloc", &AllocationMeta::alloc, Need::Required);
    f("name", &AllocationMeta::name, Need::Optional);
    f("host", &AllocationMeta::host, Need::Optional);
    f("shape", &AllocationMeta::shape, Need::Optional);
    f("created", &AllocationMeta::created, Need::Optional);
    f("ranks", &AllocationMeta::ranks, Need::Optional);
  }
};
XMESH_BODY_JSON(AllocationMeta)

}  // namespace xmesh
