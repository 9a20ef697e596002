// The short spin before a sleep: a thread that waits for something that usually comes within
// microseconds (the next call of a busy caller, a reply, a message on a ring) looks for it a
// little before it sleeps on a futex, since a sleep and its wake-up cost tens of microseconds
// on a loaded machine. It yields the core while it looks, so a thread with work (the actor
// running the call) is not held back on a machine of few cores. The budget is XMESH_SPIN_US
// (microseconds, default 100; 0: never spin), read once per process.
#pragma once
#include <sched.h>

#include <chrono>

namespace xmesh {

int spin_budget_us();

// Looks at ready() until it is true (true) or the budget is spent (false).
template <class Ready>
bool spin_until(Ready ready) {
  int budget = spin_budget_us();
  if (budget <= 0) return ready();
  auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(budget);
  do {
    if (ready()) return true;
    sched_yield();
  } while (std::chrono::steady_clock::now() < end);
  return ready();
}

}  // namespace xmesh
