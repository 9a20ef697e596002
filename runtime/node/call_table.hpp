// CallTable: the calls of one node that wait for replies, by correlation id and by target
// address, so that a reply finds its Call and supervision finds every call to an address that
// died. Its own lock; held only to look up or change the maps, never while delivering.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "call.hpp"

namespace xmesh {

class CallTable {
 public:
  uint64_t next_id() { return next_corr_++; }
  // Registers c under its id and each of its target addresses.
  void add(const std::shared_ptr<Call>& c);
  std::shared_ptr<Call> find(uint64_t id) const;  // null: unknown or abandoned
  void add_addr(uint64_t id, const std::string& addr);  // a target's address learned later
  void forget(uint64_t id);
  std::vector<std::shared_ptr<Call>> to_addr(const std::string& addr) const;

 private:
  std::atomic<uint64_t> next_corr_{1};
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::weak_ptr<Call>> calls_;
  std::unordered_map<std::string, std::set<uint64_t>> by_addr_;
};

}  // namespace xmesh
