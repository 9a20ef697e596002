#include "call.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>

namespace xmesh {

namespace {
// A proc or host that died can never answer: waiting for the call's other targets would only
// delay the error. An actor's own failure (its report, info.report) is an answer like another:
// the call waits for its other targets, whose owner has then heard of every failure among them.
bool ends_call_early(const json& body) {
  if (error_kind_of(body) != ErrorKind::Supervision) return false;
  auto info = body.find("info");
  if (info == body.end() || !info->is_object()) return true;
  auto report = info->find("report");
  return report == info->end() || !report->is_boolean() || !report->get<bool>();
}
}  // namespace

Call::Call(uint64_t id, std::vector<std::string> target_addrs)
    : id_(id), addrs_(std::move(target_addrs)), have_(addrs_.size(), false) {}

void Call::set_target_addr(size_t i, const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  addrs_.at(i) = addr;
}

Call::Call(uint64_t id, PortTag, bool once) : id_(id), port_(true), once_(once) {}

bool Call::complete() const { return port_ ? once_ && received_ > 0 : received_ == have_.size(); }

Call::~Call() = default;

bool Call::deliver(CallResult r) {
  bool wake, fed;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (port_) {
      if (once_ && received_ > 0) return false;
    } else {
      if (r.index < 0 || static_cast<size_t>(r.index) >= have_.size()) return false;
      if (have_[r.index]) {
        end_lingering(static_cast<size_t>(r.index));  // a cancelled target's own answer: it ended
        return false;
      }
      have_[r.index] = true;
    }
    ++received_;
    if (!r.ok && ends_call_early(r.body)) fatal_ = true;
    untaken_.push_back(std::move(r));
    efd_.signal();
    // A fan-out to N targets must not wake a waiter for the whole call N times.
    wake = any_waiters_ > 0 || complete() || fatal_;
    if (wake) ++changes_;
    fed = feed_sleepers_ > 0;
  }
  if (wake) notify_waiters(fed);
  return true;
}

void Call::notify_waiters(bool fed_sleepers) {
  if (fed_sleepers) feed_->wake(WaitFeed::kCallerBit);
  cv_.notify_all();
}

size_t Call::fail_index(size_t i, const json& error) {
  CallResult r;
  r.index = static_cast<int64_t>(i);
  r.ok = false;
  r.body = error;
  return deliver(std::move(r)) ? 1 : 0;
}

size_t Call::fail_where(const std::string* addr, const json& error) {
  size_t n = 0;
  for (size_t i = 0; i < addrs_.size(); ++i)
    if (!addr || addrs_[i] == *addr) n += fail_index(i, error);  // a dead proc runs nothing on
  return n;
}

void Call::end_lingering(size_t i) {
  if (i < lingering_.size() && lingering_[i]) {
    lingering_[i] = false;
    --lingering_count_;
  }
}

size_t Call::cancel_all(const json& error) {
  std::vector<int64_t> open = missing();
  {
    std::lock_guard<std::mutex> g(mu_);
    if (lingering_.empty()) lingering_.assign(have_.size(), false);
    for (int64_t i : open)
      if (!lingering_[static_cast<size_t>(i)]) {
        lingering_[static_cast<size_t>(i)] = true;
        ++lingering_count_;
      }
  }
  size_t n = 0;
  for (int64_t i : open) {
    CallResult r;
    r.index = i;
    r.body = error;
    // Its own answer may have come meanwhile: then it is not failed, and no longer runs.
    if (deliver(std::move(r))) ++n;
  }
  return n;
}

void Call::set_tree(std::vector<int32_t> parents, std::vector<uint64_t> oseqs) {
  parents_ = std::move(parents);
  oseqs_ = std::move(oseqs);
}

int32_t Call::relay_at(size_t i, const std::string& addr) const {
  for (int32_t p = parents_[i]; p >= 0; p = parents_[static_cast<size_t>(p)])
    if (addrs_[static_cast<size_t>(p)] == addr) return p;
  return -1;
}

size_t Call::fail_addr(const std::string& addr, const json& error,
                       std::vector<std::pair<std::string, uint64_t>>* behind) {
  size_t n = fail_where(&addr, error);
  if (parents_.empty()) return n;
  for (size_t i = 0; i < addrs_.size(); ++i) {
    if (addrs_[i] == addr) continue;
    int32_t relay = relay_at(i, addr);
    if (relay < 0) continue;
    json e = error;
    e["text"] = error.value("text", std::string("its relay died")) + " (target " + std::to_string(i) +
                "'s message and answer went through target " + std::to_string(relay) +
                ", the relay of its cast tree: the call may or may not have run there)";
    if (!fail_index(i, e)) continue;
    ++n;
    if (behind) behind->emplace_back(addrs_[i], oseqs_[i]);
  }
  return n;
}

size_t Call::fail_all(const json& error) { return fail_where(nullptr, error); }

bool Call::done() const {
  std::lock_guard<std::mutex> g(mu_);
  return complete();
}

size_t Call::received() const {
  std::lock_guard<std::mutex> g(mu_);
  return received_;
}

bool Call::fatal() const {
  std::lock_guard<std::mutex> g(mu_);
  return fatal_;
}

bool Call::wait_done(int timeout_ms) {
  std::unique_lock<std::mutex> g(mu_);
  auto ready = [&] { return complete() || fatal_; };
  if (timeout_ms == 0) return ready();  // a zero timed wait would still sleep for the timer slack
  if (timeout_ms < 0) {
    cv_.wait(g, ready);
    return true;
  }
  return cv_.wait_for(g, std::chrono::milliseconds(timeout_ms), ready);
}

