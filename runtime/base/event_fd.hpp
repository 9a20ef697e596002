// EventFd: a readiness descriptor for poll / asyncio consumers of something that is not a file
// (an inbox, a call, the main thread's waker), made on first use, readable while what it stands
// for has something. Not thread-safe: its owner's lock guards it.
#pragma once
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

#include "unique_fd.hpp"

namespace xmesh {

class EventFd {
 public:
  // drained_outside: its consumer may read it itself (asyncio's reader of a call does, so that a
  // level-triggered reader does not spin): then every signal writes and every clear reads,
  // since whether it is readable now cannot be known here. Otherwise it is written only when
  // not readable yet, read only when it is.
  explicit EventFd(bool drained_outside = false) : drained_outside_(drained_outside) {}
  // The descriptor, made now if it was not; `ready`: what it stands for has something already,
  // so it starts readable. -1 when none can be made (out of descriptors).
  int fd(bool ready) {
    if (!fd_) {
      fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
      if (ready) signal();
    }
    return fd_.get();
  }
  // Readable from now on (nothing to do before it is made, or when it is already).
  void signal() {
    if (!fd_ || (signalled_ && !drained_outside_)) return;
    const uint64_t one = 1;
    ssize_t n = ::write(fd_.get(), &one, sizeof(one));
    (void)n;
    signalled_ = true;
  }
  // Not readable any more.
  void clear() {
    if (!fd_ || (!signalled_ && !drained_outside_)) return;
    uint64_t v;
    ssize_t n = ::read(fd_.get(), &v, sizeof(v));
    (void)n;
    signalled_ = false;
  }

 private:
  unique_fd fd_;
  bool signalled_ = false;
  const bool drained_outside_;
};

}  // namespace xmesh
