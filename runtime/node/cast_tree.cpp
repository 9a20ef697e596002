#include "cast_tree.hpp"

#include "util.hpp"

namespace xmesh {

std::vector<std::pair<size_t, size_t>> cast_slices(size_t n, size_t fanout) {
  std::vector<std::pair<size_t, size_t>> out;
  if (n == 0) return out;
  size_t k = std::min(n, std::max<size_t>(fanout, 1));
  size_t base = n / k, extra = n % k, lo = 0;
  for (size_t i = 0; i < k; ++i) {
    size_t len = base + (i < extra ? 1 : 0);
    out.emplace_back(lo, lo + len);
    lo += len;
  }
  return out;
}

std::string cast_host(const std::string& addr) {
  if (addr.rfind("tcp://", 0) != 0) return "";
  auto rest = addr.substr(6);
  auto slash = rest.find('/');
  if (slash != std::string::npos) rest.resize(slash);
  auto colon = rest.rfind(':');
  return colon == std::string::npos ? rest : rest.substr(0, colon);
}

std::vector<CastHop> cast_hops(const std::vector<CastTarget>& targets, size_t fanout) {
  // Runs of consecutive targets on one host: [start, end) positions.
  std::vector<std::pair<size_t, size_t>> runs;
  std::string host;
  for (size_t i = 0; i < targets.size(); ++i) {
    std::string h = cast_host(targets[i].addr);
    if (runs.empty() || h != host) runs.emplace_back(i, i);
    runs.back().second = i + 1;
    host = std::move(h);
  }
  std::vector<std::pair<size_t, size_t>> slices;  // [lo, hi) positions of each hop
  if (runs.size() <= 1) {
    slices = cast_slices(targets.size(), fanout);
  } else {
    for (auto [a, b] : cast_slices(runs.size(), fanout)) slices.emplace_back(runs[a].first, runs[b - 1].second);
  }
  std::vector<CastHop> hops;
  for (auto [lo, hi] : slices) {
    CastHop hop;
    hop.first = lo;
    hop.behind.assign(targets.begin() + static_cast<std::ptrdiff_t>(lo + 1), targets.begin() + static_cast<std::ptrdiff_t>(hi));
    hops.push_back(std::move(hop));
  }
  return hops;
}

namespace {
// Walks the tree the relays will make (cast_hops at each level) over positions [lo, lo + n).
void assign_parents(const std::vector<CastTarget>& list, size_t offset, int32_t parent, size_t fanout,
                    std::vector<int32_t>& out) {
  for (auto& hop : cast_hops(list, fanout)) {
    size_t at = offset + hop.first;
    out[at] = parent;
    assign_parents(hop.behind, at + 1, static_cast<int32_t>(at), fanout, out);
  }
}
}  // namespace

std::vector<int32_t> cast_parents(const std::vector<CastTarget>& targets, size_t fanout) {
  std::vector<int32_t> out(targets.size(), -1);
  assign_parents(targets, 0, -1, fanout, out);
  return out;
}

// ---- OrderGate -------------------------------------------------------------------------------
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
void Gathers::open(const std::string& origin, uint64_t corr, const std::string& upstream, size_t expected) {
  std::lock_guard<std::mutex> g(mu_);
  Key key{origin, corr};
  auto [it, fresh] = gathers_.try_emplace(key);
  it->second.upstream = upstream;
  it->second.expected += expected;  // a relay reached twice for one call (never in one tree): both count
  if (fresh) order_.push_back(key);
  while (gathers_.size() > limit_ && !order_.empty()) {
    gathers_.erase(order_.front());
    order_.pop_front();
  }
}

bool Gathers::add(const std::string& origin, uint64_t corr, CallResult& r) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = gathers_.find(Key{origin, corr});
  if (it == gathers_.end()) return false;
  it->second.pending.push_back(std::move(r));
  dirty_.store(true, std::memory_order_release);
  return true;
}

std::vector<Gathers::Batch> Gathers::take() {
  std::vector<Batch> out;
  std::lock_guard<std::mutex> g(mu_);
  if (!dirty_.exchange(false, std::memory_order_acq_rel)) return out;
  for (auto it = gathers_.begin(); it != gathers_.end();) {
    Gather& ga = it->second;
    if (!ga.pending.empty()) {
      ga.passed += ga.pending.size();
      out.push_back(Batch{ga.upstream, it->first.first, it->first.second, std::move(ga.pending)});
      ga.pending.clear();
    }
    if (ga.passed >= ga.expected)
      it = gathers_.erase(it);  // its key stays in order_ until it comes to the front (harmless)
    else
      ++it;
  }
  while (!order_.empty() && !gathers_.count(order_.front())) order_.pop_front();
  if (order_.size() > 2 * gathers_.size() + 64) {  // closed ones behind an open one: keep the open only
    std::deque<Key> open;
    for (auto& k : order_)
      if (gathers_.count(k)) open.push_back(k);
    order_.swap(open);
  }
  return out;
}

void Gathers::reroute(const std::string& dead_upstream) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [key, ga] : gathers_)
    if (ga.upstream == dead_upstream) ga.upstream = key.first;
}

size_t Gathers::open_count() const {
  std::lock_guard<std::mutex> g(mu_);
  return gathers_.size();
}

size_t Gathers::remembered() const {
  std::lock_guard<std::mutex> g(mu_);
  return order_.size();
}

// ---- DeferredSends --------------------------------------------------------------------------
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
std::vector<std::vector<CallResult>> split_batches(std::vector<CallResult> results, size_t cap) {
  std::vector<std::vector<CallResult>> out;
  size_t bytes = 0;
  for (auto& r : results) {
    size_t size = 0;
    for (auto& f : r.frames) size += f.size();
    if (out.empty() || (!out.back().empty() && bytes + size > cap)) {
      out.emplace_back();
      bytes = 0;
    }
    bytes += size;
    out.back().push_back(std::move(r));
  }
  return out;
}

Header replies_header(const std::string& origin, uint64_t corr, std::vector<CallResult>& results,
                      std::vector<zmq::message_t>& frames) {
  RepliesBody body;
  body.origin = origin;
  for (auto& r : results) {
    ReplyEntry e;
    e.index = r.index;
    e.ok = r.ok;
    if (!r.ok) e.body = std::move(r.body);
    e.frames = static_cast<int64_t>(r.frames.size());
    for (auto& f : r.frames) frames.push_back(std::move(f));
    body.replies.push_back(std::move(e));
  }
  Header h;
  h.kind = Kind::Replies;
  h.corr = corr;
  h.body = body;
  return h;
}

std::optional<std::vector<CallResult>> read_replies(Message& m, std::string* origin, std::string* why) {
  auto body = read_as<RepliesBody>(m.header.body, why);
  if (!body) return std::nullopt;
  size_t need = 0;
  for (auto& e : body->replies) need += static_cast<size_t>(e.frames);
  if (need != m.frames.size()) {
    if (why)
      *why = "Replies body names " + std::to_string(need) + " payload frames, the message has " +
             std::to_string(m.frames.size());
    return std::nullopt;
  }
  std::vector<CallResult> out;
  size_t f = 0;
  for (auto& e : body->replies) {
    CallResult r;
    r.index = e.index;
    r.ok = e.ok;
    if (!e.ok) r.body = std::move(e.body);
    for (int64_t i = 0; i < e.frames; ++i) r.frames.push_back(std::move(m.frames[f++]));
    out.push_back(std::move(r));
  }
  *origin = std::move(body->origin);
  return out;
}

}  // namespace xmesh
