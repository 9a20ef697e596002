// The data plane's parts (issue 24): the owner's BufferRegistry (ids, leases, drops) and
// cross-process copies on one host (process_memory.hpp), between this process and a forked child.
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "bodies.hpp"
#include "buffer_registry.hpp"
#include "node.hpp"
#include "process_memory.hpp"

using namespace xmesh;

TEST_CASE("a lent buffer is leased by id for ranges inside it, and goes once dropped and released", "[data_plane]") {
  BufferRegistry reg;
  std::vector<char> mem(1000), ro(10);
  const uint64_t id = reg.lend(mem.data(), mem.size(), true);
  const uint64_t ro_id = reg.lend(ro.data(), ro.size(), false);
  REQUIRE(id != ro_id);
  CHECK(reg.lent() == 2);
  std::string why;
  auto whole = reg.lease(id, 0, 1000, false, &why);
  REQUIRE(whole.id == id);
  CHECK(whole.addr == mem.data());
  CHECK(whole.size == 1000);
  auto tail = reg.lease(id, 990, 10, true, &why);
  REQUIRE(tail.id == id);
  CHECK(tail.addr == mem.data() + 990);
  // Outside the buffer, wrapping around, another id, a write into read-only memory: refused.
  CHECK(reg.lease(id, 991, 10, false, &why).id == 0);
  CHECK_THAT(why, Catch::Contains("not inside the buffer (1000 bytes)"));
  CHECK(reg.lease(id, 5, UINT64_MAX - 2, false, &why).id == 0);
  CHECK(reg.lease(id ^ 1, 0, 1, false, &why).id == 0);
  CHECK_THAT(why, Catch::Contains("dropped (or never lent"));
  CHECK(reg.lease(ro_id, 0, 10, true, &why).id == 0);
  CHECK_THAT(why, Catch::Contains("read-only"));
  CHECK(reg.lease(ro_id, 0, 10, false, &why).id == ro_id);
  // Dropped while leased: no new lease, the memory held until the last lease ends.
  CHECK(reg.drop(id) == 2);
  CHECK(reg.lease(id, 0, 1, false, &why).id == 0);
  CHECK(reg.holds(id));
  CHECK(reg.lent() == 1);
  CHECK_FALSE(reg.release(id, whole.number));
  CHECK(reg.release(id, tail.number));  // the last: it goes
  CHECK_FALSE(reg.holds(id));
  CHECK(reg.drop(id) == -1);
  CHECK(reg.drop(ro_id) == 1);
  CHECK_THROWS_AS(reg.lend(mem.data(), 0, true), std::invalid_argument);
}

namespace {
char pattern(size_t i, int seed) { return static_cast<char>((i * 131 + seed * 7) & 0xff); }

// A forked child holding `size` bytes at the address `mem` has here, filled with pattern(seed 1)
// after the fork. It says "ready", waits for "check", then answers whether its memory holds
// pattern(seed 2), and exits.
struct Child {
  pid_t pid = -1;
  int to[2], from[2];
  Child(char* mem, size_t size) {
    REQUIRE(pipe(to) == 0);
    REQUIRE(pipe(from) == 0);
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      for (size_t i = 0; i < size; ++i) mem[i] = pattern(i, 1);
      char c = 'r';
      if (write(from[1], &c, 1) != 1) _exit(2);
      if (read(to[0], &c, 1) != 1) _exit(2);
      bool ok = true;
      for (size_t i = 0; i < size && ok; ++i) ok = mem[i] == pattern(i, 2);
      c = ok ? 'y' : 'n';
      if (write(from[1], &c, 1) != 1) _exit(2);
      _exit(0);
    }
    char c = 0;
    REQUIRE(read(from[0], &c, 1) == 1);
  }
  char check() {
    char c = 'c';
    REQUIRE(write(to[1], &c, 1) == 1);
    REQUIRE(read(from[0], &c, 1) == 1);
    int status = 0;
    waitpid(pid, &status, 0);
    for (int fd : {to[0], to[1], from[0], from[1]}) close(fd);
    return c;
  }
};
}  // namespace

TEST_CASE("another process's memory is read and written in one copy, whole, at every size", "[data_plane]") {
  for (size_t size : {size_t(1), size_t(4097), size_t(64) << 20}) {
    INFO(size);
    std::vector<char> mem(size, 0), local(size, 0);
    Child child(mem.data(), size);
    REQUIRE(read_process_memory(child.pid, mem.data(), local.data(), size));
    bool same = true;
    for (size_t i = 0; i < size && same; ++i) same = local[i] == pattern(i, 1);
    CHECK(same);
    for (size_t i = 0; i < size; ++i) local[i] = pattern(i, 2);
    REQUIRE(write_process_memory(child.pid, mem.data(), local.data(), size));
    CHECK(child.check() == 'y');
  }
}

