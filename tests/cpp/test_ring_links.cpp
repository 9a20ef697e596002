// Ring links (runtime/transport/ring_links.hpp) and the Doorbell: an offer taken through /proc/<pid>/fd,
// answered, switched; messages of every size (several records each past the ring's largest)
// decoded whole and in order; a declined delivery held and offered again first; a wrong token
// and garbage records refused; and two real Nodes switching from ZeroMQ to a link mid-stream
// with nothing lost or reordered.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "node.hpp"
#include "node_test_helpers.hpp"
#include "ring_links.hpp"
#include "util.hpp"

using namespace xmesh;

namespace {
zmq::message_t frame_of(size_t size, uint64_t seed) {
  zmq::message_t f(size);
  auto* p = static_cast<unsigned char*>(f.data());
  for (size_t i = 0; i < size; ++i) p[i] = static_cast<unsigned char>((seed * 131 + i * 7) & 0xff);
  return f;
}

bool same(const zmq::message_t& a, const zmq::message_t& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

// A writer and a reader in this process, linked as two processes would be.
struct Link {
  RingReaders readers{size_t(64) << 20};
  RingWriter writer{8192};
  Link() {
    readers.enable();
    auto answer = readers.take_offer("ipc:///writer", writer.offer());
    REQUIRE(answer.ok);
    std::string why;
    writer.answered(answer, &why);
    REQUIRE(why.empty());
    REQUIRE(writer.state() == RingWriter::State::switch_due);
    writer.switched();
    readers.start_reading("ipc:///writer");
  }
};

std::vector<uint8_t> header_for(uint64_t corr) {
  Header h;
  h.kind = Kind::Call;
  h.corr = corr;
  h.method = "m";
  h.sender = "writer-node";
  return encode_header(h);
}
}  // namespace

TEST_CASE("a doorbell wakes its sleeper and is recognised by its token", "[ring_links]") {
  auto bell = Doorbell::create();
  int fd = open_peer_fd(getpid(), bell.fd());
  REQUIRE(fd >= 0);
  auto other = Doorbell::attach(fd);
  close(fd);
  REQUIRE(other.token() == bell.token());
  uint32_t seen = bell.seq();
  std::thread ringer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    other.ring();
  });
  auto t0 = std::chrono::steady_clock::now();
  bell.sleep(Doorbell::kReaderBit, seen, 5000, [] { return true; });
  ringer.join();
  REQUIRE(bell.seq() != seen);
  REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4));
  auto ring = ShmRing::create(4096);
  REQUIRE_THROWS(Doorbell::attach(ring.fd()));  // a ring is not a doorbell
}

// The writer names whom its message is for: a reply wakes the caller that sleeps, not an idle
// actor thread of the same process (which would read it only to wake the caller); a call wakes
// an actor thread. While a thread reading for itself is awake, a ring wakes nobody.
TEST_CASE("a ring wakes the sleeper its message is for, and nobody while a reader is awake", "[ring_links]") {
  constexpr uint32_t kCaller = 1u << 31, kActor = 4;
  auto bell = Doorbell::create();
  std::atomic<uint32_t> woke{0};
  auto sleeper = [&](uint32_t bit) {
    return std::thread([&, bit] {
      bell.sleep(bit, bell.seq(), 5000, [] { return true; });
      woke |= bit;
    });
  };
  auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(100)); };
  auto wait_woken = [&](uint32_t bits) {
    for (int i = 0; i < 500 && (woke.load() & bits) != bits; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    settle();  // time for a wrong one to wake too
    return woke.load();
  };
  std::thread reader = sleeper(Doorbell::kReaderBit);
  std::thread actor = sleeper(kActor);
  settle();  // the actor thread sleeps first: the first a wake without a preference would find
  std::thread caller = sleeper(kCaller);
  settle();
  bell.ring(kCaller);  // a reply
  CHECK(wait_woken(kCaller) == kCaller);
  caller.join();
  bell.ring(Doorbell::kAnyIdle & ~kCaller);  // a call
  CHECK(wait_woken(kActor) == (kCaller | kActor));
  actor.join();
  bell.awake(true);  // a caller reading for itself: nobody is woken for what it will read
  bell.ring(kCaller);
  settle();
  CHECK(woke.load() == (kCaller | kActor));
  bell.awake(false);
  bell.ring(kCaller);  // no caller sleeps, no idle thread: the reading thread
  CHECK(wait_woken(Doorbell::kReaderBit) == (kCaller | kActor | Doorbell::kReaderBit));
  reader.join();
}

