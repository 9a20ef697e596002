// A TCP link whose connection drops: what was in flight is sent again, once, in order
// (transport.hpp). The connection runs through a relay that the test stalls (bytes pile up in
// the kernel's buffers, as on a cut link) and then resets (RST on every connection: what the
// buffers held is gone, as when heartbeats time a connection out).
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "env_helper.hpp"
#include "key_file_helper.hpp"
#include "node.hpp"
#include "util.hpp"

using namespace xmesh;

namespace {

int port_of(const std::string& tcp_addr) { return std::stoi(tcp_addr.substr(tcp_addr.rfind(':') + 1)); }

int loopback_socket(int port, bool listen_there) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (listen_there) {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    REQUIRE(::listen(fd, 16) == 0);
  } else if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Forwards every connection made to its port to target_port on loopback, both ways.
class Relay {
 public:
  explicit Relay(int target_port) : target_(target_port), listener_(loopback_socket(0, true)) {
    sockaddr_in sa{};
    socklen_t n = sizeof sa;
    getsockname(listener_, reinterpret_cast<sockaddr*>(&sa), &n);
    port_ = ntohs(sa.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~Relay() {
    stop_ = true;
    thread_.join();
    for (auto& [a, b] : pairs_) {
      ::close(a);
      ::close(b);
    }
    ::close(listener_);
  }
  std::string addr() const { return "tcp://127.0.0.1:" + std::to_string(port_); }
  // Stops reading: what is sent piles up in the kernel's buffers.
  void stall() { stalled_ = true; }
  void resume() { stalled_ = false; }  // reads and forwards again
  // Every connection ends with a reset (what the buffers held is lost); new ones are relayed.
  void reset_all() {
    resets_wanted_++;
    while (resets_done_ < resets_wanted_) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  size_t connections() const { return accepted_; }

 private:
  void run() {
    while (!stop_) {
      if (resets_done_ < resets_wanted_) {
        for (auto& [a, b] : pairs_) {
          linger hard{1, 0};  // close with RST, discarding what is queued
          setsockopt(a, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
          setsockopt(b, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
          ::close(a);
          ::close(b);
        }
        pairs_.clear();
        stalled_ = false;
        resets_done_ = resets_wanted_.load();
      }
      std::vector<pollfd> fds{{listener_, POLLIN, 0}};
      if (!stalled_)
        for (auto& [a, b] : pairs_) {
          fds.push_back({a, POLLIN, 0});
          fds.push_back({b, POLLIN, 0});
        }
      if (::poll(fds.data(), fds.size(), 10) <= 0) continue;
      if (fds[0].revents & POLLIN) accept_one();
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        auto& pair = pairs_[(i - 1) / 2];
        int from = fds[i].fd, to = from == pair.first ? pair.second : pair.first;
        if (!forward(from, to)) {
          pair = {-1, -1};
          ::close(from);
          ::close(to);
        }
      }
      pairs_.erase(std::remove(pairs_.begin(), pairs_.end(), std::make_pair(-1, -1)), pairs_.end());
    }
  }
  void accept_one() {
    int in = ::accept(listener_, nullptr, nullptr);
    if (in < 0) return;
    int out = loopback_socket(target_, false);
    if (out < 0) {
      ::close(in);
      return;
    }
    pairs_.emplace_back(in, out);
    ++accepted_;
  }
  static bool forward(int from, int to) {
    char buf[65536];
    ssize_t n = ::read(from, buf, sizeof buf);
    if (n <= 0) return false;
    for (ssize_t off = 0; off < n;) {
      ssize_t w = ::write(to, buf + off, n - off);
      if (w <= 0) return false;
      off += w;
    }
    return true;
  }

  int target_, listener_, port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false}, stalled_{false};
  std::atomic<uint64_t> resets_wanted_{0}, resets_done_{0};
  std::atomic<size_t> accepted_{0};
  std::vector<std::pair<int, int>> pairs_;  // the relay's thread only
};

// Short link heartbeats, so that connections are judged dead (and made again) quickly.
struct QuickLinks {
  QuickLinks() {
    setenv("XMESH_LINK_HEARTBEAT_MS", "100", 1);
    setenv("XMESH_LINK_TIMEOUT_MS", "300", 1);
    setenv("XMESH_HEARTBEAT_MS", "200", 1);
  }
};

// Numbered messages that land in the receiver's control inbox.
// Two started nodes on loopback TCP with quick link heartbeats: `a` sends, `b` receives.
struct TcpPair {
  QuickLinks quick;
  Node b{"proc", "tcp://127.0.0.1:*", "k"};
  Node a{"controller", "tcp://127.0.0.1:*", "k"};
  TcpPair() {
    for (Node* n : {&a, &b}) {
      n->transport().cookies().present_by_default("k");
      n->start();
    }
  }
};

void send_numbered(Node& from, const std::string& to, int first, int last) {
  for (int i = first; i < last; ++i) {
    Header h;
    h.kind = Kind::Configure;
    h.method = std::to_string(i);
    from.send(to, h, {});
  }
}

// The numbers `box` takes within the deadline, in arrival order (stops after `want`).
std::vector<int> numbers_taken(Inbox& box, size_t want, int64_t ms) {
  std::vector<int> got;
  const int64_t deadline = now_ms() + ms;
  while (got.size() < want) {
    auto m = box.pop(static_cast<int>(std::max<int64_t>(1, deadline - now_ms())));
    if (!m) break;
    got.push_back(std::stoi(m->header.method));
  }
  return got;
}

std::vector<int> range(int first, int last) {
  std::vector<int> v;
  for (int i = first; i < last; ++i) v.push_back(i);
  return v;
}

bool eventually(const std::function<bool()>& ok, int64_t ms) {
  for (int64_t deadline = now_ms() + ms; now_ms() < deadline;) {
    if (ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ok();
}

}  // namespace

TEST_CASE("what a dropped TCP connection held is sent again, once and in order", "[node][tcp][resend]") {
  TcpPair pair;
  Node& a = pair.a;
  Node& b = pair.b;
  Inbox* box = &b.control();
  Relay relay(port_of(b.addr()));

  send_numbered(a, relay.addr(), 0, 500);
  REQUIRE(numbers_taken(*box, 500, 10000) == range(0, 500));
  REQUIRE(eventually([&] { return a.stats().unacked == 0; }, 5000));  // acknowledged

  relay.stall();
  send_numbered(a, relay.addr(), 500, 2500);  // into the kernel's buffers, then lost
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(a.stats().unacked > 0);
  relay.reset_all();
  send_numbered(a, relay.addr(), 2500, 3000);

  CHECK(numbers_taken(*box, 2500, 20000) == range(500, 3000));
  CHECK_FALSE(box->pop(300));  // nothing twice
  CHECK(relay.connections() >= 2);
  CHECK(a.stats().reconnects >= 1);
  CHECK(a.stats().resent > 0);
  CHECK(b.stats().gaps == 0);
  CHECK(eventually([&] { return a.stats().unacked == 0; }, 5000));  // the resent ones were acknowledged
}

TEST_CASE("a connection reset while idle resends nothing twice and keeps working", "[node][tcp][resend]") {
  TcpPair pair;
  Node& a = pair.a;
  Node& b = pair.b;
  Inbox* box = &b.control();
  Relay relay(port_of(b.addr()));
  for (int round = 0; round < 3; ++round) {
    send_numbered(a, relay.addr(), round * 100, round * 100 + 100);
    REQUIRE(numbers_taken(*box, 100, 10000) == range(round * 100, round * 100 + 100));
    relay.reset_all();
    REQUIRE(eventually([&] { return relay.connections() >= static_cast<size_t>(round) + 2; }, 5000));
  }
  CHECK_FALSE(box->pop(300));
  CHECK(b.stats().duplicates + b.stats().gaps == b.stats().duplicates);  // no gap, whatever came again
}

TEST_CASE("a receiver restarted at the address skips what was meant for its predecessor", "[node][tcp][resend]") {
  QuickLinks quick;
  auto b = std::make_unique<Node>("proc", "tcp://127.0.0.1:*", "k");
  const int port = port_of(b->addr());
  Node a("controller", "tcp://127.0.0.1:*", "k");
  a.transport().cookies().present_by_default("k");
  b->transport().cookies().present_by_default("k");
  a.start();
  b->start();
  Relay relay(port);
  {
    Inbox* box = &b->control();
    send_numbered(a, relay.addr(), 0, 100);
    REQUIRE(numbers_taken(*box, 100, 10000) == range(0, 100));
    REQUIRE(eventually([&] { return a.stats().unacked == 0; }, 5000));
    relay.stall();
    send_numbered(a, relay.addr(), 100, 150);  // for this process, which ends without them
  }
  b->stop();
  b.reset();
  Node again("proc", "tcp://127.0.0.1:" + std::to_string(port), "k");
  again.transport().cookies().present_by_default("k");
  again.start();
  Inbox* box = &again.control();
  relay.reset_all();
  REQUIRE(eventually([&] { return a.stats().reconnects >= 1; }, 5000));
  send_numbered(a, relay.addr(), 150, 160);
  CHECK(numbers_taken(*box, 10, 10000) == range(150, 160));
  CHECK_FALSE(box->pop(300));
}

// A controller that exits frees its TCP port, and the next one (another `xmesh` command, say)
// may be given the same port: the agent must answer the new process with the cookie it presents,
// not keep the link (and the cookie) of its predecessor, which the new one refuses.
TEST_CASE("a node that takes over a freed address is answered, not refused with its predecessor's cookie",
          "[node][tcp]") {
  QuickLinks quick;
  KeyFile key;
  Node agent("hostd", "tcp://127.0.0.1:*", "agent-cookie", key.path);
  agent.start();
  auto round_trip = [&](Node& controller, const std::string& text) {
    Header h;
    h.kind = Kind::Configure;
    h.method = text;
    controller.send(agent.addr(), h, {});
    auto got = agent.control().pop(10000);
    REQUIRE(got);
    REQUIRE(got->sender_addr == controller.addr());
    Header back;
    back.kind = Kind::Configure;
    back.method = "re: " + text;
    agent.send(got->sender_addr, back, {});
    auto answer = controller.control().pop(10000);
    return answer ? answer->header.method : std::string("(no answer)");
  };
  auto first = std::make_unique<Node>("controller", "tcp://127.0.0.1:*", "first-cookie", key.path);
  first->transport().cookies().present(agent.addr(), "agent-cookie");
  first->start();
  const std::string addr = first->addr();
  CHECK(round_trip(*first, "one") == "re: one");
  first->stop();
  first.reset();
  Node second("controller", addr, "second-cookie", key.path);
  second.transport().cookies().present(agent.addr(), "agent-cookie");
  second.start();
  CHECK(round_trip(second, "two") == "re: two");
  CHECK(round_trip(second, "three") == "re: three");
}

// TCP lanes (runtime/transport/tcp_lane.hpp, transport_lanes.cpp): after its first Call the sender asks
// for a lane and switches to it; messages keep their numbers there, so a lane that breaks
// midway (its reader closes it) loses and repeats nothing: they go again over ZeroMQ.
TEST_CASE("messages over a TCP lane arrive once and in order, also when the lane breaks midway", "[node][tcp][lanes][inv:transport.3]") {
  TcpPair pair;
  Node& a = pair.a;
  Node& b = pair.b;
  Inbox* box = &b.control();
  Header call;  // a Call (to an actor that never comes, answered by nobody) asks for a lane
  call.kind = Kind::Call;
  call.actor = "nobody";
  a.send(b.addr(), call, {});
  int next = 0;
  // The switch goes with a send once the lane's connection is up.
  REQUIRE(eventually([&] { send_numbered(a, b.addr(), next, next + 1), ++next; return a.stats().lanes_out == 1; }, 10000));
  send_numbered(a, b.addr(), next, 300);
  REQUIRE(numbers_taken(*box, 300, 10000) == range(0, 300));
  CHECK(a.stats().lane_sent >= 300 - next);
  {  // a message of many records, its frames whole
    Header big;
    big.kind = Kind::Configure;
    big.method = "big";
    std::vector<zmq::message_t> frames;
    frames.emplace_back(3 << 20);
    for (size_t i = 0; i < frames[0].size(); ++i) static_cast<char*>(frames[0].data())[i] = static_cast<char>(i * 7);
    frames.emplace_back("tail", 4);
    a.send(b.addr(), big, std::move(frames));
    auto m = box->pop(10000);
    REQUIRE(m);
    CHECK(m->header.method == "big");
    REQUIRE(m->frames.size() == 2);
    REQUIRE(m->frames[0].size() == size_t(3) << 20);
    bool same = true;
    for (size_t i = 0; i < m->frames[0].size(); ++i) same = same && static_cast<char*>(m->frames[0].data())[i] == static_cast<char>(i * 7);
    CHECK(same);
    CHECK(m->frames[1].to_string() == "tail");
  }
  CHECK(b.stats().lanes_in == 1);
  CHECK(b.stats().lane_received >= 300 - next);

  std::thread breaker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    b.transport().close_lanes();
  });
  for (int i = 300; i < 3000; i += 100) {
    send_numbered(a, b.addr(), i, i + 100);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  breaker.join();
  send_numbered(a, b.addr(), 3000, 3100);
  CHECK(numbers_taken(*box, 2800, 20000) == range(300, 3100));
  CHECK_FALSE(box->pop(300));  // nothing twice
  CHECK(a.stats().lane_breaks >= 1);
  CHECK(b.stats().gaps == 0);
  CHECK(eventually([&] { return a.stats().unacked == 0; }, 5000));
  // A new lane is asked for with the next Call, and used.
  a.send(b.addr(), call, {});
  next = 3100;
  REQUIRE(eventually([&] { send_numbered(a, b.addr(), next, next + 1), ++next; return a.stats().lanes_out == 1; }, 10000));
  CHECK(numbers_taken(*box, static_cast<size_t>(next - 3100), 10000) == range(3100, next));
}

// A peer ending on purpose (expect_gone: its procs were stopped) ends its lanes with it: what the
// writer meets then is not counted as a lane that broke (issue 47: nothing about lanes at a stop).
TEST_CASE("the lanes of a peer stopped on purpose end without counting as breaks", "[node][tcp][lanes]") {
  TcpPair pair;
  Node& a = pair.a;
  Node& b = pair.b;
  Header call;
  call.kind = Kind::Call;
  call.actor = "nobody";
  int next = 0;
  a.send(b.addr(), call, {});  // asks for a lane
  REQUIRE(eventually([&] { send_numbered(a, b.addr(), next, next + 1), ++next; return a.stats().lanes_out == 1; }, 10000));
  REQUIRE(eventually([&] { return b.stats().lanes_in == 1; }, 10000));
  a.transport().expect_gone(b.addr());
  b.transport().close_lanes();
  REQUIRE(eventually([&] { send_numbered(a, b.addr(), next, next + 1), ++next; return a.stats().lanes_out == 0; }, 10000));
  CHECK(a.stats().lane_breaks == 0);
}

// The link upgrade's limit (link.hpp) on a real lane: a lane to one peer that broke three times
// is not asked for again; ZeroMQ alone carries that peer's messages, all of them, in order.
TEST_CASE("after three lanes to a peer broke, ZeroMQ alone carries its messages", "[node][tcp][lanes][inv:transport.3]") {
  TcpPair pair;
  Node& a = pair.a;
  Node& b = pair.b;
  Inbox* box = &b.control();
  Header call;
  call.kind = Kind::Call;
  call.actor = "nobody";
  int next = 0;
  for (uint64_t round = 1; round <= 3; ++round) {
    a.send(b.addr(), call, {});  // asks for a lane (again)
    REQUIRE(eventually([&] { send_numbered(a, b.addr(), next, next + 1), ++next; return a.stats().lanes_out == 1; }, 10000));
    REQUIRE(eventually([&] { return b.stats().lanes_in == 1; }, 10000));  // the reader reads it: closing it breaks it
    b.transport().close_lanes();
    REQUIRE(eventually([&] { send_numbered(a, b.addr(), next, next + 1), ++next; return a.stats().lane_breaks >= round; }, 10000));
    INFO("round " << round << " breaks " << a.stats().lane_breaks);
    CHECK(a.stats().lane_breaks == round);
  }
  const uint64_t lane_sent = a.stats().lane_sent;
  a.send(b.addr(), call, {});  // would ask again, were a lane still allowed
  for (int i = 0; i < 50; ++i) {  // as long as a lane took to come up above, several times over
    send_numbered(a, b.addr(), next, next + 1), ++next;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(a.stats().lanes_out == 0);
  CHECK(a.stats().lane_sent == lane_sent);
  CHECK(b.stats().lanes_in == 0);
  CHECK(numbers_taken(*box, static_cast<size_t>(next), 10000) == range(0, next));
}

// Sends to b, stops it, then sends to it without waiting until the link cannot take more: the
// refusal's text ("" if none came).
std::string fill_link_to_stopped_peer(TcpPair& pair) {
  send_numbered(pair.a, pair.b.addr(), 0, 10);
  REQUIRE(numbers_taken(pair.b.control(), 10, 10000).size() == 10);
  const std::string gone = pair.b.addr();
  pair.b.stop();
  for (int i = 0; i < 1000000; ++i) {
    Header h;
    h.kind = Kind::Configure;
    try {
      pair.a.send_if_ready(gone, h, {});
    } catch (const SendError& e) {
      return e.what();
    }
  }
  return "";
}

// A send that must not wait (Node::send_if_ready: a controller's Goodbye as it exits) to a peer
// that is gone: once its link cannot take more, it raises at once instead of waiting out the send
// timeout (set here far beyond the test's guard, so a send that waited would hang the test).
TEST_CASE("a send that must not wait raises at once when a gone peer's link is full", "[node][tcp][resend]") {
  Env timeout("XMESH_SEND_TIMEOUT_MS", "600000");
  TcpPair pair;
  const std::string gone = pair.b.addr();
  std::string why = fill_link_to_stopped_peer(pair);
  INFO(why);
  CHECK(why.find(gone) != std::string::npos);  // refused, naming the peer
}

// A sender waiting for room on a link holds that peer's mutex. A thread that must not wait (the
// I/O thread's heartbeats, a ring pump, send_if_ready) gives up on that peer at once instead of
// waiting with it for the send timeout (set far beyond the test's guard: a thread that waited
// would hang the test), and closing the link ends the waiting sender.
TEST_CASE("a thread that must not wait is not held up by a sender waiting for room on the same link",
          "[node][tcp][resend]") {
  Env timeout("XMESH_SEND_TIMEOUT_MS", "600000");
  TcpPair pair;
  const std::string gone = pair.b.addr();
  REQUIRE_FALSE(fill_link_to_stopped_peer(pair).empty());
  Header h;
  h.kind = Kind::Configure;
  std::atomic<bool> sender_done{false};
  std::string sender_error;
  std::thread sender([&] {
    try {
      pair.a.send(gone, h, {});  // waits for room: nothing acknowledges
    } catch (const SendError& e) {
      sender_error = e.what();
    }
    sender_done = true;
  });
  while (!sender_done && pair.a.transport().link_report(gone).find("under way") == std::string::npos) {
  }
  REQUIRE_FALSE(sender_done);
  std::string why;
  try {
    pair.a.send_if_ready(gone, h, {});
  } catch (const SendError& e) {
    CHECK(e.would_block);  // it may go later (send_or_defer hands it to the relay thread)
    why = e.what();
  }
  CHECK_FALSE(sender_done);  // refused while the sender still waits
  CHECK(why.find("waiting for its link") != std::string::npos);
  pair.a.forget_peer(gone);
  sender.join();
  CHECK(sender_error.find("closed") != std::string::npos);  // it waited for room or for ZeroMQ to take more
}

// A link's answer its reader cannot send now (its link to the proposer full: here a relay in
// front of the proposer's advertised address stalls) is sent once the link takes it, not dropped:
// dropped, the proposer's upgrade stayed "proposed" and its lane never came (the same happens
// when the answering thread is refused a peer whose sender waits for room).
TEST_CASE("an answer to a lane proposal that cannot go at once goes when the link drains", "[node][tcp][lanes]") {
  Env timeout("XMESH_LINK_TIMEOUT_MS", "600000");  // a stall is not a dead connection here
  Env send_timeout("XMESH_SEND_TIMEOUT_MS", "600000");
  const int a_port = [] {  // a free port for a, known before a binds it (its relay's target)
    int fd = loopback_socket(0, true);
    sockaddr_in sa{};
    socklen_t n = sizeof sa;
    getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &n);
    ::close(fd);
    return static_cast<int>(ntohs(sa.sin_port));
  }();
  Relay relay(a_port);
  Node a("controller", "tcp://127.0.0.1:" + std::to_string(a_port), "k", "", relay.addr());
  Node b("proc", "tcp://127.0.0.1:*", "k");
  for (Node* n : {&a, &b}) {
    n->transport().cookies().present_by_default("k");
    n->start();
  }
  send_numbered(a, b.addr(), 0, 5);
  REQUIRE(numbers_taken(b.control(), 5, 10000).size() == 5);
  send_numbered(b, a.addr(), 0, 5);  // b reaches a through the relay
  REQUIRE(numbers_taken(a.control(), 5, 10000) == range(0, 5));
  relay.stall();
  // b's link to a takes no more, and still none a moment later (ZeroMQ's I/O thread moves what
  // the kernel's buffers still take out of the full queue meanwhile).
  int filled = 5;
  auto fill = [&] {  // how many more it took
    for (int took = 0;; ++took) {
      Header h;
      h.kind = Kind::Configure;
      h.method = std::to_string(filled);
      try {
        b.send_if_ready(a.addr(), h, {});
        ++filled;
      } catch (const SendError& e) {
        REQUIRE(e.would_block);
        return took;
      }
    }
  };
  fill();
  for (int rounds = 0; rounds < 100; ++rounds) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (fill() == 0) break;
  }
  REQUIRE(fill() == 0);
  const uint64_t received = b.stats().received;
  Header call;
  call.kind = Kind::Call;
  call.actor = "nobody";
  a.send(b.addr(), call, {});  // then a proposes a lane, which b answers on its full link
  REQUIRE(eventually([&] { return b.stats().received >= received + 2; }, 10000));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // b's answer is refused meanwhile
  CHECK(a.stats().lanes_out == 0);
  relay.resume();
  CHECK(numbers_taken(a.control(), static_cast<size_t>(filled - 5), 30000) == range(5, filled));
  int next = 5;
  CHECK(eventually([&] { send_numbered(a, b.addr(), next, next + 1), ++next; return a.stats().lanes_out == 1; }, 10000));
}
