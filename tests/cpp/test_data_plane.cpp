// The data plane's parts (issue 24): the owner's BufferRegistry (ids, leases, drops) and
// cross-process copies on one host (process_memory.hpp), between this process and a forked child.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "bodies.hpp"
#include "data_bodies.hpp"
#include "buffer_registry.hpp"
#include "buffer_stream.hpp"
#include "data_node.hpp"
#include "data_plane.hpp"
#include "device_memory.hpp"
#include "ibverbs_probe.hpp"
#include "node.hpp"
#include "process_memory.hpp"
#include "rdma_nic.hpp"
#include "record_cipher.hpp"
#include "simulated_rdma_nic.hpp"
#include "tcp_endpoint.hpp"
#include "tcp_lane.hpp"
#include "util.hpp"

using namespace xmesh;

TEST_CASE("a lent buffer is leased by id for ranges inside it, and goes once dropped and released", "[data_plane]") {
  BufferRegistry reg;
  std::vector<char> mem(1000), ro(10);
  const uint64_t id = reg.lend(mem.data(), mem.size(), true);
  const uint64_t ro_id = reg.lend(ro.data(), ro.size(), false);
  REQUIRE(id != ro_id);
  CHECK(reg.lent() == 2);
  std::string why;
  auto whole = reg.lease(id, 0, 1000, false, "reader", &why);
  REQUIRE(whole.id == id);
  CHECK(whole.addr == mem.data());
  CHECK(whole.size == 1000);
  auto tail = reg.lease(id, 990, 10, true, "reader", &why);
  REQUIRE(tail.id == id);
  CHECK(tail.addr == mem.data() + 990);
  // Outside the buffer, wrapping around, another id, a write into read-only memory: refused.
  CHECK(reg.lease(id, 991, 10, false, "reader", &why).id == 0);
  CHECK_THAT(why, Catch::Contains("not inside the buffer (1000 bytes)"));
  CHECK(reg.lease(id, 5, UINT64_MAX - 2, false, "reader", &why).id == 0);
  CHECK(reg.lease(id ^ 1, 0, 1, false, "reader", &why).id == 0);
  CHECK_THAT(why, Catch::Contains("dropped (or never lent"));
  CHECK(reg.lease(ro_id, 0, 10, true, "reader", &why).id == 0);
  CHECK_THAT(why, Catch::Contains("read-only"));
  CHECK(reg.lease(ro_id, 0, 10, false, "reader", &why).id == ro_id);
  // Dropped while leased: no new lease, the memory held until the last lease ends.
  CHECK(reg.drop(id) == 2);
  CHECK(reg.lease(id, 0, 1, false, "reader", &why).id == 0);
  CHECK(reg.holds(id));
  CHECK(reg.lent() == 1);
  CHECK_FALSE(reg.release(id, whole.number, "reader"));
  CHECK_FALSE(reg.release(id, tail.number, "someone else"));  // only its holder ends a lease
  CHECK(reg.holds(id));
  CHECK(reg.release(id, tail.number, "reader"));  // the last: it goes
  CHECK_FALSE(reg.holds(id));
  CHECK(reg.drop(id) == -1);
  // A holder that died: its leases end, and a dropped buffer they held goes.
  auto held = reg.lease(ro_id, 0, 10, false, "dead reader", &why);
  auto other = reg.lease(ro_id, 0, 10, false, "live reader", &why);
  REQUIRE((held.id && other.id));
  CHECK(reg.drop(ro_id) == 3);  // the earlier lease of "reader" is still held too
  CHECK(reg.release_holder("dead reader") == 1);
  CHECK(reg.release_holder("reader") == 1);
  CHECK(reg.holds(ro_id));
  CHECK(reg.release_holder("live reader") == 1);
  CHECK_FALSE(reg.holds(ro_id));
  CHECK_THROWS_AS(reg.lend(mem.data(), 0, true), std::invalid_argument);
}

namespace {
char pattern(size_t i, int seed) { return static_cast<char>((i * 131 + seed * 7) & 0xff); }
std::vector<char> patterned(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = pattern(i, seed);
  return v;
}

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
    n->transport().cookies().present_by_default("k");
    DataNode::attach(*n);
    n->start();
  }
  std::vector<char> mem = patterned(1 << 20, 3);
  const uint64_t id = DataNode::of(owner).buffers().lend(mem.data(), mem.size(), false);
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
  CHECK(DataNode::of(owner).buffers().holds(id));
  Header release;
  release.kind = Kind::BufferRelease;
  release.body = BufferReleaseBody{id, where->lease};
  reader.call({Target{owner.addr(), ""}}, release, {}, false);
  for (int i = 0; i < 500 && DataNode::of(owner).buffers().holds(id); ++i) usleep(10000);
  CHECK_FALSE(DataNode::of(owner).buffers().holds(id));
  CHECK_THAT(refused(BufferReleaseBody{id, 0}, Kind::BufferDrop), Catch::Contains("dropped"));
  reader.stop();
  owner.stop();
}

namespace {
// The answer a transfer's Call got: "" when ok, else "<kind>: <text>".
std::string outcome(Call& c) {
  auto got = c.take();
  REQUIRE(got.size() == 1);
  if (got[0].ok) return "";
  return got[0].body.value("kind", "") + ": " + got[0].body.value("text", "");
}

struct TwoNodes {
  Node owner{"proc", "ipc:///tmp/xmesh-test-" + std::to_string(getpid()) + "-dp-o", "k"};
  Node reader{"controller", "ipc:///tmp/xmesh-test-" + std::to_string(getpid()) + "-dp-r", "k"};
  TwoNodes() {
    for (Node* n : {&owner, &reader}) {
      n->transport().cookies().present_by_default("k");
      DataNode::attach(*n);
      n->start();
    }
  }
  ~TwoNodes() {
    reader.stop();
    owner.stop();
  }
};
}  // namespace

