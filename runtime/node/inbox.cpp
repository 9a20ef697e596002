#include "inbox.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>

namespace xmesh {

Inbox::Inbox(bool spin) : spin_(spin) {}

int Inbox::fd() {
  std::lock_guard<std::mutex> g(mu_);
  return efd_.fd(!q_.empty() || closed_);
}

Inbox::~Inbox() = default;

void Inbox::feed_from(std::shared_ptr<WaitFeed> feed, uint32_t bit) {
  std::lock_guard<std::mutex> g(mu_);
  feed_ = std::move(feed);
  feed_bit_ = bit;
}

void Inbox::wake_consumer(bool notify_all) {
  bool fed;
  {
    std::lock_guard<std::mutex> g(mu_);
    fed = feed_sleeping_;
  }
  if (fed) feed_->wake(feed_bit_);
  if (notify_all)
    cv_.notify_all();
  else
    cv_.notify_one();
}

bool Inbox::push(Message&& m) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (closed_) return false;
    q_.push_back(std::move(m));
    ++pending_;
    efd_.signal();
  }
  wake_consumer(false);
  return true;
}

std::optional<Message> Inbox::take_locked() {
  if (q_.empty()) return std::nullopt;
  Message m = std::move(q_.front());
  q_.pop_front();
  --pending_;
  if (q_.empty() && !closed_) efd_.clear();
  return m;
}

// The consumer reads the feed itself: a message for it on a ring lands here through its own
// pump, with no other thread woken. It sleeps on the feed (its bit) when there is nothing.
std::optional<Message> Inbox::pop_fed(int timeout_ms) {
  const auto start = SpinGauge::Clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout_ms < 0 ? int64_t(1) << 40 : timeout_ms);
  bool measured = false;
  auto ready = [this] {
    std::lock_guard<std::mutex> g(mu_);
    return !q_.empty() || closed_;
  };
  for (;;) {
    uint32_t seen = feed_->seq();
    feed_->pump();  // always: a thread woken by a writer reads what it was woken for
    if (ready()) {
      gauge_.waited(SpinGauge::Clock::now() - start);
      std::lock_guard<std::mutex> g(mu_);
      return take_locked();
    }
    if (!measured) {  // the short spin, once: on the queue or the feed
      measured = true;
      if (gauge_.spin([&] { return pending_.load() != 0 || feed_->seq() != seen; })) continue;
    }
    auto now = SpinGauge::Clock::now();
    if (now >= deadline) {
      gauge_.waited(now - start);
      return std::nullopt;
    }
    int left = WaitFeed::sleep_ms(now, deadline);
    {
      std::lock_guard<std::mutex> g(mu_);
      feed_sleeping_ = true;
    }
    feed_->sleep(feed_bit_, seen, left, [this] { return pending_.load() == 0; });
    std::lock_guard<std::mutex> g(mu_);
    feed_sleeping_ = false;
  }
}

std::optional<Message> Inbox::pop(int timeout_ms) {
  if (feed_ && timeout_ms != 0 && feed_->live()) return pop_fed(timeout_ms);
  const bool measure = spin_ && timeout_ms != 0 && pending_.load() == 0;
  const auto start = measure ? SpinGauge::Clock::now() : SpinGauge::Clock::time_point{};
  if (measure) gauge_.spin([this] { return pending_.load() != 0; });
  std::unique_lock<std::mutex> g(mu_);
  auto ready = [&] { return !q_.empty() || closed_; };
  bool came = true;
  if (timeout_ms < 0) {
    cv_.wait(g, ready);
  } else if (timeout_ms == 0) {
    // No timed wait: even an expired timeout sleeps for the timer slack (~50 us).
  } else {
    came = cv_.wait_for(g, std::chrono::milliseconds(timeout_ms), ready);
  }
  if (measure) gauge_.waited(SpinGauge::Clock::now() - start);
  if (!came) return std::nullopt;
  return take_locked();
}

void Inbox::close() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!closed_) ++pending_;
    closed_ = true;
    efd_.signal();
  }
  wake_consumer(true);
}

bool Inbox::closed() const {
  std::lock_guard<std::mutex> g(mu_);
  return closed_;
}

size_t Inbox::size() const {
  std::lock_guard<std::mutex> g(mu_);
  return q_.size();
}

}  // namespace xmesh
