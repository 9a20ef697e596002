// unique_fd (runtime/base/unique_fd.hpp): the one owner of a descriptor.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <utility>

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
