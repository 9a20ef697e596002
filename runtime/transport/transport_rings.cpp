// The transport's shared-memory links (ring_links.hpp): when it offers one, how it answers an
// offer, and how a message goes over a link once it is up. The protocol is described there.
#include "transport.hpp"

#include <utility>
#include "util.hpp"
#include "wait_feed.hpp"

namespace xmesh {

namespace {
constexpr int kRingBreaksAllowed = 3;  // links to one peer that may break before ZeroMQ alone carries its messages
bool on_this_host(const std::string& addr) { return addr.rfind("ipc://", 0) == 0; }
// Which of the reader's sleepers a message is for: answers for a thread waiting on its call,
// calls for an idle actor thread (never a caller), the rest for whoever sleeps.
// A cast tree's message forwarded for another origin (its cast part names the origin's id).
bool relayed(const Header& h) {
  if (!h.body.is_object()) return false;
  auto cast = h.body.find("cast");
  return cast != h.body.end() && cast->is_object() && cast->contains("s");
}
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
  p.ring_relayed.clear();
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

bool Transport::ring_send_locked(OutPeer& p, Header& h, std::vector<zmq::message_t>& frames, bool blocking,
                                 RingBreak* broke) {
  if (!p.ring) return false;
  if (p.ring->state() == RingWriter::State::switch_due) {
    // The last message over ZeroMQ: the reader reads the ring once it dispatched this.
    send_link_message_locked(p, Kind::RingSwitch, nullptr, blocking);  // SendError: the switch is still due
    p.ring->switched();
  }
  if (p.ring->state() != RingWriter::State::active) return false;
  h.seq = 0;  // a ring neither loses nor repeats: no numbers to check
  h.pieces.clear();
  auto header = header_for_wire(h);
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
      // This node's own numbers only: a relayed message carries its origin's, which a CastLost
      // for this node's numbers would not name; it is kept until the reader has taken it, so
      // that a break fails it at this relay (telling its targets and its origin).
      if (relayed(h)) {
        keep_relayed_locked(p, h);
      } else if (h.oseq > p.ring_oseq) {
        p.ring_oseq = h.oseq;
      }
      return true;
    case ShmRing::Result::full:
      throw SendError("the link to " + p.addr + " is full (this thread does not wait)", false, true);
    case ShmRing::Result::timed_out:
      throw SendError("sending to " + p.addr + " timed out after " + std::to_string(send_timeout_ms_) +
                      " ms (XMESH_SEND_TIMEOUT_MS): its ring stayed full, so its actor's queue is full "
                      "(XMESH_INBOX_LIMIT) or it reads nothing");
    default:  // closed by its reader, or positions that do not add up: nothing of this message is in it
      *broke = RingBreak{p.addr, p.ring->token(),
                         r == ShmRing::Result::corrupt ? "its positions in shared memory do not add up"
                                                       : "its reader closed it",
                         r != ShmRing::Result::corrupt};
      return false;
  }
}

void Transport::keep_relayed_locked(OutPeer& p, const Header& h) {
  const uint64_t taken = p.ring->taken();
  while (!p.ring_relayed.empty() && p.ring_relayed.front().first <= taken) p.ring_relayed.pop_front();
  p.ring_relayed.emplace_back(p.ring->written(), h);
}

// p's ring is given up: closed, dropped, and the next Call or Reply over ZeroMQ offers a new
// link, a few times at most. Its highest order number; the relayed messages not taken.
uint64_t Transport::give_up_ring_locked(OutPeer& p, std::vector<Header>* relayed_lost) {
  const uint64_t taken = p.ring->taken();  // before the close: positions as the reader left them
  for (auto& [end, h] : p.ring_relayed)
    if (end > taken) relayed_lost->push_back(std::move(h));
  p.ring->close();
  drop_ring_locked(p);
  p.ring_tried = ++p.ring_breaks >= kRingBreaksAllowed;
  return std::exchange(p.ring_oseq, 0);
}

Transport::RingDropped Transport::drop_broken_ring(const std::string& peer, uint64_t token) {
  RingDropped dropped;
  if (auto p = existing_out_peer(peer)) {
    std::lock_guard<std::mutex> g(p->mu);
    if (p->ring && p->ring->token() == token) {
      dropped.writer = true;
      dropped.through_oseq = give_up_ring_locked(*p, &dropped.relayed);
    }
    auto& aside = p->rings_set_aside;
    for (auto it = aside.begin(); it != aside.end(); ++it)
      if (it->token == token) {
        dropped.writer = true;
        dropped.through_oseq = it->ring_oseq;
        dropped.relayed = std::move(it->relayed);
        aside.erase(it);
        break;
      }
  }
  dropped.reader = rings_.forget_broken(peer, token);
  return dropped;
}

void Transport::set_closed_ring_aside(const std::string& peer, uint64_t token) {
  auto p = existing_out_peer(peer);
  if (!p) return;
  std::lock_guard<std::mutex> g(p->mu);
  if (!p->ring || p->ring->token() != token) return;
  OutPeer::RingAside aside;
  aside.token = token;
  aside.ring_oseq = give_up_ring_locked(*p, &aside.relayed);
  p->rings_set_aside.push_back(std::move(aside));
  if (p->rings_set_aside.size() > kRingBreaksAllowed) p->rings_set_aside.pop_front();
}

}  // namespace xmesh
