// Waker: what wakes the process's main thread from its wait on a call when something other
// than the call needs it: output to show in the running notebook cell, an actor stopped in
// pdb. One per process (main_waker()). The thread that waits registers the call it waits on
// (enter/leave); notify() wakes that call's wait (Call::wake) or, for an asyncio loop, makes
// fd() readable. A notify() that comes while nobody waits is kept for the next wait.
#pragma once
#include <memory>
#include <mutex>

#include "event_fd.hpp"
#include "call.hpp"

namespace xmesh {

class Waker {
 public:
  Waker() = default;
  ~Waker();
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;

  void notify();  // any thread
  // True if notify() was called since the last take (clears it, and the fd).
  bool take();
  // The call the main thread waits on now (its wait is woken by notify()); a notify() that is
  // pending when it enters wakes it at once.
  void enter(const std::shared_ptr<Call>& call);
  void leave();
  int fd();  // an eventfd, readable while a notify() is pending (for asyncio's add_reader)

 private:
  std::mutex mu_;
  bool pending_ = false;
  std::weak_ptr<Call> waiting_;
  EventFd efd_;  // readable while a notify() is pending, made on first use (under mu_)
};

Waker& main_waker();

}  // namespace xmesh
