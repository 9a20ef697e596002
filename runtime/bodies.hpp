// The typed bodies of protocol messages: one definition of each body, written by its sender
// and read by its receivers on both sides, C++ here and Python through pybind11 (xmesh._core,
// `Message.proc_exited()`), instead of JSON objects built in one language and read by string
// keys in the other. from_json validates and throws std::invalid_argument naming the field.
// Kinds move here one by one (docs/ARCHITECTURE.md says which have).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace xmesh {

// ProcExited (agent -> controller): a proc ended, after its pipes were drained.
struct ProcExitedBody {
  std::string alloc;                  // the allocation's id
  int64_t rank = 0;
  int64_t pid = 0;
  std::string addr;                   // the proc's node address (now dead)
  std::string host;                   // the agent's hostname
  nlohmann::json coords = nlohmann::json::object();
  bool stopping = false;              // it was asked to stop (not a failure)
  std::string text;                   // "proc rank 3 (pid 123 on host) killed by SIGKILL; its last output: ..."
  std::optional<std::string> signal;  // "SIGKILL" when a signal ended it
  std::optional<int> exit_code;       // when it exited
};

void to_json(nlohmann::json& j, const ProcExitedBody& b);
void from_json(const nlohmann::json& j, ProcExitedBody& b);

// Log (agent -> controller): complete lines of one proc stream; the text is the payload frame.
struct LogBody {
  std::string alloc;
  int64_t rank = 0;
  int64_t pid = 0;
  std::string stream = "stdout";  // "stdout" or "stderr"
  double time = 0;                // when the agent read them (seconds since the epoch)
  std::string cell, actor;        // the context of the last output marker (the call's cell)
  uint64_t mark = 0;              // the last output marker passed on this stream
  bool eof = false;               // the stream ended (the proc closed it or exited)
};

void to_json(nlohmann::json& j, const LogBody& b);
void from_json(const nlohmann::json& j, LogBody& b);

// Cancel (controller -> proc): cancel one target of a call.
struct CancelBody {
  uint64_t corr = 0;  // the call's correlation id
  int64_t index = 0;  // which of its targets
};

// Configure (controller -> proc): settings; only those present change.
struct ConfigureBody {
  std::optional<int> log_level;     // the procs' Python logging level
  std::optional<bool> post_mortem;  // stop in pdb where an endpoint raises
};

// Adopt (controller -> proc of a named allocation it attached, or sharing a cookie).
struct AdoptBody {
  std::vector<std::string> cookies;  // to accept from now on
  std::vector<std::string> refuse;   // controllers whose calls are refused from now on
  std::string refuse_text;           // what they are told
};

// PeerDead: a peer address died (relayed to procs; a host loss goes to the node's own control
// inbox with host_lost).
struct PeerDeadBody {
  std::string addr;
  nlohmann::json error = nlohmann::json::object();  // the supervision error body calls to it fail with
  bool host_lost = false;
};

// Reload (controller -> actor host): reload the modules of these synced files.
struct ReloadBody {
  std::vector<std::string> files;  // absolute paths on the proc's host
};

void to_json(nlohmann::json& j, const PeerDeadBody& b);
void from_json(const nlohmann::json& j, PeerDeadBody& b);
void to_json(nlohmann::json& j, const ReloadBody& b);
void from_json(const nlohmann::json& j, ReloadBody& b);
void to_json(nlohmann::json& j, const CancelBody& b);
void from_json(const nlohmann::json& j, CancelBody& b);
void to_json(nlohmann::json& j, const ConfigureBody& b);
void from_json(const nlohmann::json& j, ConfigureBody& b);
void to_json(nlohmann::json& j, const AdoptBody& b);
void from_json(const nlohmann::json& j, AdoptBody& b);

}  // namespace xmesh