TEST_CASE("messages larger than a ring's record cross it whole and in order", "[ring_links]") {
  Link link;
  std::vector<size_t> sizes = {0, 1, 100, 4000, 4097, 9000, 70000, 300000};
  std::thread writer([&] {  // blocking writes: the reader below makes room
    uint64_t n = 0;
    for (size_t size : sizes) {
      std::vector<zmq::message_t> frames;
      frames.push_back(frame_of(size, n));
      frames.push_back(frame_of(size / 3, n + 1));
      REQUIRE(link.writer.write(header_for(n), frames, true, 10000) == ShmRing::Result::ok);
      ++n;
    }
  });
  uint64_t next = 0;
  RingReaders::Report report;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (next < sizes.size() && std::chrono::steady_clock::now() < deadline) {
    link.readers.poll(
        [&](Message& m) {
          REQUIRE(m.header.corr == next);
          REQUIRE(m.sender_addr == "ipc:///writer");
          REQUIRE(m.frames.size() == 2);
          REQUIRE(same(m.frames[0], frame_of(sizes[next], next)));
          REQUIRE(same(m.frames[1], frame_of(sizes[next] / 3, next + 1)));
          ++next;
          return true;
        },
        report);
    if (next < sizes.size()) link.readers.wait(10);
  }
  writer.join();
  REQUIRE(next == sizes.size());
  REQUIRE(report.broken.empty());
}

TEST_CASE("a message its receiver cannot take yet stays first, and the writer is held back", "[ring_links]") {
  Link link;
  std::vector<zmq::message_t> none;
  int sent = 0;
  while (link.writer.write(header_for(sent), none, false, 0) == ShmRing::Result::ok) ++sent;
  REQUIRE(sent > 10);  // the ring filled: a non-blocking write says full, nothing partial
  RingReaders::Report report;
  std::vector<uint64_t> got;
  bool room = false;
  auto deliver = [&](Message& m) {
    if (!room) return false;
    got.push_back(m.header.corr);
    return true;
  };
  REQUIRE(link.readers.poll(deliver, report) == 0);
  REQUIRE(report.held);
  for (int i = 0; i < 3; ++i) REQUIRE(link.readers.poll(deliver, report) == 0);  // nothing more is read
  int more = 0;  // the held message's room only: the writer is held back
  while (link.writer.write(header_for(sent + more), none, false, 0) == ShmRing::Result::ok) ++more;
  REQUIRE(more <= 2);
  sent += more;
  room = true;
  while (got.size() < static_cast<size_t>(sent)) {
    REQUIRE(link.readers.poll(deliver, report) > 0);
  }
  for (int i = 0; i < sent; ++i) REQUIRE(got[i] == static_cast<uint64_t>(i));
}

