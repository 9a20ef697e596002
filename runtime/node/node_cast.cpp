// The node's side of cast trees and per-origin order (cast_tree.hpp has the design): the origin
// numbers its actor messages and sends a tree past XMESH_CAST_FANOUT targets; a relay forwards
// before its own actor sees the message and gathers the answers; a destination takes each
// origin's messages in order.
#include "node.hpp"
#include "util.hpp"

namespace xmesh {

namespace {
std::vector<zmq::message_t> copy_frames(const std::vector<zmq::message_t>& frames) {
  std::vector<zmq::message_t> copy(frames.size());
  for (size_t f = 0; f < frames.size(); ++f) copy[f].copy(const_cast<zmq::message_t&>(frames[f]));  // shares large buffers
  return copy;
}
}  // namespace

uint64_t Node::next_oseq(const std::string& addr) {
  std::lock_guard<std::mutex> g(oseq_mu_);
  return ++oseq_out_[addr];
}

// A number whose message never left is taken back when no later one was handed out meanwhile
// (the destination never knew of it); else the destination hears it will not come. Either way
// its next messages are not held for it.
void Node::unsent_oseqs(const std::vector<CastTarget>& targets) {
  std::vector<CastTarget> lost;
  {
    std::lock_guard<std::mutex> g(oseq_mu_);
    for (auto& t : targets) {
      if (!t.oseq) continue;
      auto it = oseq_out_.find(t.addr);
      if (it != oseq_out_.end() && it->second == t.oseq)
        --it->second;
      else
        lost.push_back(t);
    }
  }
  if (!lost.empty()) tell_lost(lost, id());
}

bool Node::mine(const std::string& a) const { return a == addr() || (!a.empty() && a == transport_.tcp_addr()); }

// A target of this node's host is reached at its unix socket (over shared memory), not through
// its host agent's TCP port.
std::string Node::hop_addr(const CastTarget& t) const {
  if (!t.local.empty() && t.local.rfind("ipc://", 0) == 0 && !cast_host(t.addr).empty() &&
      cast_host(t.addr) == cast_host(addr()))
    return t.local;
  return t.addr;
}

// ---- the origin ------------------------------------------------------------------------------
// The live targets with their order numbers, split into those sent one message each and those
// reached through a tree: targets on other hosts, when there are more than the fan-out (procs on
// this host are reached as cheaply from here as from a relay, unless XMESH_CAST_TREE=all).
void Node::split_cast(const std::vector<Target>& targets, const std::vector<std::string>& addrs,
                      const std::vector<bool>& dead, bool ordered, std::vector<CastTarget>& direct,
                      std::vector<CastTarget>& tree) {
  const size_t fanout = cast_fanout_.load();
  const bool local_too = cast_local_.load();
  for (size_t i = 0; i < targets.size(); ++i) {
    if (dead[i]) continue;
    CastTarget t{addrs[i], targets[i].actor, static_cast<int64_t>(i), ordered ? next_oseq(addrs[i]) : 0,
                 transport_.unix_alias(addrs[i])};
    bool treeable = ordered && fanout >= 2 && (local_too || !cast_host(t.addr).empty());
    (treeable ? tree : direct).push_back(std::move(t));
  }
  if (tree.size() <= fanout) {  // few enough: one message each
    direct.insert(direct.end(), std::make_move_iterator(tree.begin()), std::make_move_iterator(tree.end()));
    tree.clear();
  }
}

void Node::send_direct(Call& c, const CastTarget& t, const Header& tmpl, const std::vector<zmq::message_t>& frames) {
  Header h = tmpl;
  h.index = t.index;
  h.actor = t.actor;
  h.oseq = t.oseq;
  auto copy = copy_frames(frames);
  try {
    transport_.send(t.addr, h, copy, may_block());
  } catch (const SendError& e) {
    CallResult r;
    r.index = t.index;
    r.body = error_body(ErrorKind::Send, e.what());
    c.deliver(std::move(r));
    if (!t.oseq) return;  // the destination need not wait for this number
    if (e.maybe_sent)
      tell_lost({t}, id());
    else
      unsent_oseqs({t});
  }
}

void Node::send_tree(const std::shared_ptr<Call>& c, const std::vector<CastTarget>& live, const Header& base,
                     const std::vector<zmq::message_t>& frames, size_t fanout) {
  for (auto& hop : cast_hops(live, fanout)) {
    const CastTarget& to = live[hop.first];
    std::vector<CastTarget> all = hop.behind;
    all.insert(all.begin(), to);
    CastBody cast;
    cast.fanout = static_cast<int64_t>(fanout);
    cast.behind = std::move(hop.behind);
    send_hop(base, frames, to, std::move(cast), [this, c, all](const std::string& why) {
      for (auto& t : all) {
        CallResult r;
        r.index = t.index;
        r.body = error_body(ErrorKind::Send, "not sent: " + why);
        c->deliver(std::move(r));
      }
      tell_lost(all, id());
      if (c->done()) forget_call(c->id());
    });
  }
}

void Node::send_hop(const Header& base, const std::vector<zmq::message_t>& frames, const CastTarget& to, CastBody cast,
                    std::function<void(const std::string&)> failed) {
  Header h = base;
  h.index = to.index;
  h.actor = to.actor;
  h.oseq = to.oseq;
  if (!cast.behind.empty() || cast.origin) {
    if (!h.body.is_object()) h.body = json::object();
    h.body["cast"] = cast;
  }
  send_or_defer(hop_addr(to), std::move(h), frames, std::move(failed));
}

void Node::send_or_defer(const std::string& addr, Header h, const std::vector<zmq::message_t>& frames,
                         std::function<void(const std::string&)> failed, bool try_now) {
  if (stopping_) {  // no relay thread is started (or left) to send it
    failed("this process's xmesh node has stopped");
    return;
  }
  if (try_now && !deferred_.busy(addr)) {
    Header attempt = h;
    try {
      send(addr, std::move(attempt), copy_frames(frames));
      return;
    } catch (const SendError& e) {
      if (!e.would_block) {
        failed(e.what());
        return;
      }
    }
  }
  {
    std::lock_guard<std::mutex> g(relay_start_mu_);  // stop() joins under it: never a thread started after
    if (stopping_) {
      failed("this process's xmesh node has stopped");
      return;
    }
    if (!relay_.joinable())
      relay_ = runtime_thread([this] {
        pthread_setname_np(pthread_self(), "xmesh-relay");
        relay_loop();
      });
  }
  deferred_.push(DeferredSends::Send{addr, std::move(h), copy_frames(frames), std::move(failed)});
}

void Node::relay_loop() {
  while (!stopping_) {
    auto s = deferred_.pop(200);
    if (!s) continue;
    try {
      send(s->addr, std::move(s->header), std::move(s->frames));  // this thread may wait
    } catch (const SendError& e) {
      s->failed(e.what());
    }
    deferred_.done(s->addr);
  }
}

void Node::tell_lost(const std::vector<CastTarget>& targets, const std::string& origin_id) {
  std::map<std::string, std::vector<uint64_t>> by_addr;
  for (auto& t : targets)
    if (t.oseq) by_addr[t.addr].push_back(t.oseq);
  for (auto& [addr, oseqs] : by_addr) {
    if (supervision_.is_dead(addr)) continue;
    Header h;
    h.kind = Kind::CastLost;
    CastLostBody body;
    body.oseqs = std::move(oseqs);
    if (origin_id != id()) body.origin_id = origin_id;
    h.body = body;
    // By the xmesh-relay thread: the caller, whose send to addr may just have waited out the
    // send timeout, never waits for this one too. If it cannot go, the gap's wait expires.
    send_or_defer(addr, std::move(h), {}, [](const std::string&) {}, /*try_now=*/false);
  }
}

// ---- a relay ---------------------------------------------------------------------------------
bool Node::take_cast(Message& m) {
  auto it = m.header.body.find("cast");
  std::string why;
  auto cast = read_as<CastBody>(*it, &why);
  m.header.body.erase(it);
  if (m.header.body.empty()) m.header.body = json();
  if (!cast) {  // answered where it came from, so that a caller there does not wait for it
    transport_.count_malformed("dropped a malformed cast-tree message from " + m.sender_addr + ": " + why);
    reply(m, false, error_body(ErrorKind::Send, "not delivered: its cast-tree part does not read: " + why), {});
    return false;
  }
  const std::string upstream = m.sender_addr;
  const std::string origin = cast->origin.value_or(upstream);
  const std::string origin_id = cast->origin_id.value_or(m.header.sender);
  if (m.header.corr) gathers_.open(origin, m.header.corr, upstream, 1 + cast->behind.size());
  if (!cast->behind.empty()) relay_cast(m, *cast, origin, origin_id);
  m.sender_addr = origin;  // to its actor the message is the origin's (ports, faults, refusals)
  m.header.sender = origin_id;
  m.gathered = m.header.corr != 0;
  return true;
}

void Node::relay_cast(const Message& m, const CastBody& cast, const std::string& origin, const std::string& origin_id) {
  Header base = m.header;  // its body without the cast part
  base.pieces.clear();
  const uint64_t corr = m.header.corr;
  for (auto& hop : cast_hops(cast.behind, static_cast<size_t>(cast.fanout))) {
    const CastTarget& to = cast.behind[hop.first];
    std::vector<CastTarget> all = hop.behind;
    all.insert(all.begin(), to);
    CastBody sub;
    sub.origin = origin;
    sub.origin_id = origin_id;
    sub.fanout = cast.fanout;
    sub.behind = std::move(hop.behind);
    send_hop(base, m.frames, to, std::move(sub), [this, origin, origin_id, corr, all](const std::string& why) {
      fail_at_relay(origin, origin_id, corr, all, why);
    });
    ++relayed_;
  }
}

void Node::fail_at_relay(const std::string& origin, const std::string& origin_id, uint64_t corr,
                         const std::vector<CastTarget>& targets, const std::string& why) {
  log_diag_limited(order_log_, role(), "a cast-tree relay could not forward to " + targets.front().addr + ": " + why);
  if (corr) {
    for (auto& t : targets) {
      CallResult r;
      r.index = t.index;
      r.body = error_body(ErrorKind::Send, "not sent: the relay " + addr() + " could not forward it: " + why);
      if (gathers_.add(origin, corr, r)) continue;
      std::vector<CallResult> one;
      one.push_back(std::move(r));
      send_replies(origin, origin, corr, std::move(one));
    }
    flush_gathers();
  }
  tell_lost(targets, origin_id);
}

void Node::relayed_lost(const std::string& to, const Header& h, const std::string& why) {
  auto it = h.body.is_object() ? h.body.find("cast") : h.body.end();
  if (it == h.body.end()) return;
  auto cast = read_as<CastBody>(*it, nullptr);
  if (!cast || !cast->origin || !cast->origin_id) return;  // relayed messages name both (relay_cast)
  CastTarget hop;
  hop.addr = to;
  hop.actor = h.actor;
  hop.index = h.index;
  hop.oseq = h.oseq;
  std::vector<CastTarget> targets{hop};
  targets.insert(targets.end(), cast->behind.begin(), cast->behind.end());
  fail_at_relay(*cast->origin, *cast->origin_id, h.corr, targets, why);
}

// Answers coming up a tree: to a gather here, or (this node's own call) to the Call.
void Node::on_replies(Message& m) {
  std::string origin, why;
  auto results = read_replies(m, &origin, &why);
  if (!results) {
    transport_.count_malformed("dropped a malformed 'replies' message from " + m.sender_addr + ": " + why);
    return;
  }
  const uint64_t corr = m.header.corr;
  if (mine(origin)) {
    auto c = calls_.find(corr);
    if (!c) return;  // a forgotten call
    for (auto& r : *results) c->deliver(std::move(r));
    if (c->done()) forget_call(c->id());
    return;
  }
  std::vector<CallResult> stray;  // for a gather no longer here: to the origin itself
  for (auto& r : *results)
    if (!gathers_.add(origin, corr, r)) stray.push_back(std::move(r));
  if (!stray.empty()) send_replies(origin, origin, corr, std::move(stray));
}

void Node::send_replies(const std::string& to, const std::string& origin, uint64_t corr,
                        std::vector<CallResult> results) {
  std::vector<zmq::message_t> frames;
  Header h = replies_header(origin, corr, results, frames);
  auto lost = [this, origin](const std::string& why) {
    log_diag_limited(order_log_, role(), "answers for a call of " + origin + " were lost: " + why);
  };
  if (to == origin) {
    send_or_defer(to, std::move(h), frames, lost);
    return;
  }
  // Up the tree; around a relay that died, to the origin itself.
  auto kept = std::make_shared<std::vector<zmq::message_t>>(copy_frames(frames));
  Header again = h;
  send_or_defer(to, std::move(h), frames, [this, origin, kept, again, lost](const std::string&) {
    send_or_defer(origin, again, *kept, lost);
  });
}

void Node::flush_gathers() {
  if (!gathers_.dirty()) return;
  // Batches within a wire frame and the message limit: answers that each fit never add up past it.
  const size_t cap = std::min(kWireFrameBytes, transport_.max_message_bytes());
  for (auto& b : gathers_.take())
    for (auto& batch : split_batches(std::move(b.results), cap)) send_replies(b.to, b.origin, b.corr, std::move(batch));
}

// ---- order -----------------------------------------------------------------------------------
void Node::on_cast_lost(Message& m) {
  CastLostBody lost;
  if (!typed_body(m, lost)) return;
  dispatch_released([&] { return order_gate_.skip(lost.origin_id.value_or(m.header.sender), lost.oseqs, lost.through); });
}

void Node::expire_order_waits() {
  std::vector<std::string> gaps;
  dispatch_released([&] { return order_gate_.expire(now_ms(), &gaps); });
  for (auto& g : gaps)
    log_diag_limited(order_log_, role(), "stopped waiting for earlier messages (XMESH_ORDER_WAIT_MS) from " + g);
}

}  // namespace xmesh
