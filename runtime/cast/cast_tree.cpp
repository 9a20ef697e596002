#include "cast_tree.hpp"

#include "util.hpp"
#include "cast_bodies.hpp"
#include "node_bodies.hpp"

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