WaitOutcome Call::wait_for(bool any, int timeout_ms) {
  std::unique_lock<std::mutex> g(mu_);
  auto ready = [&] { return any ? !untaken_.empty() || complete() : complete() || fatal_; };
  auto outcome = [&] {
    if (ready()) return WaitOutcome::Ready;
    if (woken_) {
      woken_ = false;
      return WaitOutcome::Woken;
    }
    return WaitOutcome::Timeout;
  };
  if (timeout_ms == 0 || ready() || woken_) return outcome();
  if (feed_ && feed_->live()) return wait_fed(any, timeout_ms, g);
  // A reply within microseconds needs no sleep: a caller's thread remembers how long its waits
  // take (thread_local: one caller's pattern, across its calls).
  static thread_local SpinGauge gauge;
  const auto start = SpinGauge::Clock::now();
  struct Measure {
    const SpinGauge::Clock::time_point& start;
    ~Measure() { gauge.waited(SpinGauge::Clock::now() - start); }
  } measure{start};
  uint32_t seen = changes_.load();
  g.unlock();
  gauge.spin([&] { return changes_.load() != seen; });
  g.lock();
  if (ready() || woken_) return outcome();
  if (any) ++any_waiters_;
  auto stop = [&] { return ready() || woken_; };
  if (timeout_ms < 0)
    cv_.wait(g, stop);
  else
    cv_.wait_for(g, std::chrono::milliseconds(timeout_ms), stop);
  if (any) --any_waiters_;
  return outcome();
}

// The waiter reads the node's rings itself, so that the reply to its call is read by the thread
// that waits for it (no thread in between), and sleeps on the node's doorbell (kCallerBit)
// when nothing came: a reply on a ring, deliver() or wake() wakes it. While it reads and looks
// it counts as awake, so that writers wake nobody else for what it will read anyway (an idle
// actor thread of this process would read a reply only to wake this one). It looks a little
// (spin.hpp) after every reply that did not complete the call: the replies of a fan-out come
// close together, and a sleep between two of them costs a wake-up each.
WaitOutcome Call::wait_fed(bool any, int timeout_ms, std::unique_lock<std::mutex>& g) {
  auto ready = [&] { return any ? !untaken_.empty() || complete() : complete() || fatal_; };
  static thread_local SpinGauge gauge;
  const auto deadline = SpinGauge::Clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? int64_t(1) << 40 : timeout_ms);
  WaitOutcome result = WaitOutcome::Timeout;
  if (any) ++any_waiters_;
  uint32_t read_at = 0;  // the feed's seq before the last read
  feed_->awake(true);
  for (;;) {
    const auto start = SpinGauge::Clock::now();
    uint32_t changes = changes_.load();
    read_at = feed_->seq();
    g.unlock();
    feed_->pump();
    gauge.spin([&] {
      uint32_t now = feed_->seq();
      if (now != read_at) {  // something rang: read it (else only look at the call)
        read_at = now;
        feed_->pump();
      }
      return changes_.load() != changes;
    });
    g.lock();
    if (ready() || woken_) {
      gauge.waited(SpinGauge::Clock::now() - start);
      result = ready() ? WaitOutcome::Ready : WaitOutcome::Woken;
      woken_ = woken_ && result != WaitOutcome::Woken;
      break;
    }
    auto now = SpinGauge::Clock::now();
    if (now >= deadline) break;
    if (!feed_->live()) {  // the node stopped: the rest of the wait on cv_ (deliver() notifies it)
      cv_.wait_until(g, deadline, [&] { return ready() || woken_; });
      continue;
    }
    int left = WaitFeed::sleep_ms(now, deadline);
    ++feed_sleepers_;
    g.unlock();
    feed_->awake(false);  // asleep: writers wake it (kCallerBit); anything after read_at ends the sleep
    feed_->sleep(WaitFeed::kCallerBit, read_at, left, [&] { return changes_.load() == changes; });
    feed_->awake(true);
    g.lock();
    --feed_sleepers_;
    gauge.waited(SpinGauge::Clock::now() - start);
  }
  if (any) --any_waiters_;
  g.unlock();
  feed_->awake(false);
  if (feed_->seq() != read_at) feed_->pump();  // what came while it was awake: read, not left
  g.lock();
  return result;
}

void Call::wake() {
  bool fed;
  {
    std::lock_guard<std::mutex> g(mu_);
    woken_ = true;
    ++changes_;
    fed = feed_sleepers_ > 0;
  }
  notify_waiters(fed);
}

std::vector<CallResult> Call::take() {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<CallResult> out;
  out.reserve(untaken_.size());
  while (!untaken_.empty()) {
    out.push_back(std::move(untaken_.front()));
    untaken_.pop_front();
  }
  efd_.clear();
  return out;
}

std::vector<int64_t> Call::missing() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<int64_t> out;
  for (size_t i = 0; i < have_.size(); ++i)
    if (!have_[i]) out.push_back(static_cast<int64_t>(i));
  return out;
}

std::vector<int64_t> Call::lingering() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<int64_t> out;
  for (size_t i = 0; i < lingering_.size(); ++i)
    if (lingering_[i]) out.push_back(static_cast<int64_t>(i));
  return out;
}

std::vector<int64_t> Call::running() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<int64_t> out;
  for (size_t i = 0; i < have_.size(); ++i)
    if (!have_[i] || (i < lingering_.size() && lingering_[i])) out.push_back(static_cast<int64_t>(i));
  return out;
}

bool Call::settled() const {
  std::lock_guard<std::mutex> g(mu_);
  return complete() && lingering_count_ == 0;
}

int Call::fd() {
  std::lock_guard<std::mutex> g(mu_);
  return efd_.fd(!untaken_.empty() || complete());
}

}  // namespace xmesh
