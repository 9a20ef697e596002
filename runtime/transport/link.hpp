// Links: the faster paths a node's messages to one peer move to once they are up, beside the
// ZeroMQ connection every peer has. Two implementations: a shared-memory ring to a node of this
// host (ring_links.hpp) and a TCP lane to a node of another host (tcp_lane.hpp); the transport
// tries them in that order and the first that reaches the peer is used.
//
// Every link kind goes through one upgrade, driven by LinkUpgrade (the writer's side, one per
// out peer and kind) and three messages over ZeroMQ:
//   1. after its first Call or Reply over ZeroMQ to a peer, the writer proposes a link
//      (RingOffer: the ring it made; LaneAsk: nothing yet);
//   2. the reader answers (RingAccept: its doorbell; LaneOffer: a listener and a secret), or
//      says why not: the link is declined for this peer;
//   3. once the link is ready (a ring accepted, a lane connected) the writer's next message is
//      the switch (RingSwitch / LaneSwitch), its last over ZeroMQ; the reader reads the link only
//      once it dispatched the switch, so every message before it is dispatched first:
//      per-sender order holds across the switch.
// A link that breaks is given up and the upgrade starts again on the next Call or Reply; after
// `breaks_allowed` breaks to one peer, ZeroMQ alone carries its messages.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "wire.hpp"

namespace xmesh {

// What one write on a link came to.
enum class LinkWrite {
  ok,           // written (on a numbered link: the link's now, kept until acknowledged)
  would_block,  // nothing of it written: the link is full and the sender does not wait
  timed_out,    // the link stayed full for the send timeout (a numbered link: written, late)
  closed,       // its reader closed it (it stops, or found garbage and says so): not written
  broken,       // it broke (a reset connection, positions that do not add up)
};

// What differs between link kinds besides their implementation.
struct LinkSpec {
  const char* name;              // in messages: "shared-memory link", "TCP lane"
  Kind propose, answer, take;    // its three messages: the proposal, the answer, the switch
  int breaks_allowed;            // links to one peer that may break before ZeroMQ alone
  // Its messages are numbered in the ZeroMQ connection's stream and kept until acknowledged:
  // when it breaks they go again over ZeroMQ, nothing lost. Otherwise (a ring) the link loses
  // and repeats nothing while it is up, and what a break lost is the node's to handle.
  bool numbered;
};

// One link's writing end (one destination). Used under its out peer's lock only, except
// interrupt().
class LinkWriter {
 public:
  virtual ~LinkWriter() = default;
  // Armed (its reader said yes): whether the switch may be sent now. A link that will never
  // come up (a lane whose connection failed) says why in *failed.
  virtual bool ready(std::string* failed) = 0;
  // One message. blocking=false: all or nothing, now. wake: the reader's sleepers the message
  // is for (a ring's doorbell bits; a lane ignores it).
  virtual LinkWrite write(const std::vector<uint8_t>& header, const std::vector<zmq::message_t>& frames,
                          bool blocking, int timeout_ms, uint32_t wake) = 0;
  // A message of this node's own (not relayed) or relayed, written: what a break must account for.
  virtual void wrote(const Header&) {}
  // The I/O thread's tick on an active link: bytes still pending go out. False when the link
  // broke or its reader closed it (*why; *by_reader: closed from the other end, said quietly).
  virtual bool tend(std::string* why, bool* by_reader) {
    (void)why;
    (void)by_reader;
    return true;
  }
  virtual std::string error() const = 0;  // why it broke, in words
  virtual uint64_t token() const { return 0; }  // its name in messages about it (a ring's random token)
  // armed -> active: the switch went (the writer's own state follows).
  virtual void switched() {}
  virtual void close() = 0;               // given up: nothing more is written on it
  // From any thread, without the peer's lock: a writer waiting for room in write() stops
  // waiting (a dead peer). A link whose waits end on their own anyway does nothing.
  virtual void interrupt() {}
};

// The writer's upgrade of one out peer to one link kind: the state machine above. Not
// thread-safe (its out peer's lock), except up() and writer_for_interrupt().
class LinkUpgrade {
 public:
  enum class State {
    idle,      // none: proposed after the next Call or Reply over ZeroMQ
    proposed,  // the proposal went; waiting for the answer
    armed,     // the reader said yes: the switch goes once the link is ready
    active,    // the switch went: messages go over the link
    declined,  // not to this peer (not applicable, refused, or broke too often): ZeroMQ alone
  };
  explicit LinkUpgrade(const LinkSpec& spec) : spec_(&spec) {}
  LinkUpgrade(const LinkUpgrade&) = delete;
  LinkUpgrade& operator=(const LinkUpgrade&) = delete;

