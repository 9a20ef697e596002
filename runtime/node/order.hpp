// Per-origin order of actor messages, and the sends that wait for a thread that may wait.
//
// Order: every actor message carries a per-(origin, destination) order number (Header::oseq)
// assigned at the origin, and the destination's OrderGate takes messages from one origin in that
// order, whichever way each came (directly, or through a cast tree's relay, runtime/cast/): a
// message overtaken by a later one waits for it. A number that will never come (its relay died,
// a ring broke with it) is given up on when the origin says so (CastLost), or after
// XMESH_ORDER_WAIT_MS. DeferredSends keeps, in order per destination, what a thread that must not
// wait could not send at once (the node's xmesh-relay thread sends it).
//
// Plain data structures, each with its own lock; the node (node_order.cpp) wires them.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "wire.hpp"

namespace xmesh {

// Per origin, the order numbers taken so far: one stream per (origin incarnation) that a
// destination reads in order. Thread-safe.
class OrderGate {
 public:
  explicit OrderGate(int64_t wait_ms) : wait_ms_(wait_ms) {}
  // m (its header.oseq set) came from origin: the messages to dispatch now, in order (m and the
  // ones it released); none when m came early (held) or was given up on before it came.
  // origin: the node id of the message's maker (unique per process incarnation).
  std::vector<Message> admit(const std::string& origin, Message m);
  // The origin says these numbers will not come, nor any up to `through` that has not come yet
  // (0: none; a link that broke with messages on it): what waited behind them, in order.
  std::vector<Message> skip(const std::string& origin, const std::vector<uint64_t>& oseqs, uint64_t through = 0);
  // Messages held longer than the wait: their gaps are given up on (*gaps says which, for the
  // log); what they release, in order.
  std::vector<Message> expire(int64_t now_ms, std::vector<std::string>* gaps);
  void forget(const std::string& origin);
  size_t held() const;
  uint64_t dropped() const { return dropped_.load(); }  // messages that came after they were given up on
  uint64_t late() const { return late_.load(); }  // messages that came after a wait for them expired (taken anyway)

 private:
  struct Stream {
    uint64_t next = 1;
    std::map<uint64_t, Message> early;
    std::set<uint64_t> lost;          // said lost (CastLost), not yet passed
    std::deque<uint64_t> given_up;    // passed without coming (bounded): dropped if they come
    int64_t waiting_since = 0;        // last progress while messages were held
  };
  Stream& stream(const std::string& origin);
  void release(Stream& s, std::vector<Message>& out, int64_t now);
  static constexpr uint64_t kWindow = 65536;      // lost numbers kept ahead of the next
  static constexpr size_t kMaxStreams = 4096;     // origins remembered before idle ones are forgotten
  void give_up(Stream& s, uint64_t oseq);
  mutable std::mutex mu_;
  std::unordered_map<std::string, Stream> streams_;
  int64_t wait_ms_;
  std::atomic<uint64_t> dropped_{0}, late_{0};
};

// Sends that could not go at once (a link full, on a thread that must not wait: a relay's I/O
// or rings thread) wait here in order per destination, for a thread that may wait in a send (the
// node's xmesh-relay thread); later sends to that destination queue behind them. Thread-safe.
class DeferredSends {
 public:
  struct Send {
    std::string addr;
    Header header;
    std::vector<zmq::message_t> frames;
    std::function<void(const std::string& why)> failed;  // it could not be sent at all
  };
  // Whether sends to addr wait here (or one is being sent): a new one must queue behind them.
  bool busy(const std::string& addr) const;
  void push(Send s);
  // The next send (its destination marked in flight until done()), or nullopt after the
  // timeout or stop().
  std::optional<Send> pop(int timeout_ms);
  void done(const std::string& addr);
  void stop();
  // Read on every actor message a ring brings (Node::has_room): without the lock.
  size_t size() const { return size_.load(); }
  uint64_t pushed() const { return pushed_.load(); }  // sends that ever waited here

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> pushed_{0};
  std::map<std::string, std::deque<Send>> queues_;
  std::set<std::string> in_flight_;
  std::atomic<size_t> size_{0};
  bool stopped_ = false;
};

}  // namespace xmesh