TEST_CASE("a message over the reader's limit is skipped and reported, and the ring reads on", "[ring_links]") {
  RingReaders readers(50000);
  readers.enable();
  RingWriter writer(8192);
  auto offer = writer.offer();
  offer.max_message_bytes = 777;
  auto answer = readers.take_offer("ipc:///w", offer);
  std::string why;
  writer.answered(answer, &why);
  writer.switched();
  readers.start_reading("ipc:///w");
  std::thread w([&] {
    std::vector<zmq::message_t> big, small;
    big.push_back(frame_of(60000, 1));
    small.push_back(frame_of(10, 2));
    writer.write(header_for(1), big, true, 10000);
    writer.write(header_for(2), small, true, 10000);
  });
  RingReaders::Report report;
  std::vector<uint64_t> got;
  for (int i = 0; i < 2000 && got.empty(); ++i) {
    readers.poll([&](Message& m) { return got.push_back(m.header.corr), true; }, report);
    readers.wait(5);
  }
  w.join();
  REQUIRE(got == std::vector<uint64_t>{2});
  REQUIRE(report.too_large.size() == 1);
  REQUIRE(report.too_large[0].msg.header.corr == 1);
  REQUIRE(report.too_large[0].payload_bytes == 60000);
  REQUIRE(report.too_large[0].sender_limit == 777);
}

TEST_CASE("an offer with another ring's token, or from a closed process, is declined", "[ring_links]") {
  RingReaders readers(1 << 20);
  RingWriter writer(4096);
  auto offer = writer.offer();
  REQUIRE_FALSE(readers.take_offer("ipc:///w", offer).ok);  // not enabled: declined, said why
  readers.enable();
  offer.token ^= 1;
  auto answer = readers.take_offer("ipc:///w", offer);
  REQUIRE_FALSE(answer.ok);
  REQUIRE(answer.reason.find("not the one offered") != std::string::npos);
  offer = writer.offer();
  offer.pid = 999999999;
  answer = readers.take_offer("ipc:///w", offer);
  REQUIRE_FALSE(answer.ok);
  REQUIRE(answer.reason.find("cannot be opened") != std::string::npos);
  std::string why;
  answer.token = writer.offer().token;
  writer.answered(answer, &why);
  REQUIRE(writer.state() == RingWriter::State::declined);
  REQUIRE(why.find("declined") != std::string::npos);
}

TEST_CASE("records that do not read close the ring and are named", "[ring_links]") {
  RingReaders readers(1 << 20);
  readers.enable();
  auto ring = ShmRing::create(4096);
  auto answer = readers.take_offer("ipc:///bad", RingOfferBody{getpid(), ring.fd(), ring.token()});
  REQUIRE(answer.ok);
  readers.start_reading("ipc:///bad");
  std::string garbage(40, '\x7f');  // a total far past the record, a frame count past the message
  REQUIRE(ring.write(garbage, 0) == ShmRing::Result::ok);
  RingReaders::Report report;
  REQUIRE(readers.poll([](Message&) { return true; }, report) == 0);
  REQUIRE(report.broken.size() == 1);
  REQUIRE(report.broken[0].addr == "ipc:///bad");
  REQUIRE(report.broken[0].token == ring.token());
  REQUIRE_FALSE(report.broken[0].why.empty());
  REQUIRE(ring.closed());
  REQUIRE(readers.reading() == 0);
}

// A message whose prefix claims a header of 2 GiB (its frames within the limit): the reader
// would have set that much memory aside on the writer's word; it closes the ring instead.
TEST_CASE("a ring message claiming a huge header is refused before anything is set aside", "[ring_links]") {
  RingReaders readers(1 << 20);
  readers.enable();
  auto ring = ShmRing::create(4096);
  REQUIRE(readers.take_offer("ipc:///huge", RingOfferBody{getpid(), ring.fd(), ring.token()}).ok);
  readers.start_reading("ipc:///huge");
  const uint32_t header_bytes = 0x80000000u;
  const uint64_t total = 16 + uint64_t(header_bytes) + 10;  // 10 bytes of frames
  std::string first(ring.max_message(), 'x');  // the first record of a message longer than one
  std::memcpy(first.data(), &total, 8);
  std::memcpy(first.data() + 8, &header_bytes, 4);
  const uint32_t count = 0;
  std::memcpy(first.data() + 12, &count, 4);
  REQUIRE(ring.write(first, 0) == ShmRing::Result::ok);
  RingReaders::Report report;
  REQUIRE(readers.poll([](Message&) { return true; }, report) == 0);
  REQUIRE(report.broken.size() == 1);
  CHECK_THAT(report.broken[0].why, Catch::Contains("header and frame list take"));
  REQUIRE(ring.closed());
}

