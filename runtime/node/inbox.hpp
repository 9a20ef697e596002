// A blocking multi-producer queue of messages with an eventfd that is readable while the
// queue is non-empty, so a consumer can wait in poll()/asyncio as well as in pop().
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "event_fd.hpp"
#include "spin.hpp"
#include "wait_feed.hpp"
#include "wire.hpp"

namespace xmesh {

class Inbox {
 public:
  // spin: pop() looks a little before it sleeps (spin.hpp), for an actor's inbox, whose next
  // call from a busy caller usually comes within microseconds; other inboxes sleep at once.
  explicit Inbox(bool spin = false);
  ~Inbox();
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  // Returns false once the inbox is closed, leaving m with the caller (to answer it).
  bool push(Message&& m);
  // Waits up to timeout_ms (-1: forever) for a message; nullopt on timeout or when closed
  // and drained.
  std::optional<Message> pop(int timeout_ms);
  // Closes the inbox: waiters wake, later pushes are dropped, queued messages can still be popped.
  void close();
  bool closed() const;
  size_t size() const;
  size_t queued() const { return pending_.load(); }  // size() without the lock (+1 once closed)
  // The consumer reads `feed` itself while it waits (wait_feed.hpp; before any pop). bit: its own.
  void feed_from(std::shared_ptr<WaitFeed> feed, uint32_t bit);
  // Created on first use: inboxes consumed only through pop() never pay for the syscalls.
  int fd();

 private:
  std::optional<Message> take_locked();
  std::optional<Message> pop_fed(int timeout_ms);  // pop() with a feed
  // Whoever makes the queue non-empty or closes it wakes the consumer, wherever it sleeps.
  void wake_consumer(bool notify_all);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Message> q_;
  std::atomic<size_t> pending_{0};  // q_'s size, plus one once closed: looked at without the lock while spinning
  bool closed_ = false;
  const bool spin_;
  SpinGauge gauge_;
  std::shared_ptr<WaitFeed> feed_ = nullptr;
  uint32_t feed_bit_ = 0;
  bool feed_sleeping_ = false;  // under mu_: the consumer sleeps on the feed
  EventFd efd_;  // for poll/asyncio consumers, made on first use (under mu_)
};

}  // namespace xmesh
