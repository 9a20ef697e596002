// The transport's shared-memory links (ring_links.hpp): when it offers one, how it answers an
// offer, and how a message goes over a link once it is up. The protocol is described there.
#include "transport.hpp"
#include "util.hpp"
#include "wait_feed.hpp"

namespace xmesh {

namespace {
bool on_this_host(const std::string& addr) { return addr.rfind("ipc://", 0) == 0; }
// Which of the reader's sleepers a message is for: answers for a thread waiting on its call,
// calls for an idle actor thread (never a caller), the rest for whoever sleeps.
uint32_t wake_bits_for(Kind kind) {
  switch (kind) {
    case Kind::Reply:
    case Kind::Replies:
      return WaitFeed::kCallerBit;
    case Kind::Call:
      return Doorbell::kAnyIdle & ~WaitFeed::kCallerBit;
    default:
      return Doorbell::kAnyIdle;
  }
}
}  // namespace

void Transport::enable_rings(size_t ring_bytes) {
  ring_bytes_ = ring_bytes;
  rings_.enable();
}

void Transport::offer_ring_locked(OutPeer& p, Kind sent, bool blocking) {
  if (!rings_.enabled() || (sent != Kind::Call && sent != Kind::Reply && sent != Kind::Replies) || !on_this_host(p.addr)) return;
  p.ring_tried = true;
  try {
    p.ring = std::make_shared<RingWriter>(ring_bytes_);
    std::atomic_store(&p.ring_closer, p.ring);
  } catch (const std::exception& e) {
    log_diag_limited(ring_log_, role_, "no shared-memory link to " + p.addr + " (ZeroMQ goes on): " + e.what());
    return;
  }
  RingOfferBody body = p.ring->offer();
  body.max_message_bytes = max_message_bytes_;
  try {
    send_link_message_locked(p, Kind::RingOffer, body, blocking);
  } catch (const SendError&) {
    drop_ring_locked(p);  // the message itself went: the link is only not offered
  }
}

void Transport::drop_ring_locked(OutPeer& p) {
  std::atomic_store(&p.ring_closer, std::shared_ptr<RingWriter>());
  p.ring.reset();
}

void Transport::on_ring_offer(const std::string& from, const RingOfferBody& offer) {
  RingAcceptBody answer;
  if (!on_this_host(from)) {
    answer.token = offer.token;
    answer.reason = "a shared-memory ring is for a node of this host (" + from + " is not at a unix socket)";
  } else {
    answer = rings_.take_offer(from, offer);
  }
  Header h;
  h.kind = Kind::RingAccept;
  h.body = answer;
  std::vector<zmq::message_t> none;
  try {
    send(from, h, none, /*blocking=*/false);
  } catch (const SendError&) {
    if (answer.ok) rings_.drop(from);  // the offerer never hears: its ring is not read
  }
}

void Transport::on_ring_accept(const std::string& from, const RingAcceptBody& answer) {
  auto p = existing_out_peer(from);
  if (!p) return;
  std::lock_guard<std::mutex> g(p->mu);
  if (!p->ring) return;
  std::string why;
  p->ring->answered(answer, &why);
  if (p->ring->state() == RingWriter::State::declined) {
    log_diag_limited(ring_log_, role_, "no shared-memory link to " + from + " (ZeroMQ goes on): " + why);
    drop_ring_locked(*p);
  }
}

bool Transport::ring_send_locked(OutPeer& p, Header& h, std::vector<zmq::message_t>& frames, bool blocking) {
  if (!p.ring) return false;
  if (p.ring->state() == RingWriter::State::switch_due) {
    // The last message over ZeroMQ: the reader reads the ring once it dispatched this.
    send_link_message_locked(p, Kind::RingSwitch, nullptr, blocking);  // SendError: the switch is still due
    p.ring->switched();
  }
  if (p.ring->state() != RingWriter::State::active) return false;
  h.seq = 0;  // a ring neither loses nor repeats: no numbers to check
  h.pieces.clear();
  auto header = encode_header(h);
  const uint32_t wake = wake_bits_for(h.kind);
  auto r = p.ring->write(header, frames, false, 0, wake);
  if (r == ShmRing::Result::full && blocking) {  // it waits for the reader: not awake meanwhile
    AwakeOnFeed::Pause pause;
    r = p.ring->write(header, frames, true, static_cast<int>(send_timeout_ms_), wake);
  }
  switch (r) {
    case ShmRing::Result::ok:
      ++counts_.sent;
      ++counts_.ring_sent;
      return true;
    case ShmRing::Result::full:
      throw SendError("the link to " + p.addr + " is full (this thread does not wait)", false, true);
    case ShmRing::Result::timed_out:
      throw SendError("sending to " + p.addr + " timed out after " + std::to_string(send_timeout_ms_) +
                      " ms (XMESH_SEND_TIMEOUT_MS): its ring stayed full, so its actor's queue is full "
                      "(XMESH_INBOX_LIMIT) or it reads nothing");
    default:
      throw SendError("the link to " + p.addr + " is closed");
  }
}

}  // namespace xmesh