TEST_CASE("two nodes switch from ZeroMQ to a ring mid-stream without losing or reordering", "[ring_links][node][inv:transport.2]") {
  Node proc("proc", "ipc:///tmp/xmesh-test-" + std::to_string(getpid()) + "-ring-p", "k");
  Node ctl("controller", "ipc:///tmp/xmesh-test-" + std::to_string(getpid()) + "-ring-c", "k");
  auto inbox = started_with_actor(ctl, proc);
  REQUIRE(inbox->pop(5000)->header.kind == Kind::SpawnActor);
  const int n = 3000;
  std::atomic<int> answered{0}, out_of_order{0};
  std::thread answer([&] {  // the actor: answers every call in the order it came
    for (int i = 0; i < n; ++i) {
      auto m = inbox->pop(10000);
      if (!m) break;
      if (m->header.method != std::to_string(i)) ++out_of_order;
      proc.reply(*m, true, nullptr, {});
      ++answered;
    }
  });
  std::vector<std::shared_ptr<Call>> calls;
  for (int i = 0; i < n; ++i) {
    // Halfway, wait for the answers so far: the link's acceptance is in by then, so the second
    // half switches (a burst sent before the acceptance came all goes over ZeroMQ).
    if (i == n / 2)
      for (auto& c : calls) REQUIRE(c->wait_done(10000));
    Header h;
    h.kind = Kind::Call;
    h.method = std::to_string(i);
    std::vector<zmq::message_t> frames;
    frames.push_back(frame_of(i % 7 == 0 ? 20000 : 10, i));
    calls.push_back(ctl.call({Target{proc.addr(), "a"}}, h, std::move(frames), true));
  }
  for (auto& c : calls) REQUIRE(c->wait_done(10000));
  answer.join();
  REQUIRE(answered == n);
  REQUIRE(out_of_order == 0);
  auto cs = ctl.stats(), ps = proc.stats();
  REQUIRE(cs.rings_out == 1);  // the calls switched to the ring
  REQUIRE(cs.ring_sent > 0);
  REQUIRE(ps.rings_in == 1);
  REQUIRE(ps.rings_out == 1);  // and so did the replies
  REQUIRE(cs.rings_in == 1);
  ctl.stop();
  proc.stop();
}

TEST_CASE("a caller waiting on its call reads the reply itself, and a node stopping ends such waits", "[ring_links][node]") {
  Node proc("proc", "ipc:///tmp/xmesh-test-" + std::to_string(getpid()) + "-fed-p", "k");
  Node ctl("controller", "ipc:///tmp/xmesh-test-" + std::to_string(getpid()) + "-fed-c", "k");
  auto inbox = started_with_actor(ctl, proc);
  std::thread actor([&] {  // answers each call after a pause: the caller sleeps on the doorbell
    while (auto m = inbox->pop(-1)) {
      if (m->header.kind != Kind::Call) continue;
      usleep(2000);
      proc.reply(*m, true, nullptr, {});
    }
  });
  for (int i = 0; i < 50; ++i) {
    Header h;
    h.kind = Kind::Call;
    auto c = ctl.call({Target{proc.addr(), "a"}}, h, {}, true);
    REQUIRE(c->wait_for(false, 10000) == WaitOutcome::Ready);
  }
  REQUIRE(ctl.stats().rings_in == 1);  // the replies came over the ring, read by this thread
  Header never;
  never.kind = Kind::Call;
  never.actor = "nobody-answers";
  auto pending = ctl.call({Target{proc.addr(), "silent"}}, never, {}, true);
  std::thread stopper([&] {
    usleep(100000);
    ctl.stop();
  });
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE(pending->wait_for(false, 1500) == WaitOutcome::Timeout);  // neither hangs nor spins forever
  REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  stopper.join();
  inbox->close();
  actor.join();
  proc.stop();
}
