// ShmRing (runtime/shm_ring.hpp): messages of every size in order across the buffer's end, a
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
