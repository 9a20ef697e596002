// ShmRing (runtime/transport/shm_ring.hpp): messages of every size in order across the buffer's end, a
// slow reader holding its writer back without loss or reordering (memory bounded by the
// capacity), two processes sharing one through its memfd, closing ending the peer's waits,
// timeouts, and fds that are not rings refused.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "shm_ring.hpp"

using xmesh::ShmRing;
using R = ShmRing::Result;

namespace {
std::string message_of(uint64_t n, size_t size) {
  std::string m(size, '\0');
  for (size_t i = 0; i < size; ++i) m[i] = static_cast<char>((n * 131 + i * 7) & 0xff);
  if (size >= 8) std::memcpy(m.data(), &n, 8);
  return m;
}
}  // namespace

TEST_CASE("a ring carries messages of every size in order across its end", "[shm_ring]") {
  auto ring = ShmRing::create(4096);
  REQUIRE(ring.max_message() == 2048);
  std::mt19937 rng(7);
  std::deque<std::string> expected;
  std::string got;
  auto read_one = [&] {
    REQUIRE(ring.try_read(got) == R::ok);
    REQUIRE(got == expected.front());
    expected.pop_front();
  };
  for (uint64_t n = 0; n < 5000; ++n) {  // positions walk round the buffer many times
    size_t size = n % 97 == 0 ? ring.max_message() : (n % 13 == 0 ? 0 : rng() % 700);
    while (ring.capacity() - ring.used() < size + 16) read_one();  // room for it, others still in
    expected.push_back(message_of(n, size));
    REQUIRE(ring.try_write(expected.back()) == R::ok);
    if (n % 3 == 2) read_one();  // a few messages stay in, so records straddle the end
  }
  while (!expected.empty()) read_one();
  REQUIRE(ring.used() == 0);
  REQUIRE(ring.try_read(got) == R::empty);
  REQUIRE(ring.try_write(std::string(ring.max_message() + 1, 'x')) == R::too_large);
}

TEST_CASE("messages come out as they went in, in order", "[shm_ring]") {
  auto ring = ShmRing::create(8192);
  std::string got;
  for (uint64_t n = 0; n < 2000; ++n) {
    std::string m = message_of(n, 8 + n % 1500);
    REQUIRE(ring.try_write(m) == R::ok);
    REQUIRE(ring.try_read(got) == R::ok);
    REQUIRE(got == m);
  }
}

TEST_CASE("a slow reader holds its writer back: nothing lost or reordered, memory bounded", "[shm_ring]") {
  auto ring = ShmRing::create(4096);
  constexpr uint64_t kCount = 20000;
  std::atomic<size_t> most_used{0};
  std::thread writer([&] {
    std::mt19937 rng(11);
    for (uint64_t n = 0; n < kCount; ++n) REQUIRE(ring.write(message_of(n, 8 + rng() % 900), -1) == R::ok);
  });
  std::mt19937 rng(11);
  std::string got;
  for (uint64_t n = 0; n < kCount; ++n) {
    if (n % 1000 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the slow reader
    most_used = std::max<size_t>(most_used, ring.used());
    REQUIRE(ring.read(got, 10000) == R::ok);
    REQUIRE(got == message_of(n, 8 + rng() % 900));
  }
  writer.join();
  REQUIRE(most_used <= ring.capacity());
  REQUIRE(most_used > ring.capacity() / 2);  // it did fill up: the writer waited for space
}

TEST_CASE("two processes share a ring through its memfd", "[shm_ring]") {
  auto to_child = ShmRing::create(4096);
  auto to_parent = ShmRing::create(4096);
  pid_t pid = fork();
  if (pid == 0) {  // the child: echo what comes, then leave; only async-signal-safe paths matter little here
    auto in = ShmRing::attach(to_child.fd());
    auto out = ShmRing::attach(to_parent.fd());
    std::string m;
    while (in.read(m, 10000) == R::ok) out.write(m, 10000);
    out.close();
    _exit(0);
  }
  std::string got;
  for (uint64_t n = 0; n < 3000; ++n) {
    std::string m = message_of(n, n % 1800);
    REQUIRE(to_child.write(m, 10000) == R::ok);
    REQUIRE(to_parent.read(got, 10000) == R::ok);
    REQUIRE(got == m);
  }
  to_child.close();
  REQUIRE(to_parent.read(got, 10000) == R::closed);  // the child closed its side as it left
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}

TEST_CASE("closing a ring ends the other side's waits, after what was written", "[shm_ring]") {
  auto ring = ShmRing::create(4096);
  REQUIRE(ring.try_write("last words") == R::ok);
  std::string got;
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ring.close();
  });
  REQUIRE(ring.read(got, -1) == R::ok);
  REQUIRE(got == "last words");
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE(ring.read(got, -1) == R::closed);  // woken by the close, not a timeout
  REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  closer.join();
  REQUIRE(ring.try_write("more") == R::closed);

  auto full = ShmRing::create(4096);
  while (full.try_write(std::string(1000, 'x')) == R::ok) {
  }
  std::thread reader_leaves([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    full.close();  // a reader that died, closed by whoever learned it
  });
  REQUIRE(full.write(std::string(1000, 'y'), -1) == R::closed);
  reader_leaves.join();
}

