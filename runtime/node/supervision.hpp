// Supervision: what one node knows about the liveness of others. Addresses known dead (with
// the error calls to them fail with), the procs whose deaths are relayed to subscribers
// (PeerDead), and the host agents it watches by heartbeat with the procs that depend on each.
// Its own lock; it decides, the node acts (sends heartbeats, fails calls, relays notices).
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "wire.hpp"

namespace xmesh {

class Supervision {
 public:
  Supervision(int64_t heartbeat_ms, int64_t host_timeout_ms)
      : heartbeat_ms_(heartbeat_ms), host_timeout_ms_(host_timeout_ms) {}

  void mark_dead(const std::string& addr, const json& error);  // also drops it as a subscriber
  bool is_dead(const std::string& addr, json* error = nullptr) const;
  void revive(const std::string& addr);
  // The errors of those of addrs that are dead, by position.
  std::vector<std::pair<size_t, json>> dead_among(const std::vector<std::string>& addrs) const;

  void subscribe(const std::string& addr);
  void unsubscribe(const std::string& addr);
  std::set<std::string> subscribers() const;

  // pid: the agent's process when it runs on this machine (0 when not); host: its machine's
  // name, said when it is lost ("" when not known).
  void watch_host(const std::string& hostd_addr, int64_t pid = 0, const std::string& host = "");
  void unwatch_host(const std::string& hostd_addr);
  void add_dependent(const std::string& hostd_addr, const std::string& proc_addr);
  // An ack from the agent at hostd_addr, sent by its process `incarnation`: false when that is
  // not the process first acked (the agent restarted: the old one's procs ended with it).
  bool heartbeat_acked(const std::string& hostd_addr, uint64_t incarnation);

  struct Lost {
    std::string host;
    std::set<std::string> dependents;
    std::string reason;
  };
  struct HostState {
    bool alive = true;       // not lost
    bool answering = true;   // acks within the host timeout
    bool stopped = false;    // its process is stopped (SIGSTOP, a debugger)
    int64_t silent_ms = 0;   // since its last ack
  };
  std::optional<HostState> host_state(const std::string& hostd_addr) const;
  struct Tick {
    std::vector<std::string> heartbeats_due;  // send each a Heartbeat now
    std::vector<Lost> lost;                   // its process ended, or its acks stopped: fail them
  };
  Tick tick(int64_t now_ms);
  // The agent is known gone: its dependents, once (nullopt if already failed).
  std::optional<std::set<std::string>> lose_host(const std::string& hostd_addr);
  int64_t heartbeat_ms() const { return heartbeat_ms_; }
  int64_t host_timeout_ms() const { return host_timeout_ms_; }

 private:
  struct WatchedHost {
    int64_t last_ack_ms = 0;
    int64_t last_sent_ms = 0;
    int64_t pid = 0;  // its process, when on this machine
    uint64_t start_ticks = 0;
    std::string host;  // its machine's name
    uint64_t incarnation = 0;  // of the process that acked first (0: none yet)
    bool dead = false, answering = true, stopped = false;
    std::set<std::string> dependents;
  };
  int64_t heartbeat_ms_, host_timeout_ms_;
  int64_t last_tick_ms_ = 0;
  mutable std::mutex mu_;
  std::unordered_map<std::string, json> dead_;
  std::set<std::string> subscribers_;
  std::map<std::string, WatchedHost> hosts_;
};

}  // namespace xmesh
