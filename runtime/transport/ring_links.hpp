// Ring links: a node's shared-memory paths to nodes of its own host (issue 23; the design in
// docs/architecture/03-transport-and-links.md, "Links: rings on one host"). The transport (transport.hpp) owns
// them: a RingWriter per destination in its OutPeer, one RingReaders for what comes in.
//
// A link carries one direction. Its writer makes a ring (ShmRing, a sealed memfd) and offers
// it in a RingOffer over ZeroMQ: its pid, the fd number and the ring's random token. The reader
// opens /proc/<pid>/fd/<fd> (same user, same host: no broker and no extra socket), checks the
// token and answers RingAccept with its doorbell's fd (or why not: the offer is then declined
// for good and ZeroMQ stays). The writer's next message to it is RingSwitch, its last over
// ZeroMQ; the reader reads the ring only once RingSwitch has been dispatched, so every message
// sent before the switch is dispatched first: per-sender order holds across it.
//
// A message is one record when it fits the ring's largest record, else consecutive records (the
// writer holds its peer's lock for the whole message): an 8-byte total, a 4-byte header length,
// a 4-byte frame count, 8 bytes per frame length, the encoded header, the frames.
#pragma once
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "bodies.hpp"
#include "link_bodies.hpp"
#include "shm_ring.hpp"
#include "spin.hpp"
#include "wire.hpp"

namespace xmesh {

// The writer's end of one link (one destination). Not thread-safe: its OutPeer's lock guards it.
class RingWriter {
 public:
  enum class State { offered, switch_due, active, declined };
  explicit RingWriter(size_t capacity);  // makes the ring; throws naming why it could not

  State state() const { return state_.load(); }  // any thread (stats); changed under the peer's lock
  RingOfferBody offer() const;
  // The reader's answer. Declined (or a doorbell that cannot be opened: said in *why): the link
  // is not used. Accepted: the next message sends RingSwitch first (take_switch()).
  void answered(const RingAcceptBody& answer, std::string* why);
  // switch_due: the caller sends RingSwitch over ZeroMQ, then says switched() and writes here.
  void switched();
  // One message as records. blocking=false: only when the whole message fits now (full
  // otherwise; nothing partial is ever left). blocking: up to timeout_ms for the first record,
  // then as long as the reader reads (a message is never left half-written). wake: the bits of
  // the reader's sleepers the message is for (Doorbell::ring).
  ShmRing::Result write(const std::vector<uint8_t>& header, const std::vector<zmq::message_t>& frames, bool blocking,
                        int timeout_ms, uint32_t wake = Doorbell::kAnyIdle);
  uint64_t token() const { return ring_.token(); }
  // Bytes written on the ring so far, and the position up to which its reader has taken them.
  uint64_t written() const { return ring_.written(); }
  uint64_t taken() const { return ring_.written() - ring_.unread_by_reader(); }
  void close();  // the peer is gone: waits end, the reader reads what came and forgets the ring
  // The ring alone closed, from any thread (a writer waiting in it under its peer's lock ends).
  void close_ring() { ring_.close(); }

 private:
  void ring_bell(uint32_t wake = Doorbell::kAnyIdle);
  ShmRing ring_;
  Doorbell bell_;  // the reader's, rung after each message
  std::atomic<State> state_{State::offered};
};

// The reading side: every ring offered to this node, read by one thread (the node's
// `xmesh-rings`), which sleeps on this node's doorbell when all are empty.
class RingReaders {
 public:
  explicit RingReaders(size_t max_message_bytes);
  ~RingReaders();
  RingReaders(const RingReaders&) = delete;
  RingReaders& operator=(const RingReaders&) = delete;

  // Accepting offers at all (controllers and procs; host agents decline).
  void enable();
  bool enabled() const { return enabled_.load(); }

