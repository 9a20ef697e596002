// PortMux (port_mux.hpp): a host agent's one TCP port. Nodes reach the agent and the procs
// behind it through it, CURVE end to end; the SOCKS5 side opens nothing but the loopback ports
// of live procs, and garbage or silence is closed.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "keys.hpp"
#include "key_file_helper.hpp"
#include "scratch_dir_helper.hpp"
#include "node.hpp"
#include "fd_passing.hpp"
#include "port_mux.hpp"
#include "tcp_lane.hpp"
#include "tcp_endpoint.hpp"

using namespace xmesh;

namespace {

int port_of(const std::string& addr) { return TcpEndpoint::parse(addr).port; }

// A blocking TCP client of the relay, with a receive timeout.
struct RawClient {
  int fd;
  explicit RawClient(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    timeval tv{3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~RawClient() { ::close(fd); }
  void send_bytes(const std::string& b) { REQUIRE(::send(fd, b.data(), b.size(), MSG_NOSIGNAL) == ssize_t(b.size())); }
  // Up to n bytes ("" when the relay closed the connection or said nothing in time).
  std::string receive(size_t n) {
    std::string got(n, '\0');
    size_t have = 0;
    while (have < n) {
      ssize_t r = ::recv(fd, got.data() + have, n - have, 0);
      if (r <= 0) break;
      have += static_cast<size_t>(r);
    }
    got.resize(have);
    return got;
  }
  bool closed_by_peer() {
    char c;
    return ::recv(fd, &c, 1, 0) == 0;
  }
};

std::string connect_request(uint8_t cmd, uint8_t atyp, const std::string& addr, int port) {
  std::string r = {0x05, static_cast<char>(cmd), 0x00, static_cast<char>(atyp)};
  if (atyp == 3) r.push_back(static_cast<char>(addr.size()));
  r += addr;
  r.push_back(static_cast<char>((port >> 8) & 0xff));
  r.push_back(static_cast<char>(port & 0xff));
  return r;
}

// The SOCKS5 reply code the relay gives a CONNECT (after the no-authentication greeting).
int socks_reply_code(int relay_port, const std::string& request) {
  RawClient c(relay_port);
  c.send_bytes(std::string("\x05\x01\x00", 3));
  REQUIRE(c.receive(2) == std::string("\x05\x00", 2));
  c.send_bytes(request);
  std::string reply = c.receive(10);
  if (reply.size() < 2) return -1;
  return static_cast<uint8_t>(reply[1]);
}

// A lane from a writer through the mux to the listener (which expects secret): 100 messages
// arrive whole and in order.
void send_over_lane(PortMux& mux, LaneListener& listener, const LaneSecret& secret) {
  LaneWriter writer("127.0.0.1", mux.port(), secret, listener.port());
  for (int i = 0; i < 5000 && writer.state() != LaneWriter::State::up && writer.state() != LaneWriter::State::broken; ++i)
    usleep(1000);
  REQUIRE(writer.state() == LaneWriter::State::up);
  std::optional<LaneListener::Accepted> accepted;
  for (int i = 0; i < 5000 && !accepted; ++i) {
    auto got = listener.poll(now_ms(), nullptr);
    if (!got.empty()) accepted = std::move(got.front());
    usleep(1000);
  }
  REQUIRE(accepted);
  LaneIn in(std::move(*accepted), 1 << 20);
  Header h;
  h.kind = Kind::Call;
  h.sender = "writer";
  for (uint64_t i = 1; i <= 100; ++i) {
    h.corr = i;
    std::vector<zmq::message_t> frames;
    frames.emplace_back(1000);
    REQUIRE(writer.write(encode_header(h), frames, true, 5000) == LaneWriter::Result::ok);
  }
  std::vector<Message> got;
  std::vector<LaneIn::TooLarge> too_large;
  std::string error;
  for (int i = 0; i < 5000 && got.size() < 100; ++i) {
    REQUIRE(in.read(got, too_large, &error) == LaneIn::Status::open);
    usleep(1000);
  }
  REQUIRE(got.size() == 100);
  for (uint64_t i = 0; i < 100; ++i) CHECK(got[i].header.corr == i + 1);
}

// Two ends of a loopback TCP connection.
struct RawTcpPair {
  int server = -1, client = -1;
  RawTcpPair() {
    int l = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    REQUIRE(::bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    REQUIRE(::listen(l, 1) == 0);
    REQUIRE(::getsockname(l, reinterpret_cast<sockaddr*>(&sa), &len) == 0);
    client = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(::connect(client, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    server = ::accept(l, nullptr, nullptr);
    ::close(l);
    REQUIRE(server >= 0);
  }
  ~RawTcpPair() {
    ::close(server);
    ::close(client);
  }
};

}  // namespace

TEST_CASE("the agent and a proc behind it are reached through the one port, CURVE end to end",
          "[tcp][relay]") {
  KeyFile key;
  PortMux mux("tcp://127.0.0.1:0");
  Node agent("hostd", "ipc:///tmp/xmesh-mux-agent-" + std::to_string(getpid()), "k");
  const std::string agent_addr = "tcp://127.0.0.1:" + std::to_string(mux.port());
  agent.transport().listen_tcp("tcp://127.0.0.1:*", key.path, agent_addr);
  mux.start(port_of(agent.transport().tcp_bound_addr()));
  // A proc listening on loopback, reached as tcp://127.0.0.1:MUX/PORT.
  const int proc_port = *free_tcp_port("127.0.0.1", 0, 0, {});
  TcpEndpoint behind = TcpEndpoint::parse(agent_addr);
  behind.behind = proc_port;
  Node proc("proc", "tcp://127.0.0.1:" + std::to_string(proc_port), "k", key.path, behind.str());
  Node controller("controller", "tcp://127.0.0.1:*", "k", key.path);
  for (Node* n : {&agent, &proc, &controller}) {
    n->transport().cookies().present_by_default("k");
    n->start();
  }
  CHECK(proc.addr() == behind.str());

  Header h;
  h.kind = Kind::Configure;
  controller.send(agent_addr, h, {});
  REQUIRE(agent.control().pop(5000));

  SECTION("a proc the relay was told of") {
    mux.allow(proc_port);
    for (int i = 0; i < 20; ++i) controller.send(proc.addr(), h, {});
    for (int i = 0; i < 20; ++i) REQUIRE(proc.control().pop(5000));
    proc.send(controller.addr(), h, {});  // and back, directly
    REQUIRE(controller.control().pop(5000));
    CHECK(mux.stats().relayed_to_procs >= 1);
    CHECK(mux.stats().relayed_to_agent >= 1);
  }
  SECTION("a port the relay was not told of (or no longer) is not reached") {
    controller.send(proc.addr(), h, {});
    CHECK_FALSE(proc.control().pop(800));
    CHECK(mux.stats().refused >= 1);
  }
}

TEST_CASE("the relay opens only the loopback ports of live procs, and closes garbage and silence",
          "[tcp][relay]") {
  setenv("XMESH_HANDSHAKE_MS", "300", 1);
  PortMux mux("tcp://127.0.0.1:0");
  unsetenv("XMESH_HANDSHAKE_MS");
  mux.start(1);  // no agent behind: only the SOCKS side is exercised here
  const int open = *free_tcp_port("127.0.0.1", 0, 0, {});
  // Something listens at `open`, so a CONNECT allowed there succeeds.
  Node target("proc", "tcp://127.0.0.1:" + std::to_string(open), "k");
  mux.allow(open);

  CHECK(socks_reply_code(mux.port(), connect_request(1, 1, std::string("\x7f\x00\x00\x01", 4), open)) == 0x00);
  CHECK(socks_reply_code(mux.port(), connect_request(1, 3, "localhost", open)) == 0x00);
  // Not an allowed port, not loopback, not CONNECT, not an address type it takes.
  CHECK(socks_reply_code(mux.port(), connect_request(1, 1, std::string("\x7f\x00\x00\x01", 4), open + 1)) == 0x02);
  CHECK(socks_reply_code(mux.port(), connect_request(1, 1, std::string("\x0a\x00\x00\x01", 4), open)) == 0x02);
  CHECK(socks_reply_code(mux.port(), connect_request(1, 3, "example.org", open)) == 0x02);
  CHECK(socks_reply_code(mux.port(), connect_request(2, 1, std::string("\x7f\x00\x00\x01", 4), open)) == 0x07);
  CHECK(socks_reply_code(mux.port(), connect_request(1, 4, std::string(15, '\0') + "\x01", open)) == 0x08);
  mux.forbid(open);
  CHECK(socks_reply_code(mux.port(), connect_request(1, 1, std::string("\x7f\x00\x00\x01", 4), open)) == 0x02);

  {  // a greeting offering only username/password authentication
    RawClient c(mux.port());
    c.send_bytes(std::string("\x05\x01\x02", 3));
    CHECK(c.receive(2) == std::string("\x05\xff", 2));
    CHECK(c.closed_by_peer());
  }
  {  // neither ZeroMQ nor SOCKS
    RawClient c(mux.port());
    c.send_bytes("GET / HTTP/1.1\r\n\r\n");
    CHECK(c.closed_by_peer());
  }
  {  // silence: closed after XMESH_HANDSHAKE_MS
    RawClient c(mux.port());
    CHECK(c.closed_by_peer());
  }
  CHECK(mux.stats().refused >= 8);
}

TEST_CASE("a proc that listens only later is reached once it does, never refused meanwhile", "[tcp][relay]") {
  KeyFile key;
  PortMux mux("tcp://127.0.0.1:0");
  mux.start(1);
  const int proc_port = *free_tcp_port("127.0.0.1", 0, 0, {});
  mux.allow(proc_port);
  TcpEndpoint behind{"127.0.0.1", mux.port(), proc_port};
  Node controller("controller", "tcp://127.0.0.1:*", "k", key.path);
  controller.transport().cookies().present_by_default("k");
  controller.start();
  Header h;
  h.kind = Kind::Configure;
  Header call;
  call.kind = Kind::Call;
  auto pending = controller.call({{behind.str(), "x"}}, call, {}, true);
  controller.send(behind.str(), h, {});  // held while the relay tries again
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  CHECK_FALSE(pending->wait_done(0));  // not failed as refused
  Node proc("proc", "tcp://127.0.0.1:" + std::to_string(proc_port), "k", key.path, behind.str());
  proc.transport().cookies().present_by_default("k");
  proc.start();
  auto got = proc.control().pop(10000);
  REQUIRE(got);
  CHECK(got->header.kind == Kind::Configure);
}

// A TCP lane (tcp_lane.hpp) to a proc behind the agent's one port: the writer asks the PortMux
// with SOCKS5 for the proc's loopback lane port, then the lane runs through the relay; a port
// the agent does not allow is refused, said.
TEST_CASE("a TCP lane reaches a proc's loopback lane port through the agent's one port", "[tcp][relay][lanes]") {
  PortMux mux("tcp://127.0.0.1:0");
  mux.start(1);
  LaneListener listener("127.0.0.1", 0);
  LaneSecret secret = make_lane_secret();
  listener.expect(secret, "tcp://writer:1", now_ms(), 10000);
  {
    LaneWriter refused("127.0.0.1", mux.port(), secret, listener.port());  // not allowed yet
    for (int i = 0; i < 5000 && refused.state() != LaneWriter::State::broken; ++i) usleep(1000);
    CHECK(refused.state() == LaneWriter::State::broken);
    CHECK_THAT(refused.error(), Catch::Contains("refused to reach port " + std::to_string(listener.port())));
  }
  mux.allow(listener.port());
  send_over_lane(mux, listener, secret);
  CHECK(mux.stats().relayed_to_procs == 1);
  CHECK(mux.stats().lanes_handed_over == 0);
}

// The connection handed to the proc (SCM_RIGHTS to its hand-over socket) instead of relayed:
// the lane reads the same, and the PortMux counts a hand-over, not a relay. A hand-over socket
// that is not there (the proc gone, or one that never bound it) leaves the relay as the way.
TEST_CASE("a lane's connection is handed over to the proc behind the agent's port", "[tcp][relay][lanes]") {
  PortMux mux("tcp://127.0.0.1:0");
  mux.start(1);
  ScratchDir dir;
  LaneListener listener("127.0.0.1", 0, dir.dir + "/p.lanes");
  LaneSecret secret = make_lane_secret();
  SECTION("handed over") {
    listener.expect(secret, "tcp://writer:1", now_ms(), 10000);
    mux.allow(listener.port(), listener.handover_path());
    const uint64_t wakes_before = mux.stats().event_wakes;
    send_over_lane(mux, listener, secret);
    CHECK(mux.stats().lanes_handed_over == 1);
    CHECK(mux.stats().relayed_to_procs == 0);
    // The lane's bytes are the proc's alone: the relay thread does not wake for them (a
    // connection left in its epoll set woke it for every byte until the proc read it).
    CHECK(mux.stats().event_wakes - wakes_before < 10);
  }
  SECTION("no hand-over socket there: relayed") {
    listener.expect(secret, "tcp://writer:1", now_ms(), 10000);
    mux.allow(listener.port(), dir.dir + "/nobody.lanes");
    send_over_lane(mux, listener, secret);
    CHECK(mux.stats().lanes_handed_over == 0);
    CHECK(mux.stats().relayed_to_procs == 1);
  }
  SECTION("the token before or after the agent's yes, whole or split") {
    mux.allow(listener.port(), listener.handover_path());
    for (int split : {0, 5, 16}) {  // token bytes sent with the CONNECT; the rest after the yes
      LaneSecret s = make_lane_secret();
      listener.expect(s, "tcp://writer:" + std::to_string(split), now_ms(), 10000);
      RawClient c(mux.port());
      c.send_bytes(std::string("\x05\x01\x00", 3));
      REQUIRE(c.receive(2) == std::string("\x05\x00", 2));
      c.send_bytes(connect_request(1, 1, std::string("\x7f\x00\x00\x01", 4), listener.port()) + s.token.substr(0, split));
      REQUIRE(c.receive(10).substr(0, 2) == std::string("\x05\x00", 2));
      if (split < 16) c.send_bytes(s.token.substr(split));
      std::vector<LaneListener::Accepted> got;
      for (int i = 0; i < 5000 && got.empty(); ++i) {
        got = listener.poll(now_ms(), nullptr);
        usleep(1000);
      }
      REQUIRE(got.size() == 1);
      CHECK(got[0].writer_addr == "tcp://writer:" + std::to_string(split));
      got[0].fd.reset();
    }
    CHECK(mux.stats().lanes_handed_over == 3);
  }
}

// Whatever else reaches a proc's hand-over socket is closed and forgotten: a datagram without
// the hand-over's tag, a file that is not a TCP connection, no file at all.
TEST_CASE("a lane listener's hand-over socket takes only TCP connections said to be lanes", "[tcp][lanes]") {
  ScratchDir dir;
  LaneListener listener("127.0.0.1", 0, dir.dir + "/p.lanes");
  std::vector<int> before;
  listener.fds(before);
  int via = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  RawTcpPair tcp;
  CHECK(hand_over_lane(via, pipe_fds[0], "", listener.handover_path()));            // not a socket
  CHECK(send_with_fds(via, "X", {tcp.server}, listener.handover_path()) == 1);        // no tag
  sockaddr_un to{};
  to.sun_family = AF_UNIX;
  std::strcpy(to.sun_path, listener.handover_path().c_str());
  CHECK(::sendto(via, "Lx", 2, 0, reinterpret_cast<sockaddr*>(&to), sizeof to) == 2);  // no file
  int unix_pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, unix_pair) == 0);
  CHECK(hand_over_lane(via, unix_pair[0], "", listener.handover_path()));            // not TCP
  std::vector<std::string> refused;
  CHECK(listener.poll(now_ms(), &refused).empty());
  std::vector<int> after;
  listener.fds(after);
  CHECK(after.size() == before.size());  // none of them presenting a token
  CHECK(hand_over_lane(via, tcp.server, "", listener.handover_path()));              // a TCP connection: taken
  CHECK(listener.poll(now_ms(), &refused).empty());
  after.clear();
  listener.fds(after);
  CHECK(after.size() == before.size() + 1);
  for (int fd : {via, pipe_fds[0], pipe_fds[1], unix_pair[0], unix_pair[1]}) ::close(fd);
}

// Issue 41, finding 7: connections that start like ZMTP (\xff\x00\x00) and then say nothing were
// spliced to the agent at once and held 3 files each; ~1,500 filled an agent whose fd limit is
// 1024. Now a ZMTP connection is spliced only once its 10-byte signature came, and past the bounds
// on connections still saying what they are or still in their handshake, the oldest are closed:
// a controller that connects during the flood gets through.
TEST_CASE("a flood of half-open connections cannot keep a legitimate controller out", "[tcp][relay]") {
  setenv("XMESH_HANDSHAKE_MS", "60000", 1);  // only the bounds can close the flood's connections
  setenv("XMESH_PORT_PREAMBLES", "16", 1);
  setenv("XMESH_PORT_HANDSHAKES", "8", 1);
  KeyFile key;
  PortMux mux("tcp://127.0.0.1:0");
  Node agent("hostd", "ipc:///tmp/xmesh-mux-flood-" + std::to_string(getpid()), "k");
  unsetenv("XMESH_PORT_PREAMBLES");
  unsetenv("XMESH_PORT_HANDSHAKES");
  const std::string agent_addr = "tcp://127.0.0.1:" + std::to_string(mux.port());
  agent.transport().listen_tcp("tcp://127.0.0.1:*", key.path, agent_addr);
  unsetenv("XMESH_HANDSHAKE_MS");
  mux.start(port_of(agent.transport().tcp_bound_addr()));
  agent.transport().cookies().present_by_default("k");
  agent.start();

  std::vector<std::unique_ptr<RawClient>> flood;
  for (int i = 0; i < 100; ++i) {  // three bytes of a greeting, then silence
    flood.push_back(std::make_unique<RawClient>(mux.port()));
    flood.back()->send_bytes(std::string("\xff\x00\x00", 3));
  }
  for (int i = 0; i < 50; ++i) {  // a whole signature, then silence in the handshake
    flood.push_back(std::make_unique<RawClient>(mux.port()));
    flood.back()->send_bytes(std::string("\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f", 10));
  }
  for (int i = 0; i < 2000 && mux.stats().accepted < 150; ++i) usleep(1000);
  REQUIRE(mux.stats().accepted == 150);
  // The relay reads each connection's first bytes as they come: wait for it to have judged all.
  for (int i = 0; i < 5000 && mux.stats().evicted < 150 - 16 - 8; ++i) usleep(1000);
  auto s = mux.stats();
  CHECK(s.relayed_to_agent <= 50);       // a 3-byte start is never spliced
  CHECK(s.evicted >= 150 - 16 - 8);      // what the bounds do not hold was closed
  size_t open = 0;
  for (auto& c : flood) {  // what the relay still holds: within its bounds
    timeval tv{0, 20000};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b;
    ssize_t r = ::recv(c->fd, &b, 1, 0);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) ++open;
  }
  CHECK(open <= 16 + 8);

  Node controller("controller", "tcp://127.0.0.1:*", "k", key.path);
  controller.transport().cookies().present_by_default("k");
  controller.start();
  Header h;
  h.kind = Kind::Configure;
  controller.send(agent_addr, h, {});
  REQUIRE(agent.control().pop(10000));  // the controller got in
  controller.stop();
  agent.stop();
}
