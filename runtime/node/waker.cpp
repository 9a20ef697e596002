#include "waker.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

namespace xmesh {

Waker::~Waker() = default;

void Waker::notify() {
  std::shared_ptr<Call> call;
  {
    std::lock_guard<std::mutex> g(mu_);
    efd_.signal();
    pending_ = true;
    call = waiting_.lock();
  }
  if (call) call->wake();
}

bool Waker::take() {
  std::lock_guard<std::mutex> g(mu_);
  bool was = pending_;
  pending_ = false;
  efd_.clear();
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
  return efd_.fd(pending_);
}

Waker& main_waker() {
  static Waker* w = new Waker();  // never destroyed: threads may notify while the process exits
  return *w;
}

}  // namespace xmesh