TEST_CASE("a copy from a process that is gone, or outside its memory, says why", "[data_plane]") {
  std::vector<char> mem(64), local(64);
  Child child(mem.data(), mem.size());
  auto outside = read_process_memory(child.pid, reinterpret_cast<void*>(4096), local.data(), 64);
  CHECK(outside.status == ProcessCopy::Status::bad_address);
  CHECK_THAT(outside.why, Catch::Contains("process " + std::to_string(child.pid)));
  CHECK(child.check() == 'n');  // it exits (nothing was written into it)
  auto gone = read_process_memory(child.pid, mem.data(), local.data(), 64);
  CHECK(gone.status == ProcessCopy::Status::gone);
  CHECK_THAT(gone.why, Catch::Contains("is gone"));
}

namespace {
// One BufferLease (or BufferDrop) from `from` to the owner node at `owner`: its one answer.
CallResult ask(Node& from, const std::string& owner, Kind kind, const json& body) {
  Header h;
  h.kind = kind;
  h.body = body;
  auto c = from.call({Target{owner, ""}}, h, {}, true);
  REQUIRE(c->wait_done(10000));
  auto got = c->take();
  REQUIRE(got.size() == 1);
  return std::move(got[0]);
}
}  // namespace

// The lease messages between two nodes (here in one process: the copy is from this process's
// own memory, as it would be from another's): a lease answered with where the range is, a copy
// from there, the release; a write lease into read-only memory, a range outside, a malformed
// request and a dropped buffer refused naming why; a drop answered with the leases still held.
TEST_CASE("a node answers leases on the buffers its process lends, and refuses the rest saying why", "[data_plane][node]") {
  Node owner("proc", "ipc:///tmp/xmesh-test-" + std::to_string(getpid()) + "-buf-o", "k");
  Node reader("controller", "ipc:///tmp/xmesh-test-" + std::to_string(getpid()) + "-buf-r", "k");
  for (Node* n : {&owner, &reader}) {
    n->set_default_cookie("k");
    n->start();
  }
  std::vector<char> mem(1 << 20);
  for (size_t i = 0; i < mem.size(); ++i) mem[i] = pattern(i, 3);
  const uint64_t id = owner.buffers().lend(mem.data(), mem.size(), false);
  auto leased = ask(reader, owner.addr(), Kind::BufferLease, BufferLeaseBody{id, 4096, 65536, false});
  REQUIRE(leased.ok);
  auto where = read_as<BufferLeaseReply>(leased.body, nullptr);
  REQUIRE(where);
  CHECK(where->pid == getpid());
  std::vector<char> local(65536);
  REQUIRE(read_process_memory(static_cast<pid_t>(where->pid), reinterpret_cast<void*>(where->addr), local.data(),
                              local.size()));
  CHECK(std::memcmp(local.data(), mem.data() + 4096, local.size()) == 0);

  auto refused = [&](const json& body, Kind kind = Kind::BufferLease) {
    auto r = ask(reader, owner.addr(), kind, body);
    CHECK_FALSE(r.ok);
    CHECK(r.body.value("kind", "") == "buffer");
    return r.body.value("text", "");
  };
  CHECK_THAT(refused(BufferLeaseBody{id, 0, 16, true}), Catch::Contains("read-only"));
  CHECK_THAT(refused(BufferLeaseBody{id, mem.size() - 8, 16, false}), Catch::Contains("not inside the buffer"));
  CHECK_THAT(refused(json{{"buffer", "not a number"}}), Catch::Contains("malformed buffer-lease request"));
  CHECK_THAT(refused(BufferLeaseBody{id + 1, 0, 16, false}), Catch::Contains("dropped (or never lent"));

  // Dropped while the lease holds it: refused from then on, the memory held until the release.
  auto dropped = ask(reader, owner.addr(), Kind::BufferDrop, BufferReleaseBody{id, 0});
  REQUIRE(dropped.ok);
  CHECK(dropped.body.value("leases", -1) == 1);
  CHECK_THAT(refused(BufferLeaseBody{id, 0, 16, false}), Catch::Contains("dropped"));
  CHECK(owner.buffers().holds(id));
  Header release;
  release.kind = Kind::BufferRelease;
  release.body = BufferReleaseBody{id, where->lease};
  reader.call({Target{owner.addr(), ""}}, release, {}, false);
  for (int i = 0; i < 500 && owner.buffers().holds(id); ++i) usleep(10000);
  CHECK_FALSE(owner.buffers().holds(id));
  CHECK_THAT(refused(BufferReleaseBody{id, 0}, Kind::BufferDrop), Catch::Contains("dropped"));
  reader.stop();
  owner.stop();
}
