#include "process_memory.hpp"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace xmesh {

namespace {
// One call moves at most this much: a transfer of gigabytes stays interruptible between calls
// and a partial transfer is resumed where it stopped.
constexpr size_t kStep = size_t(1) << 30;

ProcessCopy failure(int e, pid_t pid, bool reading) {
  ProcessCopy r;
  const std::string who = "process " + std::to_string(pid);
  switch (e) {
    case ESRCH:
      r.status = ProcessCopy::Status::gone;
      r.why = who + " is gone";
      break;
    case EPERM:
      r.status = ProcessCopy::Status::not_permitted;
      r.why = "this process may not " + std::string(reading ? "read" : "write") + " the memory of " + who +
              " (cross-memory attach needs ptrace permission: the same user, and Yama's "
              "/proc/sys/kernel/yama/ptrace_scope 0 or an ancestor)";
      break;
    case EFAULT:
      r.status = ProcessCopy::Status::bad_address;
      r.why = "an address outside the memory of " + who + " or of this process";
      break;
    default:
      r.status = ProcessCopy::Status::failed;
      r.why = std::string(reading ? "reading" : "writing") + " the memory of " + who + ": " + std::strerror(e);
  }
  return r;
}

template <class Move>
ProcessCopy copy_all(pid_t pid, size_t size, bool reading, Move move) {
  size_t done = 0;
  while (done < size) {
    const size_t step = std::min(kStep, size - done);
    ssize_t n = move(done, step);
    if (n < 0) {
      if (errno == EINTR) continue;
      return failure(errno, pid, reading);
    }
    if (n == 0) return failure(EFAULT, pid, reading);  // nothing moved: a range not mapped
    done += static_cast<size_t>(n);
  }
  return {};
}
}  // namespace

ProcessCopy read_process_memory(pid_t pid, const void* remote, void* local, size_t size) {
  return copy_all(pid, size, true, [&](size_t at, size_t n) {
    iovec mine{static_cast<char*>(local) + at, n};
    iovec theirs{const_cast<char*>(static_cast<const char*>(remote)) + at, n};
    return process_vm_readv(pid, &mine, 1, &theirs, 1, 0);
  });
}

ProcessCopy write_process_memory(pid_t pid, void* remote, const void* local, size_t size) {
  return copy_all(pid, size, false, [&](size_t at, size_t n) {
    iovec mine{const_cast<char*>(static_cast<const char*>(local)) + at, n};
    iovec theirs{static_cast<char*>(remote) + at, n};
    return process_vm_writev(pid, &mine, 1, &theirs, 1, 0);
  });
}

}  // namespace xmesh
