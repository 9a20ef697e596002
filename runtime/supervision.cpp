#include "supervision.hpp"

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

void Supervision::watch_host(const std::string& hostd_addr) {
  std::lock_guard<std::mutex> g(mu_);
  auto& w = hosts_[hostd_addr];
  w.last_ack_ms = now_ms();
  w.dead = false;
}

void Supervision::unwatch_host(const std::string& hostd_addr) {
  std::lock_guard<std::mutex> g(mu_);
  hosts_.erase(hostd_addr);
}

void Supervision::add_dependent(const std::string& hostd_addr, const std::string& proc_addr) {
  std::lock_guard<std::mutex> g(mu_);
  hosts_[hostd_addr].dependents.insert(proc_addr);
}

void Supervision::heartbeat_acked(const std::string& hostd_addr) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = hosts_.find(hostd_addr);
  if (it != hosts_.end()) it->second.last_ack_ms = now_ms();
}

Supervision::Tick Supervision::tick(int64_t now) {
  Tick t;
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [addr, w] : hosts_) {
    if (w.dead) continue;
    if (now - w.last_ack_ms > host_timeout_ms_) {
      w.dead = true;
      t.lost.push_back(Lost{addr, w.dependents});
      continue;
    }
    if (now - w.last_sent_ms >= heartbeat_ms_) {
      w.last_sent_ms = now;
      t.heartbeats_due.push_back(addr);
    }
  }
  return t;
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
