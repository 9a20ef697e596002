#include "waker.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

namespace xmesh {

Waker::~Waker() {
  if (efd_ >= 0) ::close(efd_);
}

void Waker::notify() {
  std::shared_ptr<Call> call;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!pending_ && efd_ >= 0) {
      uint64_t one = 1;
      ssize_t n = ::write(efd_, &one, sizeof(one));
      (void)n;
    }
    pending_ = true;
    call = waiting_.lock();
  }
  if (call) call->wake();
}

bool Waker::take() {
  std::lock_guard<std::mutex> g(mu_);
  bool was = pending_;
  pending_ = false;
  if (was && efd_ >= 0) {
    uint64_t v;
    ssize_t n = ::read(efd_, &v, sizeof(v));
    (void)n;
  }
  return was;
}

void Waker::enter(const std::shared_ptr<Call>& call) {
  bool pending;
  {
    std::lock_guard<std::mutex> g(mu_);
    waiting_ = call;
    pending = pending_;
  }
  if (pending) call->wake();
}

void Waker::leave() {
  std::lock_guard<std::mutex> g(mu_);
  waiting_.reset();
}

int Waker::fd() {
  std::lock_guard<std::mutex> g(mu_);
  if (efd_ < 0) {
    efd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (pending_) {
      uint64_t one = 1;
      ssize_t n = ::write(efd_, &one, sizeof(one));
      (void)n;
    }
  }
  return efd_;
}

Waker& main_waker() {
  static Waker* w = new Waker();  // never destroyed: threads may notify while the process exits
  return *w;
}

}  // namespace xmesh
