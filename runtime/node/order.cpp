#include "order.hpp"

#include "util.hpp"

namespace xmesh {

void OrderGate::give_up(Stream& s, uint64_t oseq) {
  s.given_up.push_back(oseq);
  if (s.given_up.size() > 4096) s.given_up.pop_front();
}

void OrderGate::release(Stream& s, std::vector<Message>& out, int64_t now) {
  bool moved = false;
  for (;;) {
    auto it = s.early.find(s.next);
    if (it != s.early.end()) {
      out.push_back(std::move(it->second));
      s.early.erase(it);
    } else if (s.lost.erase(s.next)) {
      give_up(s, s.next);
    } else {
      break;
    }
    ++s.next;
    moved = true;
  }
  if (s.early.empty())
    s.waiting_since = 0;
  else if (moved || s.waiting_since == 0)
    s.waiting_since = now;
}

OrderGate::Stream& OrderGate::stream(const std::string& origin) {
  auto it = streams_.find(origin);
  if (it != streams_.end()) return it->second;
  if (streams_.size() >= kMaxStreams)  // one per process that ever sent here: forget idle ones
    for (auto i = streams_.begin(); i != streams_.end();)
      i = i->second.early.empty() && i->second.lost.empty() ? streams_.erase(i) : std::next(i);
  return streams_[origin];
}

std::vector<Message> OrderGate::admit(const std::string& origin, Message m) {
  std::vector<Message> out;
  std::lock_guard<std::mutex> g(mu_);
  Stream& s = stream(origin);
  uint64_t n = m.header.oseq;
  if (n < s.next) {
    for (uint64_t u : s.given_up)
      if (u == n) {
        ++dropped_;
        return out;
      }
    ++late_;  // its wait expired: taken now, after the ones that did not wait for it
    out.push_back(std::move(m));
    return out;
  }
  if (n > s.next) {
    if (s.lost.count(n)) {  // said lost, came after all: too late (its call was failed); passed over in turn
      ++dropped_;
      return out;
    }
    s.early.emplace(n, std::move(m));
    if (s.waiting_since == 0) s.waiting_since = now_ms();
    return out;
  }
  out.push_back(std::move(m));
  ++s.next;
  release(s, out, now_ms());
  return out;
}

std::vector<Message> OrderGate::skip(const std::string& origin, const std::vector<uint64_t>& oseqs, uint64_t through) {
  std::vector<Message> out;
  std::lock_guard<std::mutex> g(mu_);
  Stream& s = stream(origin);
  for (uint64_t n : oseqs)  // numbers far ahead are not kept (a notice cannot fill memory)
    if (n >= s.next && n - s.next < kWindow && s.lost.size() < kWindow && !s.early.count(n)) s.lost.insert(n);
  for (uint64_t n = s.next; n <= through && n - s.next < kWindow && s.lost.size() < kWindow; ++n)
    if (!s.early.count(n)) s.lost.insert(n);
  release(s, out, now_ms());
  return out;
}

std::vector<Message> OrderGate::expire(int64_t now, std::vector<std::string>* gaps) {
  std::vector<Message> out;
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [origin, s] : streams_) {
    if (s.early.empty() || now - s.waiting_since < wait_ms_) continue;
    uint64_t first = s.early.begin()->first;
    if (gaps)
      gaps->push_back(origin + ": " + std::to_string(first - s.next) + " message(s) from #" + std::to_string(s.next) +
                      " never came");
    for (uint64_t n = s.next; n < first && n - s.next < 4096; ++n) s.lost.erase(n);
    s.next = first;  // numbers passed here that still come are taken late, not dropped
    release(s, out, now);
  }
  return out;
}

void OrderGate::forget(const std::string& origin) {
  std::lock_guard<std::mutex> g(mu_);
  streams_.erase(origin);
}

size_t OrderGate::held() const {
  std::lock_guard<std::mutex> g(mu_);
  size_t n = 0;
  for (auto& [_, s] : streams_) n += s.early.size();
  return n;
}

// ---- Gathers ---------------------------------------------------------------------------------
bool DeferredSends::busy(const std::string& addr) const {
  std::lock_guard<std::mutex> g(mu_);
  return queues_.count(addr) || in_flight_.count(addr);
}

void DeferredSends::push(Send s) {
  {
    std::lock_guard<std::mutex> g(mu_);
    std::string addr = s.addr;
    queues_[addr].push_back(std::move(s));
    ++size_;
    ++pushed_;
  }
  cv_.notify_one();
}

std::optional<DeferredSends::Send> DeferredSends::pop(int timeout_ms) {
  std::unique_lock<std::mutex> g(mu_);
  auto ready = [&]() -> std::map<std::string, std::deque<Send>>::iterator {
    for (auto it = queues_.begin(); it != queues_.end(); ++it)
      if (!in_flight_.count(it->first)) return it;
    return queues_.end();
  };
  auto it = queues_.end();
  cv_.wait_for(g, std::chrono::milliseconds(timeout_ms), [&] { return stopped_ || (it = ready()) != queues_.end(); });
  if (stopped_ || it == queues_.end()) return std::nullopt;
  Send s = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  --size_;
  in_flight_.insert(s.addr);
  return s;
}

void DeferredSends::done(const std::string& addr) {
  {
    std::lock_guard<std::mutex> g(mu_);
    in_flight_.erase(addr);
  }
  cv_.notify_one();
}

void DeferredSends::stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
}

// ---- Replies ---------------------------------------------------------------------------------

}  // namespace xmesh
