// The node's side of a shared-memory link that breaks (docs/architecture/03-transport-and-links.md, "Links: rings on one host"): a ring whose records or positions do not read, or that its reader closed
// while its writer lives, lost what it held. Nothing waits for that forever: the calls in flight
// between the pair fail naming why, order numbers that will not come are said so, both ends
// forget the link, and messages go on over ZeroMQ until a new link is up.
#include "node.hpp"
#include "util.hpp"
#include "node_bodies.hpp"

namespace xmesh {

namespace {
// Messages whose corr names a call of the sender's own (not an answer to the peer's).
bool asks(Kind k) { return k != Kind::Reply && k != Kind::Replies; }
}  // namespace

bool Node::ring_broke(const std::string& peer, uint64_t token, const std::string& why, BreakFound found,
                      const Header* sending) {
  if (supervision_.is_dead(peer)) return false;
  auto dropped = transport_.drop_broken_ring(peer, token);
  if (found == BreakFound::by_reader) dropped.reader = true;  // the reading pass forgot it already
  if (!dropped.writer && !dropped.reader) return true;        // handled already: the link is gone
  const std::string link = std::string("the shared-memory link ") + (dropped.writer ? "to " : "from ") + peer;
  const std::string text = link + " broke (" + why + "): what was on it is lost, this call's message or answer " +
                           "may have been, so it may or may not have run";
  // The message being sent was not on the ring: its own call goes on (over ZeroMQ).
  const uint64_t spare = sending && sending->corr && asks(sending->kind) ? sending->corr : 0;
  fail_calls_to(peer, error_body(ErrorKind::Send, text), spare);
  if (found != BreakFound::by_peer) {  // before the message being sent, on the same link
    Header h;
    h.kind = Kind::RingBroken;
    h.body = RingBrokenBody{token, why};
    send_or_defer(peer, std::move(h), {}, [](const std::string&) {});
  }
  if (dropped.writer && dropped.through_oseq) {
    Header h;
    h.kind = Kind::CastLost;
    CastLostBody body;
    body.through = dropped.through_oseq;
    h.body = body;
    send_or_defer(peer, std::move(h), {}, [](const std::string&) {});
  }
  // What it held of other origins' messages (this node relaying a cast tree): failed as
  // forwards that could not go, so their targets take the next message at once.
  if (router_)
    for (auto& h : dropped.relayed) router_->relayed_lost(peer, h, link + " broke (" + why + ") with it on the link");
  log_diag_limited(ring_break_log_, role(),
                   link + " broke (" + why + "): the calls in flight between them failed; ZeroMQ carries their "
                   "messages until a new link is up");
  return true;
}

void Node::on_ring_broken(Message& m) {
  RingBrokenBody body;
  if (!typed_body(m, body)) return;
  ring_broke(m.sender_addr, body.token, "its other end found " + (body.why.empty() ? "it broken" : body.why),
             BreakFound::by_peer);
}

}  // namespace xmesh
