// The node's side of per-origin order (order.hpp has the design): the origin numbers its actor
// messages and sends them (directly here; through its router, runtime/cast/, past the fan-out);
// what cannot be sent at once on a thread that must not wait goes to the xmesh-relay thread;
// numbers that will not come are told (CastLost); a destination takes each origin's messages in
// order.
#include "node.hpp"
#include "util.hpp"
#include "node_bodies.hpp"

namespace xmesh {


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

std::vector<CastTarget> Node::number_targets(const std::vector<Target>& targets, const std::vector<std::string>& addrs,
                                             const std::vector<bool>& dead, bool ordered) {
  std::vector<CastTarget> live;
  live.reserve(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    if (dead[i]) continue;
    live.push_back(CastTarget{addrs[i], targets[i].actor, static_cast<int64_t>(i), ordered ? next_oseq(addrs[i]) : 0,
                              transport_.unix_alias(addrs[i])});
  }
  return live;
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
