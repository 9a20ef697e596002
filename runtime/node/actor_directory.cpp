#include "actor_directory.hpp"

#include "util.hpp"

namespace xmesh {

std::shared_ptr<Inbox> ActorDirectory::inbox(const std::string& name) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = actors_.find(name);
  return it == actors_.end() ? nullptr : it->second;
}

bool ActorDirectory::deliver(Message& m) {
  auto box = inbox(m.header.actor);
  if (box && box->push(std::move(m))) return true;
  std::lock_guard<std::mutex> g(mu_);
  if (box || removed_.count(m.header.actor)) return false;
  auto& h = held_[m.header.actor];
  if (h.msgs.empty()) h.deadline_ms = now_ms() + hold_ms_;
  h.msgs.push_back(std::move(m));
  return true;
}

std::shared_ptr<Inbox> ActorDirectory::spawn(Message& m) {
  const std::string name = m.header.actor;
  std::lock_guard<std::mutex> g(mu_);
  if (actors_.count(name)) return nullptr;
  auto box = std::make_shared<Inbox>(/*spin=*/true);
  if (feed_) box->feed_from(feed_, 2u << (next_feed_bit_++ % 30));  // 2..2^30 (see WaitFeed)
  actors_[name] = box;
  // Under the lock, so that nothing delivered meanwhile overtakes the spawn or what was held.
  box->push(std::move(m));
  auto h = held_.find(name);
  if (h != held_.end()) {
    for (auto& msg : h->second.msgs) box->push(std::move(msg));
    held_.erase(h);
  }
  return box;
}

std::shared_ptr<Inbox> ActorDirectory::remove(const std::string& name, json tombstone) {
  std::shared_ptr<Inbox> box;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = actors_.find(name);
    if (it == actors_.end()) return nullptr;
    box = it->second;
    actors_.erase(it);
    if (removed_.size() > 10000) removed_.clear();
    removed_[name] = std::move(tombstone);
  }
  box->close();
  return box;
}

std::optional<json> ActorDirectory::tombstone(const std::string& name) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = removed_.find(name);
  if (it == removed_.end() || it->second.is_null()) return std::nullopt;
  return it->second;
}

bool ActorDirectory::amend_tombstone(const std::string& name, json tombstone) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = removed_.find(name);
  if (it == removed_.end()) return false;
  it->second = std::move(tombstone);
  return true;
}

std::vector<Message> ActorDirectory::expire(int64_t now) {
  std::vector<Message> expired;
  std::lock_guard<std::mutex> g(mu_);
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second.deadline_ms <= now) {
      for (auto& m : it->second.msgs) expired.push_back(std::move(m));
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  return expired;
}

std::vector<std::shared_ptr<Inbox>> ActorDirectory::close_all() {
  std::vector<std::shared_ptr<Inbox>> boxes;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& kv : actors_) boxes.push_back(kv.second);
  }
  for (auto& b : boxes) b->close();
  return boxes;
}

void ActorDirectory::refuse_from(const std::string& addr, const json& error) {
  std::lock_guard<std::mutex> g(mu_);
  refused_[addr] = error;
  any_refused_ = true;
}

std::optional<json> ActorDirectory::refusal_for(const Message& m) const {
  if (!any_refused_.load()) return std::nullopt;
  Kind k = m.header.kind;
  if (k != Kind::Call && k != Kind::SpawnActor && k != Kind::StopActor) return std::nullopt;
  std::lock_guard<std::mutex> g(mu_);
  auto it = refused_.find(m.sender_addr);
  if (it == refused_.end()) return std::nullopt;
  return it->second;
}

}  // namespace xmesh
