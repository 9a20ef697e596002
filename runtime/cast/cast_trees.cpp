#include "cast_trees.hpp"
#include "node_bodies.hpp"

#include <algorithm>
#include <stdexcept>

namespace xmesh {

CastTrees& CastTrees::attach(Node& node) {
  return node.attach_part<CastTrees>([&node](CastTrees& trees) {
    node.on(Kind::Replies, [&trees](Message& m) { trees.on_replies(m); });
    trees.host_ = &node.set_router(trees);
  });
}

CastTrees& CastTrees::of(Node& node) { return node.required_part<CastTrees>("cast trees", "CastTrees::attach it"); }

CastTrees::CastTrees(Node& node) : node_(node) {
  fanout_ = static_cast<size_t>(std::max<int64_t>(0, env_int("XMESH_CAST_FANOUT", 16)));
  const std::string tree_mode = env_str("XMESH_CAST_TREE", "hosts");
  if (tree_mode != "hosts" && tree_mode != "all" && tree_mode != "off")
    log_diag(node.role(), "XMESH_CAST_TREE=" + tree_mode + " is not one of hosts, all, off: hosts is used");
  if (tree_mode == "off") fanout_ = 0;
  local_ = tree_mode == "all";
}

std::string CastTrees::hop_addr(const CastTarget& t) const {
  if (!t.local.empty() && t.local.rfind("ipc://", 0) == 0 && !cast_host(t.addr).empty() &&
      cast_host(t.addr) == cast_host(node_.addr()))
    return t.local;
  return t.addr;
}

// ---- the origin ------------------------------------------------------------------------------
// The targets reached through a tree: those on other hosts, when there are more than the fan-out
// (procs on this host are reached as cheaply from here as from a relay, unless local()).
CallRouter::Route CastTrees::plan(std::vector<CastTarget>& targets) {
  Route route;
  const size_t fanout = fanout_.load();
  if (fanout < 2 || targets.size() <= fanout) return route;
  const bool local_too = local_.load();
  auto treeable = [&](const CastTarget& t) { return local_too || !cast_host(t.addr).empty(); };
  const size_t n = static_cast<size_t>(std::count_if(targets.begin(), targets.end(), treeable));
  if (n <= fanout) return route;  // few enough: one message each
  // Moved, not copied: a call to thousands of actors does not copy their addresses again.
  std::vector<CastTarget> direct;
  direct.reserve(targets.size() - n);
  route.targets.reserve(n);
  for (auto& t : targets) (treeable(t) ? route.targets : direct).push_back(std::move(t));
  targets = std::move(direct);
  route.relay_of = cast_parents(route.targets, fanout);
  route.fanout = fanout;
  return route;
}

void CastTrees::send(const std::shared_ptr<Call>& c, const Route& route, const Header& base,
                     const std::vector<zmq::message_t>& frames) {
  const auto& live = route.targets;
  for (auto& hop : cast_hops(live, route.fanout)) {
    const CastTarget& to = live[hop.first];
    std::vector<CastTarget> all = hop.behind;
    all.insert(all.begin(), to);
    CastBody cast;
    cast.fanout = static_cast<int64_t>(route.fanout);
    cast.behind = std::move(hop.behind);
    send_hop(base, frames, to, std::move(cast), [this, c, all](const std::string& why) {
      for (auto& t : all) {
        CallResult r;
        r.index = t.index;
        r.body = error_body(ErrorKind::Send, "not sent: " + why);
        c->deliver(std::move(r));
      }
      host_->tell_lost(all, node_.id());
      if (c->done()) node_.forget_call(c->id());
    });
  }
}

void CastTrees::send_hop(const Header& base, const std::vector<zmq::message_t>& frames, const CastTarget& to,
                         CastBody cast, std::function<void(const std::string&)> failed) {
  Header h = base;
  h.index = to.index;
  h.actor = to.actor;
  h.oseq = to.oseq;
  if (!cast.behind.empty() || cast.origin) {
    if (!h.body.is_object()) h.body = json::object();
    h.body["cast"] = cast;
  }
  host_->send_or_defer(hop_addr(to), std::move(h), frames, std::move(failed));
}

// ---- a relay ---------------------------------------------------------------------------------
bool CastTrees::take(Message& m) {
  auto it = m.header.body.find("cast");
  std::string why;
  auto cast = read_as<CastBody>(*it, &why);
  m.header.body.erase(it);
  if (m.header.body.empty()) m.header.body = json();
  if (!cast) {  // answered where it came from, so that a caller there does not wait for it
    node_.transport().count_malformed("dropped a malformed cast-tree message from " + m.sender_addr + ": " + why);
    node_.reply(m, false, error_body(ErrorKind::Send, "not delivered: its cast-tree part does not read: " + why), {});
    return false;
  }
  const std::string upstream = m.sender_addr;
  const std::string origin = cast->origin.value_or(upstream);
  const std::string origin_id = cast->origin_id.value_or(m.header.sender);
  if (m.header.corr) gathers_.open(origin, m.header.corr, upstream, 1 + cast->behind.size());
  if (!cast->behind.empty()) relay(m, *cast, origin, origin_id);
  m.sender_addr = origin;  // to its actor the message is the origin's (ports, faults, refusals)
  m.header.sender = origin_id;
  m.gathered = m.header.corr != 0;
  return true;
}

void CastTrees::relay(const Message& m, const CastBody& cast, const std::string& origin, const std::string& origin_id) {
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

void CastTrees::fail_at_relay(const std::string& origin, const std::string& origin_id, uint64_t corr,
                              const std::vector<CastTarget>& targets, const std::string& why) {
  log_diag_limited(log_, node_.role(), "a cast-tree relay could not forward to " + targets.front().addr + ": " + why);
  if (corr) {
    for (auto& t : targets) {
      CallResult r;
      r.index = t.index;
      r.body = error_body(ErrorKind::Send, "not sent: the relay " + node_.addr() + " could not forward it: " + why);
      if (gathers_.add(origin, corr, r)) continue;
      std::vector<CallResult> one;
      one.push_back(std::move(r));
      send_replies(origin, origin, corr, std::move(one));
    }
    flush();
  }
  host_->tell_lost(targets, origin_id);
}

void CastTrees::relayed_lost(const std::string& to, const Header& h, const std::string& why) {
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

void CastTrees::on_replies(Message& m) {
  std::string origin, why;
  auto results = read_replies(m, &origin, &why);
  if (!results) {
    node_.transport().count_malformed("dropped a malformed 'replies' message from " + m.sender_addr + ": " + why);
    return;
  }
  const uint64_t corr = m.header.corr;
  if (host_->mine(origin)) {
    host_->deliver(corr, std::move(*results));
    return;
  }
  std::vector<CallResult> stray;  // for a gather no longer here: to the origin itself
  for (auto& r : *results)
    if (!gathers_.add(origin, corr, r)) stray.push_back(std::move(r));
  if (!stray.empty()) send_replies(origin, origin, corr, std::move(stray));
}

void CastTrees::send_replies(const std::string& to, const std::string& origin, uint64_t corr,
                             std::vector<CallResult> results) {
  std::vector<zmq::message_t> frames;
  Header h = replies_header(origin, corr, results, frames);
  auto lost = [this, origin](const std::string& why) {
    log_diag_limited(log_, node_.role(), "answers for a call of " + origin + " were lost: " + why);
  };
  if (to == origin) {
    host_->send_or_defer(to, std::move(h), frames, lost);
    return;
  }
  // Up the tree; around a relay that died, to the origin itself.
  auto kept = std::make_shared<std::vector<zmq::message_t>>(copy_frames(frames));
  Header again = h;
  host_->send_or_defer(to, std::move(h), frames, [this, origin, kept, again, lost](const std::string&) {
    host_->send_or_defer(origin, again, *kept, lost);
  });
}

void CastTrees::flush() {
  if (!gathers_.dirty()) return;
  // Batches within a wire frame and the message limit: answers that each fit never add up past it.
  const size_t cap = std::min(kWireFrameBytes, node_.transport().self().max_message_bytes);
  for (auto& b : gathers_.take())
    for (auto& batch : split_batches(std::move(b.results), cap)) send_replies(b.to, b.origin, b.corr, std::move(batch));
}

bool CastTrees::carry_reply(const Message& call_msg, CallResult& r) {
  if (!gathers_.add(call_msg.sender_addr, call_msg.header.corr, r)) return false;
  flush();
  return true;
}

}  // namespace xmesh