TEST_CASE("waits time out", "[shm_ring]") {
  auto ring = ShmRing::create(4096);
  std::string got;
  REQUIRE(ring.read(got, 30) == R::timed_out);
  while (ring.try_write(std::string(1000, 'x')) == R::ok) {
  }
  REQUIRE(ring.write(std::string(1000, 'y'), 30) == R::timed_out);
}

TEST_CASE("fds that are not rings are refused, naming why", "[shm_ring]") {
  REQUIRE_THROWS_WITH(ShmRing::create(5000), "a ring's capacity is a power of two from 4 KiB to 1 GiB, not 5000");
  int plain = memfd_create("plain", MFD_CLOEXEC);
  REQUIRE(ftruncate(plain, 8192) == 0);
  REQUIRE_THROWS_WITH(ShmRing::attach(plain), "the fd is not a sealed xmesh ring (it could shrink under this process)");
  close(plain);
  int sealed = memfd_create("sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(ftruncate(sealed, 8192) == 0);
  REQUIRE(fcntl(sealed, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
  REQUIRE_THROWS_WITH(ShmRing::attach(sealed), "the fd is not an xmesh ring (its header does not match its size)");
  close(sealed);
}

namespace {
// The shared header as a hostile peer sees it (the layout of shm_ring.cpp's Header): the
// capacity at byte 8, the writer's position at 64, the reader's at 128.
struct HostileView {
  explicit HostileView(const ShmRing& ring) {
    base = static_cast<char*>(mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, ring.fd(), 0));
    REQUIRE(base != MAP_FAILED);
  }
  ~HostileView() { munmap(base, 8192); }
  void put(size_t offset, uint64_t value) { std::memcpy(base + offset, &value, 8); }
  uint64_t get(size_t offset) const {
    uint64_t v;
    std::memcpy(&v, base + offset, 8);
    return v;
  }
  char* base;
};
constexpr size_t kCapacityAt = 8, kHeadAt = 64, kTailAt = 128;
}  // namespace

// A proc's buggy native code may scribble on the mapping: a capacity grown to 1 GiB after attach
// must not make either side copy past the 4 KiB it mapped (it read its own copy at attach).
TEST_CASE("a capacity rewritten after attach bounds nothing: copies stay inside the mapping", "[shm_ring]") {
  auto writer = ShmRing::create(4096);
  auto reader = ShmRing::attach(writer.fd());
  HostileView peer(writer);
  peer.put(kCapacityAt, uint64_t(1) << 30);
  REQUIRE(reader.capacity() == 4096);
  REQUIRE(reader.max_message() == 2048);
  std::string got;
  for (uint64_t n = 0; n < 200; ++n) {  // round the buffer many times: records straddle its end
    std::string m = message_of(n, 100 + n * 13 % 1900);
    REQUIRE(writer.write(m, 1000) == R::ok);
    REQUIRE(reader.read(got, 1000) == R::ok);
    REQUIRE(got == m);
  }
  REQUIRE(writer.try_write(std::string(3000, 'x')) == R::too_large);  // its own limit, not the peer's
}

TEST_CASE("positions that do not add up close the ring as corrupt, on either side", "[shm_ring]") {
  SECTION("the writer's position far past the reader's (head 2^62)") {
    auto writer = ShmRing::create(4096);
    auto reader = ShmRing::attach(writer.fd());
    REQUIRE(writer.try_write("before") == R::ok);
    HostileView(writer).put(kHeadAt, uint64_t(1) << 62);
    std::string got;
    REQUIRE(reader.try_read(got) == R::corrupt);
    REQUIRE(reader.closed());
    REQUIRE(writer.try_write("after") == R::closed);
  }
  SECTION("the reader's position ahead of what was written") {
    auto writer = ShmRing::create(4096);
    auto reader = ShmRing::attach(writer.fd());
    REQUIRE(writer.try_write("one") == R::ok);
    HostileView(writer).put(kTailAt, uint64_t(1) << 40);
    REQUIRE(writer.try_write("two") == R::corrupt);
    REQUIRE(writer.closed());
  }
  SECTION("a record length past the record area (0xffffffff)") {
    auto writer = ShmRing::create(4096);
    auto reader = ShmRing::attach(writer.fd());
    REQUIRE(writer.try_write("twelve bytes") == R::ok);
    HostileView view(writer);
    const uint32_t huge = 0xffffffffu;
    std::memcpy(view.base + 4096, &huge, 4);  // the first record's length, at the start of the data
    std::string got;
    REQUIRE(reader.try_read(got) == R::corrupt);
    REQUIRE(got.empty());
  }
  SECTION("a peer moving its own copy of this side's position changes nothing here") {
    auto writer = ShmRing::create(4096);
    auto reader = ShmRing::attach(writer.fd());
    REQUIRE(writer.try_write("first") == R::ok);
    REQUIRE(writer.try_write("second") == R::ok);
    HostileView view(writer);
    view.put(kTailAt, view.get(kHeadAt));  // "everything was read": the reader knows better
    std::string got;
    REQUIRE(reader.try_read(got) == R::ok);
    REQUIRE(got == "first");
    REQUIRE(reader.try_read(got) == R::ok);
    REQUIRE(got == "second");
  }
  SECTION("attaching to a ring whose positions are already wrong is refused") {
    auto writer = ShmRing::create(4096);
    HostileView(writer).put(kHeadAt, 1 << 20);
    REQUIRE_THROWS_WITH(ShmRing::attach(writer.fd()), Catch::Contains("positions do not add up"));
  }
}
