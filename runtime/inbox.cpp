#include "inbox.hpp"

#include "spin.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>

namespace xmesh {

Inbox::Inbox(bool spin) : spin_(spin) {}

int Inbox::fd() {
  std::lock_guard<std::mutex> g(mu_);
  if (efd_ < 0) {
    efd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (!q_.empty() || closed_) signal_fd_locked();
  }
  return efd_;
}

Inbox::~Inbox() {
  if (efd_ >= 0) ::close(efd_);
}

void Inbox::signal_fd_locked() {
  if (efd_ < 0 || signalled_) return;
  uint64_t one = 1;
  ssize_t n = ::write(efd_, &one, sizeof(one));
  (void)n;
  signalled_ = true;
}

void Inbox::clear_fd_locked() {
  if (efd_ < 0 || !signalled_) return;
  uint64_t v;
  ssize_t n = ::read(efd_, &v, sizeof(v));
  (void)n;
  signalled_ = false;
}

bool Inbox::push(Message&& m) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (closed_) return false;
    q_.push_back(std::move(m));
    ++pending_;
    signal_fd_locked();
  }
  cv_.notify_one();
  return true;
}

std::optional<Message> Inbox::pop(int timeout_ms) {
  if (spin_ && timeout_ms != 0) spin_until([this] { return pending_.load() != 0; });
  std::unique_lock<std::mutex> g(mu_);
  auto ready = [&] { return !q_.empty() || closed_; };
  if (timeout_ms < 0) {
    cv_.wait(g, ready);
  } else if (timeout_ms == 0) {
    // No timed wait: even an expired timeout sleeps for the timer slack (~50 us).
  } else if (!cv_.wait_for(g, std::chrono::milliseconds(timeout_ms), ready)) {
    return std::nullopt;
  }
  if (q_.empty()) return std::nullopt;
  Message m = std::move(q_.front());
  q_.pop_front();
  --pending_;
  if (q_.empty() && !closed_) clear_fd_locked();
  return m;
}

void Inbox::close() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!closed_) ++pending_;
    closed_ = true;
    signal_fd_locked();
  }
  cv_.notify_all();
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