  const LinkSpec& spec() const { return *spec_; }
  State state() const { return state_; }
  // Whether a message of kind `sent` that went over ZeroMQ calls for a proposal now.
  bool due(Kind sent) const;
  // idle -> proposed. `made`: the writer made with the proposal (a ring), or null (a lane,
  // made when the answer comes).
  void proposed(std::shared_ptr<LinkWriter> made);
  // proposed -> armed with the writer the answer gave (or the one made with the proposal).
  void armed(std::shared_ptr<LinkWriter> writer);
  void declined();  // -> declined, its writer (if any) closed
  void switched();  // armed -> active
  // The link is given up (it broke, its reader closed it, its proposal could not be sent): its
  // writer closed and returned; idle again, or declined once `breaks_allowed` links broke.
  // count_break=false: a proposal that did not go (no link was up).
  std::shared_ptr<LinkWriter> give_up(bool count_break);
  void close();  // the peer's connection closes: the writer too

  LinkWriter* writer() const { return writer_.get(); }
  const std::shared_ptr<LinkWriter>& made() const { return writer_; }  // to hand to its kind's answered()
  int breaks() const { return breaks_; }
  bool up() const { return up_.load(std::memory_order_relaxed); }  // active: any thread (stats)
  // The writer, from any thread (a dead peer's sender waiting in it is interrupted).
  std::shared_ptr<LinkWriter> writer_for_interrupt() const { return std::atomic_load(&shared_); }

 private:
  void set_writer(std::shared_ptr<LinkWriter> w);
  const LinkSpec* spec_;
  State state_ = State::idle;
  int breaks_ = 0;
  std::shared_ptr<LinkWriter> writer_;
  std::shared_ptr<LinkWriter> shared_;  // the same, read with atomic access
  std::atomic<bool> up_{false};
};

const char* link_state_name(LinkUpgrade::State s);

// One kind of link, both of its ends, as the transport drives it (transport_links.cpp): what
// a ring or a lane does at each step of the upgrade.
class LinkKind {
 public:
  virtual ~LinkKind() = default;
  virtual const LinkSpec& spec() const = 0;
  // Writer: whether this node makes such links to the peer at addr at all (resends: its
  // ZeroMQ connection keeps messages until acknowledged, a TCP one).
  virtual bool reaches(const std::string& addr, bool resends) const = 0;
  // Writer: the proposal's body, and the writer made with it (a ring) or null (a lane: made
  // from the answer). Throws std::exception naming why no link can be made.
  virtual std::shared_ptr<LinkWriter> propose(json* body) = 0;
  // Writer: the reader's (at `from`) answer. The writer to arm (`made`, or one the answer gave);
  // null with *why: declined; null without: an answer to another proposal, ignored.
  virtual std::shared_ptr<LinkWriter> answered(const std::string& from, const std::shared_ptr<LinkWriter>& made,
                                               const json& answer, std::string* why) = 0;
  // Reader: the answer to a proposal from `from`. Throws std::invalid_argument when the
  // proposal does not read.
  virtual json answer(const std::string& from, const json& proposal) = 0;
  // Reader: that answer could not be sent (the proposer never hears of it).
  virtual void answer_lost(const std::string& from, const json& answer) {
    (void)from;
    (void)answer;
  }
  // Reader: the switch from `from` (its connection `identity`) was dispatched: read its link.
  virtual void take(const std::string& from, const std::string& identity) = 0;
};

// A message that carries a call or its answer: what makes a link worth proposing.
inline bool carries_calls(Kind k) { return k == Kind::Call || k == Kind::Reply || k == Kind::Replies; }

}  // namespace xmesh
