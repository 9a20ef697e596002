#include "spin.hpp"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "util.hpp"

namespace xmesh {

namespace {
std::atomic<int>& spin_budget_cell() {
  static std::atomic<int> budget{static_cast<int>(env_int("XMESH_SPIN_US", 200))};
  return budget;
}

}  // namespace

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max<int>(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
}

int spin_budget_us() { return spin_budget_cell().load(std::memory_order_relaxed); }

void spin_for_network() {
  static const int network = static_cast<int>(env_int("XMESH_SPIN_NET_US", 300));
  auto& cell = spin_budget_cell();
  int current = cell.load();
  while (current > 0 && current < network && !cell.compare_exchange_weak(current, network)) {
  }
}

int runnable_threads(const char* loadavg) {
  // "0.52 0.58 0.59 3/412 12345": the fourth field is runnable/total scheduling entities.
  const char* p = loadavg;
  for (int field = 0; field < 3; ++field) {
    p = std::strchr(p, ' ');
    if (!p) return -1;
    ++p;
  }
  char* end = nullptr;
  long running = std::strtol(p, &end, 10);
  if (end == p || *end != '/') return -1;
  return static_cast<int>(running);
}

bool spare_core() {
  static const bool check = env_int("XMESH_SPIN_SPARE_CORE", 1) != 0;
  static const int cores = usable_cores();
  static std::atomic<int64_t> next_look_ns{0};
  static std::atomic<bool> spare{true};
  if (!check) return true;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch()).count();
  int64_t due = next_look_ns.load(std::memory_order_relaxed);
  // One thread looks per 5 ms; the others take what it saw.
  if (now < due || !next_look_ns.compare_exchange_strong(due, now + 5'000'000)) return spare.load(std::memory_order_relaxed);
  // Opened for each look (every 5 ms at most): a descriptor kept would be the fork server's,
  // which a proc may have closed and reused for something else.
  const int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  char buf[128];
  ssize_t n = fd >= 0 ? ::read(fd, buf, sizeof buf - 1) : -1;
  if (fd >= 0) ::close(fd);
  int running = -1;
  if (n > 0) {
    buf[n] = '\0';
    running = runnable_threads(buf);
  }
  // The looking thread counts itself (it yields while it spins): more than one thread over the
  // cores means threads with work wait for one.
  const bool free = running < 0 || running <= cores + 1;
  spare.store(free, std::memory_order_relaxed);
  return free;
}

}  // namespace xmesh
