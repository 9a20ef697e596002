#include "supervision.hpp"

#include <cstdlib>

#include "layout.hpp"
#include "process.hpp"
#include "util.hpp"

namespace xmesh {

void Supervision::mark_dead(const std::string& addr, const json& error) {
  std::lock_guard<std::mutex> g(mu_);
  dead_[addr] = error;
  subscribers_.erase(addr);
}

bool Supervision::is_dead(const std::string& addr, json* error) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = dead_.find(addr);
  if (it == dead_.end()) return false;
  if (error) *error = it->second;
  return true;
}

void Supervision::revive(const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  dead_.erase(addr);
}

std::vector<std::pair<size_t, json>> Supervision::dead_among(const std::vector<std::string>& addrs) const {
  std::vector<std::pair<size_t, json>> out;
  std::lock_guard<std::mutex> g(mu_);
  if (dead_.empty()) return out;
  for (size_t i = 0; i < addrs.size(); ++i) {
    auto d = dead_.find(addrs[i]);
    if (d != dead_.end()) out.emplace_back(i, d->second);
  }
  return out;
}

void Supervision::subscribe(const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  subscribers_.insert(addr);
}

void Supervision::unsubscribe(const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  subscribers_.erase(addr);
}

std::set<std::string> Supervision::subscribers() const {
  std::lock_guard<std::mutex> g(mu_);
  return subscribers_;
}

void Supervision::watch_host(const std::string& hostd_addr, int64_t pid, const std::string& host) {
  auto status = pid > 0 ? process_status(static_cast<pid_t>(pid)) : std::nullopt;
  std::lock_guard<std::mutex> g(mu_);
  auto& w = hosts_[hostd_addr];
  w.last_ack_ms = now_ms();
  w.dead = false;
  w.pid = status ? pid : 0;
  w.start_ticks = status ? status->start_ticks : 0;
  w.host = host;
  w.incarnation = 0;
}

void Supervision::unwatch_host(const std::string& hostd_addr) {
  std::lock_guard<std::mutex> g(mu_);
  hosts_.erase(hostd_addr);
}

void Supervision::add_dependent(const std::string& hostd_addr, const std::string& proc_addr) {
  std::lock_guard<std::mutex> g(mu_);
  hosts_[hostd_addr].dependents.insert(proc_addr);
}

bool Supervision::heartbeat_acked(const std::string& hostd_addr, uint64_t incarnation) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = hosts_.find(hostd_addr);
  if (it == hosts_.end()) return true;
  WatchedHost& w = it->second;
  if (w.incarnation == 0) w.incarnation = incarnation;
  if (w.incarnation != incarnation) return false;
  w.last_ack_ms = now_ms();
  return true;
}

namespace {
// An agent that exits cleanly removes its pid file; one killed leaves it naming its pid.
bool left_cleanly(const std::string& addr, int64_t pid) {
  if (addr.rfind("ipc://", 0) != 0) return false;
  std::string path = addr.substr(6);
  std::string pidfile = layout::hostd_pid_file(path.substr(0, path.rfind('/')));
  std::string text;
  if (!read_file(pidfile, text)) return true;
  return std::strtoll(text.c_str(), nullptr, 10) != pid;
}
}  // namespace

// A host whose process this node can see (same machine) is lost when that process ends, at
// once, and never for silence alone: a stopped or busy agent comes back with its procs. Any
// other host is lost when its acks stop for host_timeout_ms. Time this node itself did not run
// (stopped, suspended) is not counted as the hosts' silence.
Supervision::Tick Supervision::tick(int64_t now) {
  Tick t;
  std::lock_guard<std::mutex> g(mu_);
  const int64_t stall = last_tick_ms_ ? now - last_tick_ms_ : 0;
  last_tick_ms_ = now;
  const bool stalled = stall > std::max<int64_t>(1000, 4 * heartbeat_ms_);
  for (auto& [addr, w] : hosts_) {
    if (w.dead) continue;
    if (stalled) w.last_ack_ms += stall;
    const int64_t silent_ms = now - w.last_ack_ms;
    if (w.pid > 0) {
      auto status = process_status(static_cast<pid_t>(w.pid));
      if (!status || status->start_ticks != w.start_ticks) {
        w.dead = true;
        t.lost.push_back(Lost{addr, w.dependents,
                              "host agent " + std::to_string(w.pid) + " at " + addr +
                                  (left_cleanly(addr, w.pid) ? " shut down"
                                                             : " ended without shutting down (killed, or crashed)")});
        continue;
      }
      w.stopped = status->stopped();
      w.answering = silent_ms <= host_timeout_ms_;
    } else if (silent_ms > host_timeout_ms_) {
      w.dead = true;
      t.lost.push_back(Lost{addr, w.dependents,
                            "host agent at " + addr + (w.host.empty() ? "" : " (" + w.host + ")") +
                                " stopped answering heartbeats for " +
                                std::to_string(silent_ms) + " ms"});
      continue;
    }
    if (now - w.last_sent_ms >= heartbeat_ms_) {
      w.last_sent_ms = now;
      t.heartbeats_due.push_back(addr);
    }
  }
  return t;
}

std::optional<Supervision::HostState> Supervision::host_state(const std::string& hostd_addr) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = hosts_.find(hostd_addr);
  if (it == hosts_.end()) return std::nullopt;
  return HostState{!it->second.dead, it->second.answering, it->second.stopped, now_ms() - it->second.last_ack_ms};
}

std::optional<std::set<std::string>> Supervision::lose_host(const std::string& hostd_addr) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = hosts_.find(hostd_addr);
  if (it == hosts_.end()) return std::set<std::string>();
  if (it->second.dead) return std::nullopt;  // already failed (heartbeats)
  it->second.dead = true;
  return it->second.dependents;
}

}  // namespace xmesh
