// WaitFeed: what else can deliver what a thread waits for while it waits: a node's shared-memory
// rings (ring_links.hpp). A waiting thread (an actor's on its inbox, a caller's on its call)
// reads the feed itself when what it waits for is not there yet, and sleeps on the feed's
// wake-up word with a bit of its own instead of a condition variable, so that what comes on a
// ring wakes the one thread that waits for it.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>

namespace xmesh {

class WaitFeed {
 public:
  // The bit a thread waiting on a call sleeps with; inboxes take the bits 2..2^30, the node's
  // reading thread bit 1 (Doorbell::kReaderBit).
  static constexpr uint32_t kCallerBit = 1u << 31;
  virtual ~WaitFeed() = default;
  // False once the node stopped: the waiter waits the usual way.
  virtual bool live() const = 0;
  virtual uint32_t seq() = 0;  // before looking (a change since means: look again)
  // Reads what came, dispatching it (after the thread reading now, if any). A thread a writer
  // woke must pump before it leaves: it may be the only one woken for that message.
  virtual void pump() = 0;
  // Sleeps as `bit` until the feed rings, wake(bit), or timeout_ms, unless still_idle() is false.
  virtual void sleep(uint32_t bit, uint32_t seen, int timeout_ms, const std::function<bool()>& still_idle) = 0;
  virtual void wake(uint32_t bit) = 0;
  // A waiter that reads the feed for itself says it is awake (no writer wakes anyone meanwhile)
  // and, once it says it no longer is, reads once more when seq() moved since its last read.
  virtual void awake(bool on) = 0;

  // How long one sleep on a feed lasts before `deadline`: at most a second (a waiter looks at
  // its own state again at least that often), at least a millisecond.
  template <class TimePoint>
  static int sleep_ms(TimePoint now, TimePoint deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
    return static_cast<int>(std::min<int64_t>(1000, left));
  }
};

// A thread awake on a feed for a while (WaitFeed::awake): on leaving, it reads what came
// meanwhile, which no writer woke anyone for.
class AwakeOnFeed {
 public:
  explicit AwakeOnFeed(WaitFeed* feed) : feed_(feed && feed->live() ? feed : nullptr), outer_(current_) {
    current_ = this;
    if (!feed_) return;
    seen_ = feed_->seq();
    feed_->awake(true);
  }
  ~AwakeOnFeed() {
    current_ = outer_;
    if (!feed_) return;
    feed_->awake(false);
    if (feed_->seq() != seen_) feed_->pump();
  }
  AwakeOnFeed(const AwakeOnFeed&) = delete;
  AwakeOnFeed& operator=(const AwakeOnFeed&) = delete;

  // While the thread waits for something else (room in a full ring), it reads nothing: writers
  // wake others for what comes meanwhile (else that would wait for the reading thread's
  // 100 ms tick, or for this thread, which may be waiting on the very peer that writes).
  class Pause {
   public:
    Pause() : a_(current_ && current_->feed_ ? current_ : nullptr) {
      if (a_) a_->feed_->awake(false);
    }
    ~Pause() {
      if (a_) a_->feed_->awake(true);
    }
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;

   private:
    AwakeOnFeed* a_;
  };

 private:
  static inline thread_local AwakeOnFeed* current_ = nullptr;
  WaitFeed* feed_;
  AwakeOnFeed* outer_;
  uint32_t seen_ = 0;
};

}  // namespace xmesh