// The data threads: a batch of reads and writes answered once all are done and their memory let
// go after; a batch with a refused op fails naming it; a timeout of 0 times out; a batch queued
// behind a long copy times out without waiting for a data thread to come free.
TEST_CASE("the data plane runs batches of transfers and answers each batch once", "[data_plane]") {
  TwoNodes n;
  std::vector<char> mem = patterned(3 << 20, 4);
  std::vector<char> ro(100);
  const uint64_t id = DataNode::of(n.owner).buffers().lend(mem.data(), mem.size(), true);
  const uint64_t ro_id = DataNode::of(n.owner).buffers().lend(ro.data(), ro.size(), false);
  DataPlane plane(n.reader, 2);
  std::vector<char> a(1 << 20), b(2 << 20), src(4096, 'w');
  std::atomic<int> finished{0};
  auto call = plane.submit({{n.owner.addr(), id, 0, a.size(), a.data(), false},
                            {n.owner.addr(), id, a.size(), b.size(), b.data(), false},
                            {n.owner.addr(), id, 100, src.size(), src.data(), true}},
                           10000, [&] { ++finished; });
  REQUIRE(call->wait_done(10000));
  CHECK(outcome(*call).empty());
  for (int i = 0; i < 500 && finished == 0; ++i) usleep(1000);
  CHECK(finished == 1);
  CHECK(std::memcmp(a.data() + 4196, mem.data() + 4196, a.size() - 4196) == 0);  // past the write (in parallel)
  CHECK(std::memcmp(b.data(), mem.data() + a.size(), b.size()) == 0);
  CHECK(std::all_of(mem.begin() + 100, mem.begin() + 4196, [](char c) { return c == 'w'; }));
  CHECK(plane.stats().same_host == 3);
  CHECK(plane.stats().bytes == a.size() + b.size() + src.size());

  auto refused = plane.submit({{n.owner.addr(), id, 0, 10, a.data(), false},
                               {n.owner.addr(), ro_id, 0, 10, src.data(), true}},
                              10000, [&] { ++finished; });
  REQUIRE(refused->wait_done(10000));
  CHECK_THAT(outcome(*refused), Catch::StartsWith("buffer: ") && Catch::Contains("read-only"));
  auto at_once = plane.submit({{n.owner.addr(), id, 0, 10, a.data(), false}}, 0, nullptr);
  REQUIRE(at_once->wait_done(10000));
  CHECK_THAT(outcome(*at_once), Catch::StartsWith("timeout: ") && Catch::Contains("did not finish within"));
  CHECK_THROWS_AS(plane.submit({}, 100, nullptr), std::invalid_argument);
  CHECK_THROWS_AS(plane.submit({{n.owner.addr(), id, 0, 0, a.data(), false}}, 100, nullptr), std::invalid_argument);
  // Every lease ends (releases are one-way messages: they arrive shortly): the dropped buffer
  // goes.
  CHECK(DataNode::of(n.owner).buffers().drop(id) >= 0);
  for (int i = 0; i < 500 && DataNode::of(n.owner).buffers().holds(id); ++i) usleep(1000);
  CHECK_FALSE(DataNode::of(n.owner).buffers().holds(id));
}

TEST_CASE("a batch queued behind a long copy times out without waiting for it", "[data_plane]") {
  TwoNodes n;
  std::vector<char> mem(size_t(256) << 20, 1), dst(mem.size()), small(10);
  const uint64_t id = DataNode::of(n.owner).buffers().lend(mem.data(), mem.size(), false);
  setenv("XMESH_DATA_STEP_PAUSE_MS", "200", 1);  // 4 steps of 64 MiB: >= 600 ms
  DataPlane plane(n.reader, 1);
  unsetenv("XMESH_DATA_STEP_PAUSE_MS");
  auto long_copy = plane.submit({{n.owner.addr(), id, 0, mem.size(), dst.data(), false}}, 30000, nullptr);
  usleep(50000);
  auto queued = plane.submit({{n.owner.addr(), id, 0, small.size(), small.data(), false}}, 100, nullptr);
  REQUIRE(queued->wait_done(10000));
  CHECK_FALSE(long_copy->done());  // answered while the only data thread still copies
  CHECK_THAT(outcome(*queued), Catch::StartsWith("timeout: "));
  REQUIRE(long_copy->wait_done(10000));
  CHECK(outcome(*long_copy).empty());
  CHECK(dst == mem);
}

TEST_CASE("the leases of a reader that died end with it", "[data_plane][node]") {
  TwoNodes n;
  std::vector<char> mem(4096);
  const uint64_t id = DataNode::of(n.owner).buffers().lend(mem.data(), mem.size(), true);
  auto leased = ask(n.reader, n.owner.addr(), Kind::BufferLease, BufferLeaseBody{id, 0, 4096, true});
  REQUIRE(leased.ok);
  CHECK(DataNode::of(n.owner).buffers().drop(id) == 1);  // the reader's copy holds the memory...
  n.owner.mark_dead(n.reader.addr(), error_body(ErrorKind::Supervision, "killed"));
  CHECK_FALSE(DataNode::of(n.owner).buffers().holds(id));  // ...until its death is known
}

