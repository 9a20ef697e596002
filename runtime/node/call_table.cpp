#include "call_table.hpp"

namespace xmesh {

void CallTable::add(const std::shared_ptr<Call>& c) {
  std::lock_guard<std::mutex> g(mu_);
  calls_[c->id()] = c;
  for (size_t i = 0; i < c->size(); ++i) by_addr_[c->target_addr(i)].insert(c->id());
}

void CallTable::add_addr(uint64_t id, const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  by_addr_[addr].insert(id);
}

std::shared_ptr<Call> CallTable::find(uint64_t id) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = calls_.find(id);
  return it == calls_.end() ? nullptr : it->second.lock();
}

void CallTable::forget(uint64_t id) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = calls_.find(id);
  if (it == calls_.end()) return;
  if (auto c = it->second.lock()) {
    for (size_t i = 0; i < c->size(); ++i) {
      auto b = by_addr_.find(c->target_addr(i));
      if (b != by_addr_.end()) {
        b->second.erase(id);
        if (b->second.empty()) by_addr_.erase(b);
      }
    }
  }
  calls_.erase(it);
}

std::vector<std::shared_ptr<Call>> CallTable::to_addr(const std::string& addr) const {
  std::vector<std::shared_ptr<Call>> out;
  std::lock_guard<std::mutex> g(mu_);
  auto b = by_addr_.find(addr);
  if (b == by_addr_.end()) return out;
  for (auto id : b->second) {
    auto it = calls_.find(id);
    if (it != calls_.end())
      if (auto c = it->second.lock()) out.push_back(c);
  }
  return out;
}

}  // namespace xmesh
