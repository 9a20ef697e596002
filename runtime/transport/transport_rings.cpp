// The shared-memory ring as a link kind (link.hpp, ring_links.hpp): the writer's end over a
// RingWriter, what the transport proposes and answers for it, and the bookkeeping a ring that
// breaks needs (the order numbers and relayed messages it held), which the node acts on
// (node_ring_breaks.cpp).
#include <utility>

#include "transport.hpp"
#include "util.hpp"
#include "wait_feed.hpp"
#include "link_bodies.hpp"

namespace xmesh {

namespace {
constexpr LinkSpec kRingSpec{"shared-memory link", Kind::RingOffer, Kind::RingAccept, Kind::RingSwitch,
                             /*breaks_allowed=*/3, /*numbered=*/false};

bool on_this_host(const std::string& addr) { return addr.rfind("ipc://", 0) == 0; }

// A cast tree's message forwarded for another origin (its cast part names the origin's id).
bool relayed(const Header& h) {
  if (!h.body.is_object()) return false;
  auto cast = h.body.find("cast");
  return cast != h.body.end() && cast->is_object() && cast->contains("s");
}

// The writer's end of one ring, and what a break of it must account for.
class RingLink final : public LinkWriter {
 public:
  explicit RingLink(size_t capacity) : ring_(capacity) {}
  RingOfferBody offer() const { return ring_.offer(); }
  void answered(const RingAcceptBody& answer, std::string* why) { ring_.answered(answer, why); }
  bool declined() const { return ring_.state() == RingWriter::State::declined; }

  bool ready(std::string*) override { return ring_.state() == RingWriter::State::switch_due; }
  void switched() override { ring_.switched(); }
  LinkWrite write(const std::vector<uint8_t>& header, const std::vector<zmq::message_t>& frames, bool blocking,
                  int timeout_ms, uint32_t wake) override {
    auto r = ring_.write(header, frames, false, 0, wake);
    if (r == ShmRing::Result::full && blocking) {  // it waits for the reader: not awake meanwhile
      AwakeOnFeed::Pause pause;
      r = ring_.write(header, frames, true, timeout_ms, wake);
    }
    switch (r) {
      case ShmRing::Result::ok: return LinkWrite::ok;
      case ShmRing::Result::full: return LinkWrite::would_block;
      case ShmRing::Result::timed_out: return LinkWrite::timed_out;
      case ShmRing::Result::corrupt:
        error_ = "its positions in shared memory do not add up";
        return LinkWrite::broken;
      default: return LinkWrite::closed;
    }
  }
  // This node's own numbers only: a relayed message carries its origin's, which a CastLost for
  // this node's numbers would not name; it is kept until the reader has taken it, so that a
  // break fails it at this relay (telling its targets and its origin).
  void wrote(const Header& h) override {
    if (relayed(h)) {
      const uint64_t taken = ring_.taken();
      while (!relayed_.empty() && relayed_.front().first <= taken) relayed_.pop_front();
      relayed_.emplace_back(ring_.written(), h);
    } else if (h.oseq > oseq_) {
      oseq_ = h.oseq;
    }
  }
  // Before the link is closed (positions as its reader left them): the highest order number
  // written on it, and into *lost the relayed messages its reader had not taken.
  uint64_t account(std::vector<Header>* lost) {
    const uint64_t taken = ring_.taken();
    for (auto& [end, h] : relayed_)
      if (end > taken) lost->push_back(std::move(h));
    relayed_.clear();
    return std::exchange(oseq_, 0);
  }
  std::string error() const override { return error_; }
  uint64_t token() const override { return ring_.token(); }
  void close() override { ring_.close(); }
  void interrupt() override { ring_.close_ring(); }

 private:
  RingWriter ring_;
  uint64_t oseq_ = 0;  // the highest order number written on the ring
  // Messages relayed for another origin written on the ring, with the ring position their
  // records end at, until its reader has taken them (pruned as later ones are written).
  std::deque<std::pair<uint64_t, Header>> relayed_;
  std::string error_;
};
}  // namespace

class Transport::RingKind final : public LinkKind {
 public:
  explicit RingKind(Transport& t) : t_(t) {}
  const LinkSpec& spec() const override { return kRingSpec; }
  bool reaches(const std::string& addr, bool) const override { return t_.rings_.enabled() && on_this_host(addr); }
  std::shared_ptr<LinkWriter> propose(json* body) override {
    auto link = std::make_shared<RingLink>(t_.ring_bytes_);  // throws naming why
    RingOfferBody offer = link->offer();
    offer.max_message_bytes = t_.self_.max_message_bytes;
    *body = offer;
    return link;
  }
  std::shared_ptr<LinkWriter> answered(const std::string&, const std::shared_ptr<LinkWriter>& made, const json& answer,
                                       std::string* why) override {
    auto body = read_as<RingAcceptBody>(answer, why);
    if (!body) {
      *why = "its answer does not read: " + *why;
      return nullptr;
    }
    auto& ring = static_cast<RingLink&>(*made);
    ring.answered(*body, why);
    if (ring.declined()) return nullptr;  // *why says why
    return ring.ready(nullptr) ? made : nullptr;  // else: another ring's answer
  }
  json answer(const std::string& from, const json& proposal) override {
    std::string why;
    auto offer = read_as<RingOfferBody>(proposal, &why);
    if (!offer) throw std::invalid_argument(why);
    if (on_this_host(from)) return t_.rings_.take_offer(from, *offer);
    RingAcceptBody refusal;
    refusal.token = offer->token;
    refusal.reason = "a shared-memory ring is for a node of this host (" + from + " is not at a unix socket)";
    return refusal;
  }
  void answer_lost(const std::string& from, const json& answer) override {
    if (answer.value("ok", false)) t_.rings_.drop(from);  // the offerer never hears: its ring is not read
  }
  void take(const std::string& from, const std::string&) override { t_.rings_.start_reading(from); }

 private:
  Transport& t_;
};

std::unique_ptr<LinkKind> Transport::make_ring_kind() { return std::make_unique<RingKind>(*this); }

// p's ring is given up: its account taken, closed, dropped; the next Call or Reply over ZeroMQ
// offers a new link, a few times at most.
uint64_t Transport::give_up_ring_locked(OutPeer& p, std::vector<Header>* relayed_lost) {
  auto* ring = static_cast<RingLink*>(p.links[kRing].writer());
  const uint64_t through = ring->account(relayed_lost);
  p.links[kRing].give_up(/*count_break=*/true);
  ++counts_.link_breaks[kRing];
  return through;
}

Transport::RingDropped Transport::drop_broken_ring(const std::string& peer, uint64_t token) {
  RingDropped dropped;
  if (auto p = existing_out_peer(peer)) {
    std::lock_guard<std::mutex> g(p->mu);
    const LinkWriter* ring = p->links[kRing].writer();
    if (ring && ring->token() == token) {
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
  const LinkWriter* ring = p->links[kRing].writer();
  if (!ring || ring->token() != token) return;
  OutPeer::RingAside aside;
  aside.token = token;
  aside.ring_oseq = give_up_ring_locked(*p, &aside.relayed);
  p->rings_set_aside.push_back(std::move(aside));
  if (p->rings_set_aside.size() > static_cast<size_t>(kRingSpec.breaks_allowed)) p->rings_set_aside.pop_front();
}

}  // namespace xmesh