TEST_CASE("records open only whole, under their key, as the record they were sealed as", "[data_plane][crypto]") {
  for (auto kind : {RecordCipherKind::aes256gcm, RecordCipherKind::chacha20poly1305}) {
    INFO(record_cipher_name(kind));
    const std::string key(kRecordKeyBytes, 'k');
    RecordCipher a(kind, key), b(kind, key), other(kind, std::string(kRecordKeyBytes, 'o'));
    std::string plain(100000, '\0');
    for (size_t i = 0; i < plain.size(); ++i) plain[i] = pattern(i, 6);
    std::string sealed(plain.size() + kRecordTagBytes, '\0'), out(plain.size(), '\0');
    a.seal(3, 7, plain.data(), plain.size(), sealed.data());
    CHECK(sealed.compare(0, plain.size(), plain) != 0);
    REQUIRE(b.open(3, 7, sealed.data(), plain.size(), out.data()));
    CHECK(out == plain);
    CHECK_FALSE(b.open(3, 8, sealed.data(), plain.size(), out.data()));  // another record number
    CHECK_FALSE(b.open(4, 7, sealed.data(), plain.size(), out.data()));  // another stream
    CHECK_FALSE(other.open(3, 7, sealed.data(), plain.size(), out.data()));
    sealed[500] ^= 1;
    CHECK_FALSE(b.open(3, 7, sealed.data(), plain.size(), out.data()));
    a.seal(0, 0, nullptr, 0, sealed.data());  // an empty record: the tag alone
    CHECK(b.open(0, 0, sealed.data(), 0, out.data()));
    a.seal(1, 1, plain.data(), 10, &plain[0]);  // in place
    CHECK(b.open(1, 1, plain.data(), 10, &plain[0]));
    CHECK(plain[3] == pattern(3, 6));
  }
  RecordCipherKind k;
  CHECK(parse_record_cipher("aes-256-gcm", &k));
  CHECK_FALSE(parse_record_cipher("rot13", &k));
  CHECK_THROWS_AS(RecordCipher(RecordCipherKind::aes256gcm, "short"), std::invalid_argument);
}

namespace {
// A raw connection to a stream server: sends `bytes`, returns what comes back until it closes.
std::string raw_exchange(const std::string& address, const std::string& bytes) {
  auto to = TcpEndpoint::parse(address);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(to.port));
  inet_pton(AF_INET, to.host.c_str(), &sa.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
  ::shutdown(fd, SHUT_WR);
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return got;
}

std::string hello(const std::string& token, uint32_t stream, uint64_t offset, uint64_t length) {
  std::string h = "XMDS" + token;
  for (int i = 0; i < 4; ++i) h += static_cast<char>(stream >> (8 * i));
  for (int i = 0; i < 8; ++i) h += static_cast<char>(offset >> (8 * i));
  for (int i = 0; i < 8; ++i) h += static_cast<char>(length >> (8 * i));
  return h + "!";
}
}  // namespace

