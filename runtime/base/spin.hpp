// The short spin before a sleep: a thread that waits for something that usually comes within
// microseconds (the next call of a busy caller, a reply, a message on a ring) looks for it a
// little before it sleeps on a futex, since a sleep and its wake-up cost tens of microseconds
// on a loaded machine. It yields the core while it looks, so a thread with work (the actor
// running the call) is not held back on a machine of few cores.
//
// Spinning pays only where waits are short: each wait site keeps a SpinGauge, the running
// average of how long its waits took (however they ended), and spins only while that is under
// the budget. A burst of calls answered in microseconds spins, and so does a caller between the
// replies of a fan-out (it measures from one reply to the next); an idle actor sleeps at once
// (many threads yielding to each other would only take turns on the cores). The budget is
// XMESH_SPIN_US (microseconds, default 200; 0: never spin): measured on 2 cores, 100 made the
// procs of a fan-out to 4 sleep between calls 120 us apart (2.5-2.8x multiprocessing's against
// 1.4-1.6x with 200; 300 made one-target calls slower in some runs). Read once per process, raised to XMESH_SPIN_NET_US once a TCP lane is up (spin_for_network).
#pragma once
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace xmesh {

int spin_budget_us();
// A process whose messages cross the network (a TCP lane is up): its waits hold a network round
// trip besides its peer's work, longer than the same-host budget, and a sleep then costs a
// wake-up on each side of every call (measured: call_one over lanes 270 us sleeping, 90 us
// spinning). Raises the budget to XMESH_SPIN_NET_US (default 300) for the rest of the process,
// unless spinning is off (XMESH_SPIN_US=0).
void spin_for_network();
// Whether this machine has a core to spare for a spin: at most one thread more runnable than the
// cores this process may use (/proc/loadavg's count, looked at every 5 ms at most, by one thread
// for all; the one more is the asking thread itself, which yields while it spins, beside the
// thread whose work it waits for). Where more threads wait for a core a spin only takes turns
// with the threads that have work (every namespace "host" of a one-machine test shares its
// cores), so a waiter then sleeps at once. XMESH_SPIN_SPARE_CORE=0: spin regardless.
bool spare_core();
// The cores this process may run on (its affinity mask; the machine's count where unreadable).
int usable_cores();
// The runnable count in a /proc/loadavg line ("0.52 0.58 0.59 3/412 12345" -> 3; -1: unreadable).
int runnable_threads(const char* loadavg);

class SpinGauge {
 public:
  using Clock = std::chrono::steady_clock;
  // Looks at ready() (yielding between looks) while the waits here are typically short, up to
  // the budget; true when it became ready.
  template <class Ready>
  bool spin(Ready ready) {
    int budget = spin_budget_us();
    if (budget <= 0 || typical_ns_.load(std::memory_order_relaxed) > int64_t(budget) * 1000 || !spare_core())
      return ready();
    auto end = Clock::now() + std::chrono::microseconds(budget);
    do {
      if (ready()) return true;
      sched_yield();
    } while (Clock::now() < end);
    return ready();
  }
  // How long one wait here took, from its start to what ended it.
  void waited(Clock::duration d) {
    // A long wait counts as a few budgets: after an idle pause a burst spins again within a few waits.
    int64_t cap = int64_t(spin_budget_us()) * 4000;
    int64_t sample = std::min<int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(), cap);
    int64_t typical = typical_ns_.load(std::memory_order_relaxed);
    typical_ns_.store(typical + (sample - typical) / 4, std::memory_order_relaxed);  // a running average
  }

 private:
  std::atomic<int64_t> typical_ns_{0};
};

}  // namespace xmesh
