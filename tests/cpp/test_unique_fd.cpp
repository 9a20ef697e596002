// unique_fd (runtime/base/unique_fd.hpp): the one owner of a descriptor.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <utility>

#include "event_fd.hpp"
#include "unique_fd.hpp"

using namespace xmesh;

namespace {
bool open_fd(int fd) { return fcntl(fd, F_GETFD) != -1; }
}  // namespace

TEST_CASE("unique_fd closes what it owns once, moves it, and lets go of what it releases", "[base]") {
  int raw = -1;
  {
    unique_fd a(open("/dev/null", O_RDONLY | O_CLOEXEC));
    REQUIRE(a);
    raw = a.get();
    unique_fd b(std::move(a));
    CHECK_FALSE(a);
    CHECK(b.get() == raw);
    unique_fd c;
    c = std::move(b);
    CHECK(open_fd(raw));
  }
  CHECK_FALSE(open_fd(raw));  // closed when its last owner went

  unique_fd d(open("/dev/null", O_RDONLY | O_CLOEXEC));
  const int kept = d.release();
  CHECK_FALSE(d);
  d.reset();
  CHECK(open_fd(kept));  // released: no longer closed here
  unique_fd e(kept);
  e.reset(open("/dev/null", O_RDONLY | O_CLOEXEC));
  CHECK(e);  // reset closed the first before taking the second (the number may be reused)
  const int second = e.get();
  e.reset(second);  // resetting to the one it owns keeps it open
  CHECK(open_fd(second));
}

// EventFd (runtime/base/event_fd.hpp): readable while what it stands for has something; one
// whose consumer drains it itself (asyncio's reader of a call) is readable again at the next
// signal, though this side never saw it drained.
TEST_CASE("an event fd is readable after each signal, also when its consumer drained it itself", "[base]") {
  auto readable = [](int fd) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  };
  xmesh::EventFd own;
  const int a = own.fd(/*ready=*/false);
  REQUIRE(a >= 0);
  CHECK_FALSE(readable(a));
  own.signal();
  own.signal();
  CHECK(readable(a));
  own.clear();
  CHECK_FALSE(readable(a));

  xmesh::EventFd drained(/*drained_outside=*/true);
  const int b = drained.fd(/*ready=*/true);
  CHECK(readable(b));
  uint64_t v;
  REQUIRE(::read(b, &v, sizeof v) == sizeof v);  // the consumer drains it, unseen here
  CHECK_FALSE(readable(b));
  drained.signal();
  CHECK(readable(b));
  drained.clear();
  CHECK_FALSE(readable(b));
}