// The stream path between two hosts, here on loopback: reads and writes of every size over one
// or several streams land whole; a hello with no lease's token, a stream number used twice, a
// range outside the lease and junk are refused naming why; a write whose records do not open
// leaves the buffer untouched; the grant stops working once its lease ends.
TEST_CASE("a buffer's bytes stream whole, sealed, and only to the holder of its grant", "[data_plane][stream]") {
  BufferRegistry reg;
  BufferStreamServer server(reg, "127.0.0.1", "127.0.0.1");
  REQUIRE_THAT(server.address(), Catch::StartsWith("tcp://127.0.0.1:"));
  std::vector<char> mem = patterned(size_t(20) << 20, 7);
  const uint64_t id = reg.lend(mem.data(), mem.size(), true);
  auto always = [] { return true; };
  std::string why;
  for (uint64_t size : {uint64_t(1), uint64_t(kStreamRecord), uint64_t(kStreamRecord + 1), uint64_t(20) << 20}) {
    for (int streams : {1, 3}) {
      INFO(size << " bytes, " << streams << " streams");
      auto lease = reg.lease(id, 0, size, false, "reader", &why, true);
      REQUIRE(lease.id);
      StreamGrant grant{server.address(), lease.token, lease.key, preferred_record_cipher()};
      std::vector<char> dst(size);
      auto got = stream_transfer(grant, dst.data(), size, false, streams, always);
      REQUIRE(got);
      CHECK(std::memcmp(dst.data(), mem.data(), size) == 0);
      reg.release(id, lease.number, "reader");
    }
  }
  // A write into the middle, over three streams.
  const uint64_t at = 1 << 20, size = 5 * kStreamRecord + 17;
  std::vector<char> src(size, 'W');
  auto lease = reg.lease(id, at, size, true, "writer", &why, true);
  REQUIRE(stream_transfer({server.address(), lease.token, lease.key, preferred_record_cipher()}, src.data(), size,
                          true, 3, always));
  CHECK(std::all_of(mem.begin() + at, mem.begin() + at + size, [](char c) { return c == 'W'; }));
  CHECK(mem[at - 1] == pattern(at - 1, 7));
  CHECK(mem[at + size] == pattern(at + size, 7));

  // Refusals, each said.
  CHECK_THAT(raw_exchange(server.address(), hello(std::string(16, 'x'), 0, 0, 10)), Catch::Contains("no lease has that token"));
  CHECK_THAT(raw_exchange(server.address(), hello(lease.token, 0, 0, 10)), Catch::Contains("stream 0 of this lease was used"));
  CHECK_THAT(raw_exchange(server.address(), hello(lease.token, 9, size, 1)), Catch::Contains("not inside the lease"));
  std::string no_go = hello(lease.token, 8, 0, 10);
  no_go.back() = 'x';
  CHECK_THAT(raw_exchange(server.address(), no_go), Catch::Contains("no go byte"));
  CHECK_THAT(raw_exchange(server.address(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(20, ' ')),
             Catch::Contains("not a data-plane stream"));
  // A writer without the key: its records do not open, nothing lands.
  const std::string forged = hello(lease.token, 5, 0, 100) + std::string(100 + kRecordTagBytes, 'F');
  const std::string answer = raw_exchange(server.address(), forged);
  CHECK(answer == "Y");  // accepted, then closed without the acknowledgement
  CHECK(std::all_of(mem.begin() + at, mem.begin() + at + size, [](char c) { return c == 'W'; }));
  // With a wrong key through the real client: broken, saying why.
  auto read_lease = reg.lease(id, 0, 100, false, "writer", &why, true);
  auto bad = stream_transfer({server.address(), read_lease.token, std::string(kRecordKeyBytes, 'z'),
                              preferred_record_cipher()}, src.data(), 100, false, 1, always);
  CHECK(bad.status == StreamOutcome::Status::broken);
  CHECK_THAT(bad.why, Catch::Contains("did not open"));
  reg.release(id, lease.number, "writer");
  auto ended = stream_transfer({server.address(), lease.token, lease.key, preferred_record_cipher()}, src.data(), 10,
                               false, 1, always);
  CHECK(ended.status == StreamOutcome::Status::refused);
  CHECK_THAT(ended.why, Catch::Contains("no lease has that token"));
  CHECK(server.stats().refused == 6);  // counted before each answer went
  CHECK(server.stats().broken >= 1);  // the forged write
}

// A reader keeps its connection to an owner's stream listener for the next stream (the owner
// serves hello after hello on it); one the owner closed after its idle time is not used again.
TEST_CASE("stream connections are kept between transfers, until the owner's idle time", "[data_plane][stream]") {
  BufferRegistry reg;
  BufferStreamServer server(reg, "127.0.0.1", "127.0.0.1");
  std::vector<char> mem = patterned(3 * kStreamRecord, 9);
  const uint64_t id = reg.lend(mem.data(), mem.size(), true);
  auto always = [] { return true; };
  std::string why;
  auto transfer = [&](bool write, char fill) {
    auto lease = reg.lease(id, 0, mem.size(), write, "reader", &why, true);
    REQUIRE(lease.id);
    std::vector<char> local(mem.size(), fill);
    REQUIRE(stream_transfer({server.address(), lease.token, lease.key, preferred_record_cipher()}, local.data(),
                            local.size(), write, 1, always));
    reg.release(id, lease.number, "reader");
    return local;
  };
  CHECK(transfer(false, 0) == mem);
  transfer(true, 'k');
  CHECK(std::all_of(mem.begin(), mem.end(), [](char c) { return c == 'k'; }));
  CHECK(transfer(false, 0) == mem);
  // (the server counts a stream once it sent its last record: a moment after the reader has it)
  for (int i = 0; i < 500 && server.stats().streams < 3; ++i) usleep(1000);
  CHECK(server.stats().streams == 3);
  CHECK(server.stats().connections == 1);
  setenv("XMESH_DATA_IDLE_MS", "300", 1);  // the kept connection waits this long for its next hello
  CHECK(transfer(false, 0) == mem);        // (over the kept one, which then waits 300 ms)
  usleep(900000);
  unsetenv("XMESH_DATA_IDLE_MS");
  CHECK(transfer(false, 0) == mem);  // the owner closed it: a new one
  for (int i = 0; i < 500 && server.stats().streams < 5; ++i) usleep(1000);
  CHECK(server.stats().connections == 2);
  CHECK(server.stats().streams == 5);
  CHECK(server.stats().broken == 0);
}

TEST_CASE("a dropped buffer stays while a stream still copies it", "[data_plane][stream]") {
  BufferRegistry reg;
  std::vector<char> mem(100);
  const uint64_t id = reg.lend(mem.data(), mem.size(), false);
  std::string why;
  auto lease = reg.lease(id, 0, 100, false, "r", &why, true);
  auto pin = reg.pin_stream(lease.token, 0, 0, 100, &why);
  REQUIRE(pin.id == id);
  CHECK(reg.drop(id) == 1);
  CHECK(reg.release_holder("r") == 1);  // the reader died...
  CHECK(reg.holds(id));                 // ...but the stream serving it still reads the memory
  reg.unpin(id);
  CHECK_FALSE(reg.holds(id));
}

// Small transfers with an owner elsewhere (here: streams asked for, as another host's reader
// would get them) travel in the lease's own messages; large ones stream.
TEST_CASE("small transfers go in the lease's messages, large ones stream", "[data_plane][stream]") {
  TwoNodes n;
  std::vector<char> mem = patterned(2 << 20, 8);
  const uint64_t id = DataNode::of(n.owner).buffers().lend(mem.data(), mem.size(), true);
  setenv("XMESH_DATA_TRANSPORT", "stream", 1);
  DataPlane plane(n.reader, 2);
  unsetenv("XMESH_DATA_TRANSPORT");
  std::vector<char> small(1000), big(1 << 20), src(kInlineBytes, 's');
  auto call = plane.submit({{n.owner.addr(), id, 5, small.size(), small.data(), false},
                            {n.owner.addr(), id, 1 << 20, big.size(), big.data(), false},
                            {n.owner.addr(), id, 100, src.size(), src.data(), true}},
                           30000, nullptr);
  REQUIRE(call->wait_done(30000));
  CHECK(outcome(*call).empty());
  CHECK(std::memcmp(small.data(), mem.data() + 5, 95) == 0);  // before the write's range
  CHECK(std::memcmp(big.data(), mem.data() + (1 << 20), big.size()) == 0);
  CHECK(std::all_of(mem.begin() + 100, mem.begin() + 100 + src.size(), [](char c) { return c == 's'; }));
  CHECK(plane.stats().in_messages == 2);
  CHECK(plane.stats().streamed == 1);
  CHECK(plane.stats().same_host == 0);
  // A write in the messages must carry its bytes, all of them, in one frame.
  BufferLeaseBody bare{id, 0, 10, true, "another host", true};
  bare.inline_ = true;
  auto refused = ask(n.reader, n.owner.addr(), Kind::BufferLease, bare);
  CHECK_FALSE(refused.ok);
  CHECK_THAT(refused.body.value("text", ""), Catch::Contains("must carry them in one frame"));
}

TEST_CASE("the ibverbs probe says what it found, and this machine has no device", "[data_plane][ibverbs]") {
  const auto& probe = probe_ibverbs();
  CHECK(&probe == &probe_ibverbs());  // once per process
  if (probe.listed.empty()) {
    CHECK_FALSE(probe.usable);
    CHECK_THAT(probe.why, Catch::Contains("no RDMA device") || Catch::Contains("no libibverbs") ||
                              Catch::Contains("XMESH_IBVERBS=0"));
  } else if (!probe.usable) {
    CHECK_THAT(probe.why, Catch::Contains(probe.listed.front() + ": "));  // the step that failed, per device
  } else {
    CHECK_FALSE(probe.device.empty());
  }
}

// A node with a lane listener takes streams there: the listener hands a connection that opens
// as a stream to the stream server (as the agent's PortMux hands a proc its connections).
TEST_CASE("streams that come to a lane listener are handed to the stream server", "[data_plane][stream][tcp_lane]") {
  BufferRegistry reg;
  BufferStreamServer adopting(reg);
  CHECK(adopting.address().empty());
  LaneListener lanes("127.0.0.1", 0);
  lanes.set_stream_adopter([&](unique_fd fd, std::string early) { adopting.adopt(std::move(fd), std::move(early)); });
  std::atomic<bool> done{false};
  std::thread poller([&] {
    std::vector<std::string> refused;
    while (!done) {
      lanes.poll(now_ms(), &refused);
      usleep(1000);
    }
  });
  std::vector<char> mem = patterned(3 << 20, 9);
  const uint64_t id = reg.lend(mem.data(), mem.size(), false);
  std::string why;
  auto lease = reg.lease(id, 0, mem.size(), false, "r", &why, true);
  std::vector<char> dst(mem.size());
  TcpEndpoint at;
  at.host = "127.0.0.1";
  at.port = lanes.port();
  auto got = stream_transfer({at.str(), lease.token, lease.key, preferred_record_cipher()}, dst.data(), dst.size(),
                             false, 1, [] { return true; });
  done = true;
  poller.join();
  REQUIRE(got);
  CHECK(dst == mem);
  for (int i = 0; i < 500 && adopting.stats().streams < 1; ++i) usleep(1000);
  CHECK(adopting.stats().streams == 1);
}

TEST_CASE("a stream server serves a bounded number of streams at once", "[data_plane][stream]") {
  BufferRegistry reg;
  BufferStreamServer server(reg, "127.0.0.1", "127.0.0.1");
  auto to = TcpEndpoint::parse(server.address());
  auto dial = [&] {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(to.port));
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    return fd;
  };
  std::vector<int> idle;  // connections that never say hello
  for (size_t i = 0; i < kMaxStreams; ++i) idle.push_back(dial());
  for (int i = 0; i < 500 && server.stats().refused == 0; ++i) {
    int extra = dial();  // one past the bound: closed at once
    timeval tv{2, 0};
    setsockopt(extra, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char c;
    CHECK(::recv(extra, &c, 1, 0) == 0);
    ::close(extra);
  }
  CHECK(server.stats().refused == 1);
  for (int fd : idle) ::close(fd);
}

// ---- the RDMA path, over a simulated fabric (simulated_rdma_nic.hpp: no RDMA device here) ----

TEST_CASE("an RDMA address travels as one line, and anything else is refused naming why", "[data_plane][rdma]") {
  RdmaAddress a{0x1234, 0xabcdef, 3, "fe800000000000000000000000000001", 5}, back;
  std::string why;
  REQUIRE(RdmaAddress::parse(a.to_string(), &back, &why));
  CHECK(back.to_string() == a.to_string());
  CHECK((back.qpn == a.qpn && back.psn == a.psn && back.lid == 3 && back.mtu == 5 && back.gid == a.gid));
  REQUIRE(RdmaAddress::parse("17:0:1:4:", &back, &why));  // InfiniBand: no gid
  CHECK(back.gid.empty());
  for (const char* bad : {"", "17", "17:0:1:4", "x:0:1:4:", "17:0:1:99999999999:", "0:0:1:4:", "17:0:1:4:abc",
                          "17:0:1:4:zz800000000000000000000000000001", "-1:0:1:4:"}) {
    CHECK_FALSE(RdmaAddress::parse(bad, &back, &why));
    CHECK_THAT(why, Catch::Contains("RDMA address"));
  }
}

namespace {
using testing::SimulatedFabric;
using testing::SimulatedNic;

// Two nodes whose processes each have a NIC on one simulated fabric, and a data plane that
// treats the owner as on another host (XMESH_DATA_TRANSPORT=remote).
struct RdmaPair : TwoNodes {
  std::shared_ptr<SimulatedFabric> fabric = std::make_shared<SimulatedFabric>();
  std::shared_ptr<SimulatedNic> owner_nic = std::make_shared<SimulatedNic>(fabric, 1);
  std::shared_ptr<SimulatedNic> reader_nic = std::make_shared<SimulatedNic>(fabric, 2);
  explicit RdmaPair(bool owner_has_nic = true) {
    if (owner_has_nic) DataNode::of(owner).set_rdma_nic_source([nic = owner_nic](std::string*) { return nic; });
    DataNode::of(reader).set_rdma_nic_source([nic = reader_nic](std::string*) { return nic; });
  }
  std::unique_ptr<DataPlane> plane(size_t threads = 2) {
    setenv("XMESH_DATA_TRANSPORT", "remote", 1);
    auto p = std::make_unique<DataPlane>(reader, threads);
    unsetenv("XMESH_DATA_TRANSPORT");
    return p;
  }
};
}  // namespace

// Reads and writes between two processes with NICs go by RDMA: one link per pair (made by the
// first lease, kept for the next), the owner's buffer registered once and let go with it, the
// reader's memory registered for each transfer only; small ones still go in the messages.
TEST_CASE("between processes with NICs, transfers go by RDMA over one link per pair", "[data_plane][rdma]") {
  RdmaPair n;
  std::vector<char> mem = patterned(3 << 20, 5);
  std::vector<char> ro(100);
  const uint64_t id = DataNode::of(n.owner).buffers().lend(mem.data(), mem.size(), true);
  const uint64_t ro_id = DataNode::of(n.owner).buffers().lend(ro.data(), ro.size(), false);
  auto plane = n.plane();
  std::vector<char> a((2 << 20) - 7), src(1 << 20, 'r'), small(1000);  // a: up to the write (in parallel)
  auto call = plane->submit({{n.owner.addr(), id, 7, a.size(), a.data(), false},
                             {n.owner.addr(), id, 2 << 20, src.size(), src.data(), true},
                             {n.owner.addr(), id, 0, small.size(), small.data(), false}},
                            10000, nullptr);
  REQUIRE(call->wait_done(10000));
  CHECK(outcome(*call).empty());
  CHECK(std::memcmp(a.data(), mem.data() + 7, a.size()) == 0);
  CHECK(std::all_of(mem.begin() + (2 << 20), mem.end(), [](char c) { return c == 'r'; }));
  CHECK(std::memcmp(small.data(), mem.data(), small.size()) == 0);
  CHECK(plane->stats().rdma == 2);
  CHECK(plane->stats().in_messages == 1);
  CHECK(plane->stats().streamed == 0);
  CHECK(n.fabric->transfers == 2);
  CHECK(DataNode::of(n.owner).rdma_links() == 1);

  std::vector<char> again(kInlineBytes + 1);  // past what goes in the messages
  auto second = plane->submit({{n.owner.addr(), id, 100, again.size(), again.data(), false}}, 10000, nullptr);
  REQUIRE(second->wait_done(10000));
  CHECK(outcome(*second).empty());
  CHECK(std::memcmp(again.data(), mem.data() + 100, again.size()) == 0);
  CHECK(plane->stats().rdma == 3);
  CHECK(DataNode::of(n.owner).rdma_links() == 1);  // the same link
  {
    std::lock_guard<std::mutex> g(n.fabric->mu);
    CHECK(n.fabric->links.size() == 2);  // one each side
  }
  // A read-only buffer is not written, by RDMA either (refused at the lease).
  auto refused = plane->submit({{n.owner.addr(), ro_id, 0, 50, src.data(), true}}, 10000, nullptr);
  REQUIRE(refused->wait_done(10000));
  CHECK_THAT(outcome(*refused), Catch::StartsWith("buffer: ") && Catch::Contains("read-only"));
  // Dropped and released: the registration goes with the buffer (the reader's went after each
  // transfer); the read-only one was never registered.
  CHECK(DataNode::of(n.owner).buffers().drop(id) >= 0);
  for (int i = 0; i < 500 && (DataNode::of(n.owner).buffers().holds(id) || n.fabric->registered() > 0); ++i) usleep(1000);
  CHECK(n.fabric->registered() == 0);
}

// RDMA not for this pair: the owner has no NIC, the fabric does not carry their traffic, or the
// owner's NIC refuses to register the buffer. Each transfer still completes, by stream; after a
// pair failed once it is not tried again.
TEST_CASE("a pair without working RDMA streams instead", "[data_plane][rdma][stream]") {
  std::vector<char> mem = patterned(2 << 20, 6);
  std::vector<char> dst(mem.size());
  SECTION("the owner has no NIC") {
    RdmaPair n(false);
    const uint64_t id = DataNode::of(n.owner).buffers().lend(mem.data(), mem.size(), false);
    auto plane = n.plane();
    auto call = plane->submit({{n.owner.addr(), id, 0, dst.size(), dst.data(), false}}, 10000, nullptr);
    REQUIRE(call->wait_done(10000));
    CHECK(outcome(*call).empty());
    CHECK(dst == mem);
    CHECK(plane->stats().streamed == 1);
    CHECK(plane->stats().rdma == 0);
    CHECK(n.fabric->transfers == 0);
  }
  SECTION("the fabric cannot route between them") {
    RdmaPair n;
    n.fabric->unreachable = true;
    const uint64_t id = DataNode::of(n.owner).buffers().lend(mem.data(), mem.size(), false);
    auto plane = n.plane();
    for (int round = 0; round < 2; ++round) {
      std::fill(dst.begin(), dst.end(), 0);
      auto call = plane->submit({{n.owner.addr(), id, 0, dst.size(), dst.data(), false}}, 10000, nullptr);
      REQUIRE(call->wait_done(10000));
      CHECK(outcome(*call).empty());
      CHECK(dst == mem);
    }
    CHECK(plane->stats().streamed == 2);
    CHECK(plane->stats().rdma == 0);
    CHECK(n.fabric->transfers == 0);  // refused before moving anything, once: not tried again
  }
  SECTION("the owner's NIC will not register the buffer") {
    RdmaPair n;
    n.owner_nic->refuse_registration = true;
    const uint64_t id = DataNode::of(n.owner).buffers().lend(mem.data(), mem.size(), false);
    auto plane = n.plane();
    auto call = plane->submit({{n.owner.addr(), id, 0, dst.size(), dst.data(), false}}, 10000, nullptr);
    REQUIRE(call->wait_done(10000));
    CHECK(outcome(*call).empty());
    CHECK(dst == mem);
    CHECK(plane->stats().streamed == 1);
    CHECK(DataNode::of(n.owner).rdma_links() == 0);
  }
}

// An RDMA transfer stops at its batch's timeout (the link aborted before the memory is let go)
// and when its owner is known dead (a Supervision error); the pair's next transfer gets a new
// link; the owner's link to a reader goes with the reader.
TEST_CASE("an RDMA transfer stops at its timeout or its owner's death, and the next gets a new link", "[data_plane][rdma]") {
  RdmaPair n;
  std::vector<char> mem(size_t(32) << 20, 3), dst(mem.size());
  const uint64_t id = DataNode::of(n.owner).buffers().lend(mem.data(), mem.size(), false);
  auto plane = n.plane();
  n.fabric->step_pause_ms = 20;  // 32 steps of 1 MiB: >= 640 ms
  std::atomic<int> finished{0};
  auto slow = plane->submit({{n.owner.addr(), id, 0, dst.size(), dst.data(), false}}, 200, [&] { ++finished; });
  REQUIRE(slow->wait_done(10000));
  CHECK_THAT(outcome(*slow), Catch::StartsWith("timeout: "));
  for (int i = 0; i < 2000 && finished == 0; ++i) usleep(1000);
  CHECK(finished == 1);
  CHECK(n.fabric->aborted == 1);  // the memory went only after the NIC let go of it

  n.fabric->step_pause_ms = 0;
  std::vector<char> next(kInlineBytes + 1);
  auto after = plane->submit({{n.owner.addr(), id, 0, next.size(), next.data(), false}}, 10000, nullptr);
  REQUIRE(after->wait_done(10000));
  CHECK(outcome(*after).empty());
  CHECK(std::all_of(next.begin(), next.end(), [](char c) { return c == 3; }));
  CHECK(plane->stats().rdma == 1);  // over a new link, which the owner took in place of the old
  CHECK(DataNode::of(n.owner).rdma_links() == 1);

  n.fabric->step_pause_ms = 20;
  auto dying = plane->submit({{n.owner.addr(), id, 0, dst.size(), dst.data(), false}}, 10000, nullptr);
  usleep(150000);
  n.reader.mark_dead(n.owner.addr(), error_body(ErrorKind::Supervision, "the owner was killed"));
  REQUIRE(dying->wait_done(10000));
  CHECK_THAT(outcome(*dying), Catch::StartsWith("supervision: ") && Catch::Contains("died during the transfer"));
  CHECK(n.fabric->aborted == 2);

  n.owner.mark_dead(n.reader.addr(), error_body(ErrorKind::Supervision, "the reader was killed"));
  CHECK(DataNode::of(n.owner).rdma_links() == 0);
}

// ---- device memory, through the CUDA driver's stand-in (tests/fake_cuda: no GPU here) ----

namespace {
// The stand-in driver as xmesh loads it (XMESH_CUDA_DRIVER), with its test helpers: device
// memory the tests make, and copies in and out of it. Its device memory faults if touched
// other than through the driver's copies.
struct FakeCuda {
  std::shared_ptr<DeviceMemory> driver;
  int (*alloc)(unsigned long long*, size_t) = nullptr;
  int (*copy_in)(unsigned long long, const void*, size_t) = nullptr;
  int (*copy_out)(void*, unsigned long long, size_t) = nullptr;
  void (*allow_dmabuf)(int) = nullptr;
  FakeCuda() {
    setenv("XMESH_CUDA_DRIVER", XMESH_FAKE_CUDA_PATH, 1);
    std::string why;
    driver = load_cuda_driver(&why);
    INFO(why);
    REQUIRE(driver);
    void* lib = dlopen(XMESH_FAKE_CUDA_PATH, RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(lib);
    alloc = reinterpret_cast<decltype(alloc)>(dlsym(lib, "cuMemAlloc_v2"));
    copy_in = reinterpret_cast<decltype(copy_in)>(dlsym(lib, "fake_cuda_copy_in"));
    copy_out = reinterpret_cast<decltype(copy_out)>(dlsym(lib, "fake_cuda_copy_out"));
    allow_dmabuf = reinterpret_cast<decltype(allow_dmabuf)>(dlsym(lib, "fake_cuda_allow_dmabuf"));
    REQUIRE((alloc && copy_in && copy_out && allow_dmabuf));
  }
  char* device(const std::vector<char>& initial) {
    unsigned long long p = 0;
    REQUIRE(alloc(&p, initial.size()) == 0);
    REQUIRE(copy_in(p, initial.data(), initial.size()) == 0);
    return reinterpret_cast<char*>(p);
  }
  std::vector<char> contents(const char* p, size_t n) {
    std::vector<char> out(n);
    REQUIRE(copy_out(out.data(), reinterpret_cast<unsigned long long>(p), n) == 0);
    return out;
  }
};
}  // namespace

// A device buffer's lease is staged (a read's range copied out at the lease, a write's copied in
// when its release says complete, answered before the writer's op is done); a device
// destination or source of the reader is staged by the reader. Every path: this host, streams,
// the lease's messages. The stand-in's memory faults when touched directly, so a path that
// skipped staging would crash the test.
TEST_CASE("device memory is staged through host memory on both sides, on every path", "[data_plane][cuda]") {
  FakeCuda cuda;
  CHECK(cuda.driver->holds(cuda.device(std::vector<char>(16)), 16));
  std::vector<char> host_mem(4096);
  CHECK_FALSE(cuda.driver->holds(host_mem.data(), host_mem.size()));
  TwoNodes n;
  const size_t size = (2 << 20) + 3;
  const auto initial = patterned(size, 11);
  char* dev = cuda.device(initial);
  const uint64_t id = DataNode::of(n.owner).buffers().lend(dev, size, true, cuda.driver);
  for (const char* transport : {"", "stream"}) {
    DYNAMIC_SECTION("transport '" << transport << "'") {
      setenv("XMESH_DATA_TRANSPORT", transport, 1);
      DataPlane plane(n.reader, 2);
      unsetenv("XMESH_DATA_TRANSPORT");
      std::vector<char> got(size), small(1000);
      auto read = plane.submit({{n.owner.addr(), id, 0, size, got.data(), false},
                                {n.owner.addr(), id, 5, small.size(), small.data(), false}},
                               10000, nullptr);
      REQUIRE(read->wait_done(10000));
      CHECK(outcome(*read).empty());
      CHECK(got == initial);
      CHECK(std::memcmp(small.data(), initial.data() + 5, small.size()) == 0);

      const auto written = patterned(1 << 20, 12), tiny = patterned(100, 13);
      auto write = plane.submit({{n.owner.addr(), id, 0, written.size(), const_cast<char*>(written.data()), true},
                                 {n.owner.addr(), id, size - tiny.size(), tiny.size(), const_cast<char*>(tiny.data()), true}},
                                10000, nullptr);
      REQUIRE(write->wait_done(10000));
      CHECK(outcome(*write).empty());
      auto now = cuda.contents(dev, size);  // in place as soon as the write's Future is done
      CHECK(std::memcmp(now.data(), written.data(), written.size()) == 0);
      CHECK(std::memcmp(now.data() + size - tiny.size(), tiny.data(), tiny.size()) == 0);
      CHECK(std::memcmp(now.data() + written.size(), initial.data() + written.size(),
                        size - tiny.size() - written.size()) == 0);

      // The reader's own device memory: read into it, write from it.
      char* mine = cuda.device(std::vector<char>(size, 0));
      auto into = plane.submit({{n.owner.addr(), id, 0, size, mine, false, cuda.driver}}, 10000, nullptr);
      REQUIRE(into->wait_done(10000));
      CHECK(outcome(*into).empty());
      CHECK(cuda.contents(mine, size) == now);
      char* source = cuda.device(patterned(4096, 14));
      auto from = plane.submit({{n.owner.addr(), id, 64, 4096, source, true, cuda.driver}}, 10000, nullptr);
      REQUIRE(from->wait_done(10000));
      CHECK(outcome(*from).empty());
      CHECK(std::memcmp(cuda.contents(dev, size).data() + 64, patterned(4096, 14).data(), 4096) == 0);
      cuda.copy_in(reinterpret_cast<unsigned long long>(dev), initial.data(), size);  // for the next section
    }
  }
}

// Device memory between processes with NICs: where the driver exports it as a dma-buf, the NIC
// registers it and RDMA reaches it directly, both the owner's buffer (leased direct: not staged,
// no stream grant) and the reader's own; where not, it is staged (the reader's: RDMA from its
// staging; the owner's: streamed, saying why). A direct lease whose RDMA fails is ended and the
// op asked again for a staged stream.
TEST_CASE("device memory goes by RDMA through its dma-buf where the driver allows, else staged", "[data_plane][cuda][rdma]") {
  FakeCuda cuda;
  const size_t size = (2 << 20) + 3;
  const auto initial = patterned(size, 15);
  SECTION("through dma-bufs") {
    cuda.allow_dmabuf(1);
    RdmaPair n;
    char* dev = cuda.device(initial);
    const uint64_t id = DataNode::of(n.owner).buffers().lend(dev, size, true, cuda.driver);
    auto plane = n.plane();
    std::vector<char> got(size);
    auto read = plane->submit({{n.owner.addr(), id, 0, size, got.data(), false}}, 10000, nullptr);
    REQUIRE(read->wait_done(10000));
    CHECK(outcome(*read).empty());
    CHECK(got == initial);
    const auto written = patterned(1 << 20, 16);
    auto write = plane->submit({{n.owner.addr(), id, 0, written.size(), const_cast<char*>(written.data()), true}},
                               10000, nullptr);
    REQUIRE(write->wait_done(10000));
    CHECK(outcome(*write).empty());
    auto now = cuda.contents(dev, size);
    CHECK(std::memcmp(now.data(), written.data(), written.size()) == 0);
    char* mine = cuda.device(std::vector<char>(size, 0));
    auto into = plane->submit({{n.owner.addr(), id, 0, size, mine, false, cuda.driver}}, 10000, nullptr);
    REQUIRE(into->wait_done(10000));
    CHECK(outcome(*into).empty());
    CHECK(cuda.contents(mine, size) == now);
    CHECK(plane->stats().rdma == 3);
    CHECK(n.fabric->dmabufs == 2);  // the owner's buffer once, the reader's destination once
  }
  SECTION("without dma-bufs") {
    cuda.allow_dmabuf(0);
    RdmaPair n;
    auto plane = n.plane();
    std::vector<char> host_mem = initial;
    const uint64_t host_id = DataNode::of(n.owner).buffers().lend(host_mem.data(), size, false);
    char* mine = cuda.device(std::vector<char>(size, 0));
    auto into = plane->submit({{n.owner.addr(), host_id, 0, size, mine, false, cuda.driver}}, 10000, nullptr);
    REQUIRE(into->wait_done(10000));
    CHECK(outcome(*into).empty());
    CHECK(cuda.contents(mine, size) == initial);
    CHECK(plane->stats().rdma == 1);  // RDMA into the reader's staging
    char* dev = cuda.device(initial);
    const uint64_t id = DataNode::of(n.owner).buffers().lend(dev, size, false, cuda.driver);
    std::vector<char> got(size);
    auto read = plane->submit({{n.owner.addr(), id, 0, size, got.data(), false}}, 10000, nullptr);
    REQUIRE(read->wait_done(10000));
    CHECK(outcome(*read).empty());
    CHECK(got == initial);
    CHECK(plane->stats().streamed == 1);  // the owner staged it and said why not RDMA
    CHECK(n.fabric->dmabufs == 0);
  }
  SECTION("a direct lease whose RDMA fails") {
    cuda.allow_dmabuf(1);
    RdmaPair n;
    n.fabric->unreachable = true;
    char* dev = cuda.device(initial);
    const uint64_t id = DataNode::of(n.owner).buffers().lend(dev, size, false, cuda.driver);
    auto plane = n.plane();
    std::vector<char> got(size);
    auto read = plane->submit({{n.owner.addr(), id, 0, size, got.data(), false}}, 10000, nullptr);
    REQUIRE(read->wait_done(10000));
    CHECK(outcome(*read).empty());
    CHECK(got == initial);
    CHECK(plane->stats().rdma == 0);
    CHECK(plane->stats().streamed == 1);
    CHECK(n.fabric->dmabufs == 1);
  }
}