  // An offer from the node at addr: maps the ring, kept unread until start_reading(addr).
  // Returns the answer to send (ok false naming why). A second offer from addr replaces the first.
  RingAcceptBody take_offer(const std::string& addr, const RingOfferBody& offer);
  // The writer's RingSwitch was dispatched: its ring is read from now on.
  void start_reading(const std::string& addr);
  // addr is gone (dead, a new process there): its ring is read to its end, then forgotten.
  void drop(const std::string& addr);
  // The ring from addr with this token broke (its writer said so): closed and forgotten now,
  // nothing more read from it. True also when it was read to its end after its writer closed
  // it (the writer closes a ring it found broken before it says so). False when no such ring is
  // known: this node found the break itself and handled it.
  bool forget_broken(const std::string& addr, uint64_t token);
  void close_all();

  // What a poll found besides the messages it delivered.
  struct Report {
    bool held = false;                 // a message waits for its actor's room (see poll)
    // Rings closed because their records or positions do not read: whatever was in them is lost.
    struct Broken {
      std::string addr;  // the writer's
      uint64_t token;    // the ring's
      std::string why;
    };
    std::vector<Broken> broken;
    // Messages over this node's XMESH_MAX_MESSAGE_BYTES: their header (when it came whole) and
    // payload size; their bytes were skipped, the ring reads on.
    struct TooLarge {
      Message msg;
      uint64_t payload_bytes, sender_limit;
    };
    std::vector<TooLarge> too_large;
  };
  // The reading thread. Reads up to a batch from every ring being read; each whole message goes
  // to deliver (sender_addr set), which may decline it for now (false: its actor's inbox is
  // full): that ring is then not read further (its writer waits once it fills: memory stays
  // bounded, nothing is lost or reordered) and the message is offered again at the next poll.
  // Returns how many messages were delivered.
  using Deliver = std::function<bool(Message&)>;
  // One thread reads at a time (the node's reading thread, or an idle thread reading for
  // itself); another waits for its turn (a pass is short: nothing in it waits).
  size_t poll(const Deliver& deliver, Report& report);
  // Whether a ring being read holds something not read yet (any thread; a message held back
  // for its actor's room does not count).
  bool unread() const;
  // The reading thread's wait until a writer rings (after the short spin of spin.hpp), at most
  // timeout_ms.
  void wait(int timeout_ms);
  // An idle thread's wait (Doorbell::sleep with its own bit), and the wake of one such thread.
  uint32_t seq() const { return bell_ ? bell_.seq() : 0; }
  void sleep_idle(uint32_t bit, uint32_t seen, int timeout_ms, const std::function<bool()>& still_idle);
  void wake(uint32_t bit);
  void awake(bool on);  // Doorbell::awake
  void wake();  // the reading thread's wait ends (it stops)
  uint64_t received() const { return received_.load(); }  // messages delivered, ever
  size_t reading() const;                                 // links being read now

 private:
  struct In;
  enum class Got { message, more, garbage, too_large };
  std::vector<std::shared_ptr<In>>& reading_snapshot();  // the polling thread's copy of reading_
  // Out of the sets; one its writer closed is remembered a while (ended_).
  void forget(const std::shared_ptr<In>& in, bool closed_by_writer = false);
  Got take_record(In& in, Message* out, std::string* error, uint64_t* payload);

  size_t max_message_bytes_;
  std::atomic<bool> enabled_{false};
  Doorbell bell_;  // made by enable()
  SpinGauge gauge_;  // the reading thread's waits
  std::mutex poll_mu_;  // held by the thread reading the rings now
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<In>> rings_;  // by the writer's address: the newest link of each
  std::vector<std::shared_ptr<In>> reading_;          // those being read (one replaced: until read to its end)
  std::atomic<uint64_t> received_{0};
  std::atomic<uint64_t> version_{0};                  // bumped when reading_ changes
  std::vector<std::shared_ptr<In>> snapshot_;         // the polling thread's copy
  // (writer's address, token) of rings read to their end after their writer closed them: a
  // writer that closed one because it broke says so in a RingBroken that may come later.
  static constexpr size_t kEndedKept = 64;
  std::deque<std::pair<std::string, uint64_t>> ended_;
  uint64_t snapshot_version_ = ~uint64_t(0);
};

// Opens fd `fd` of process `pid` (/proc/<pid>/fd/<fd>): -1 with errno when it cannot.
int open_peer_fd(int64_t pid, int64_t fd);

}  // namespace xmesh
