// Back connections (back_links.hpp): a controller its nodes cannot connect to (its advertised
// address has nobody listening, as behind a NAT) is reached through the connections it opens to
// their host agent's one port, CURVE end to end; the pool takes only connections presenting the
// token its controller gave.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "back_links.hpp"
#include "env_helper.hpp"
#include "key_file_helper.hpp"
#include "node.hpp"
#include "port_mux.hpp"
#include "scratch_dir_helper.hpp"
#include "tcp_endpoint.hpp"
#include "util.hpp"

using namespace xmesh;

namespace {
int port_of(const std::string& addr) { return TcpEndpoint::parse(addr).port; }

// An address nobody listens at: what the controller's advertised address is to its nodes.
std::string unreachable_addr() { return "tcp://127.0.0.1:" + std::to_string(*free_tcp_port("127.0.0.1", 0, 0, {})); }

// A host agent behind its PortMux, taking its controllers' back connections, as xmesh-hostd does.
struct Agent {
  PortMux mux{"tcp://127.0.0.1:0"};
  Node node;
  std::string addr;
  explicit Agent(const std::string& key_path)
      : node("hostd", "ipc:///tmp/xmesh-back-agent-" + std::to_string(getpid()), "k"),
        addr("tcp://127.0.0.1:" + std::to_string(mux.port())) {
    node.transport().listen_tcp("tcp://127.0.0.1:*", key_path, addr);
    mux.set_back_adopter([this](unique_fd fd, std::string early) {
      node.transport().adopt_back_connection(std::move(fd), std::move(early));
    });
    mux.start(port_of(node.transport().tcp_bound_addr()));
  }
};

Header configure() {
  Header h;
  h.kind = Kind::Configure;
  return h;
}
}  // namespace

TEST_CASE("a controller its agent cannot connect to is answered over the connections it opens", "[tcp][back][inv:transport.4]") {
  KeyFile key;
  Agent agent(key.path);
  Node controller("controller", "tcp://127.0.0.1:*", "k", key.path, unreachable_addr());
  for (Node* n : {&agent.node, &controller}) {
    n->transport().cookies().present_by_default("k");
    n->start();
  }
  SECTION("reached back: both ways") {
    controller.transport().set_reach_back(true);
    for (int i = 0; i < 20; ++i) controller.send(agent.addr, configure(), {});
    for (int i = 0; i < 20; ++i) REQUIRE(agent.node.control().pop(5000));
    for (int i = 0; i < 20; ++i) agent.node.send(controller.addr(), configure(), {});
    for (int i = 0; i < 20; ++i) REQUIRE(controller.control().pop(5000));
    auto back = controller.transport().back_stats();
    CHECK(back.dialer.zmtp == 1);  // one connection carries the agent's DEALER
    CHECK(agent.node.transport().back_stats().pool.joined == 1);
    CHECK(agent.mux.stats().back >= 2);  // and a spare waits beside it
    CHECK_THAT(agent.node.transport().link_report(controller.addr()),
               Catch::Contains("reached through the connections it opens for this node"));
    CHECK_THAT(controller.transport().link_report(agent.addr), Catch::Contains("ready, 1 used"));
  }
  SECTION("not reached back: the agent's answer does not come, and the report says which way failed") {
    controller.send(agent.addr, configure(), {});
    REQUIRE(agent.node.control().pop(5000));
    agent.node.send(controller.addr(), configure(), {});
    CHECK_FALSE(controller.control().pop(800));
    for (int i = 0; i < 100 && controller.transport().link_report(agent.addr).find(Transport::kAllAcknowledged) ==
                                   std::string::npos;
         ++i)
      usleep(20000);
    CHECK_THAT(controller.transport().link_report(agent.addr), Catch::Contains(Transport::kAllAcknowledged));
  }
}

// A proc behind the agent's port: its agent hands it the controller's connections (its lane
// listener's hand-over socket); it learned the controller's token from the controller's Hello.
TEST_CASE("a proc behind its agent's port answers a controller reached back", "[tcp][back][inv:transport.4]") {
  KeyFile key;
  ScratchDir dir;
  Agent agent(key.path);
  const int proc_port = *free_tcp_port("127.0.0.1", 0, 0, {});
  const int lane_port = *free_tcp_port("127.0.0.1", 0, 0, {proc_port});
  TcpEndpoint behind = TcpEndpoint::parse(agent.addr);
  behind.behind = proc_port;
  Env listen("XMESH_LANE_LISTEN", "tcp://127.0.0.1:" + std::to_string(lane_port));
  Env handover("XMESH_LANE_HANDOVER", dir.dir + "/p.lanes");
  Node proc("proc", "tcp://127.0.0.1:" + std::to_string(proc_port), "k", key.path, behind.str());
  Node controller("controller", "tcp://127.0.0.1:*", "k", key.path, unreachable_addr());
  for (Node* n : {&agent.node, &proc, &controller}) {
    n->transport().cookies().present_by_default("k");
    n->start();
  }
  controller.transport().set_reach_back(true);
  agent.mux.allow(proc_port);
  agent.mux.allow_back(proc_port, dir.dir + "/p.lanes");
  for (int i = 0; i < 10; ++i) controller.send(proc.addr(), configure(), {});
  for (int i = 0; i < 10; ++i) REQUIRE(proc.control().pop(5000));
  for (int i = 0; i < 10; ++i) proc.send(controller.addr(), configure(), {});
  for (int i = 0; i < 10; ++i) REQUIRE(controller.control().pop(5000));
  CHECK(proc.transport().back_stats().pool.joined == 1);
  SECTION("a proc the agent does not know: it refuses connections for it") {
    TcpEndpoint nobody = behind;
    nobody.behind = *free_tcp_port("127.0.0.1", 0, 0, {proc_port, lane_port});
    controller.transport().reach_back_to(nobody.str());
    for (int i = 0; i < 200 && controller.transport().back_stats().dialer.failed == 0; ++i) usleep(20000);
    CHECK(controller.transport().back_stats().dialer.failed >= 1);
  }
}

TEST_CASE("a node's back pool takes only connections presenting its controller's token", "[back][inv:transport.4]") {
  BackPool pool;
  const std::string token(kBackTokenBytes, 'x'), controller = "tcp://10.0.0.1:5000";
  auto offer = [&](const std::string& bytes) {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    pool.offer(unique_fd(sv[0]), bytes);
    return sv[1];  // the controller's end
  };
  auto closed_soon = [](int fd) {
    timeval tv{3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char c;
    bool closed = ::recv(fd, &c, 1, 0) == 0;
    ::close(fd);
    return closed;
  };
  pool.learn(controller, token);
  CHECK(closed_soon(offer(back_preamble(std::string(kBackTokenBytes, 'y'), controller))));  // a wrong token
  CHECK(closed_soon(offer("GET / HTTP/1.1\r\n\r\n")));                                      // not a preamble
  CHECK(closed_soon(offer(back_preamble(token, controller) + "more")));                     // more than one
  int good = offer(back_preamble(token, controller).substr(0, 7));  // whole only later
  const std::string rest = back_preamble(token, controller).substr(7);
  REQUIRE(::send(good, rest.data(), rest.size(), 0) == ssize_t(rest.size()));
  unique_fd taken;
  for (int i = 0; i < 200 && !taken; ++i) {
    usleep(10000);
    taken = pool.take(controller);
  }
  REQUIRE(taken);
  char tag = 0;
  REQUIRE(::recv(good, &tag, 1, 0) == 1);
  CHECK(tag == kBackTagLane);
  ::close(good);
  // A connection for a controller not heard of yet is held until its token is learned.
  const std::string later = "tcp://10.0.0.2:5000";
  int held = offer(back_preamble(token, later));
  usleep(50000);
  CHECK_FALSE(pool.take(later));
  pool.learn(later, token);
  unique_fd got;
  for (int i = 0; i < 200 && !got; ++i) {
    usleep(10000);
    got = pool.take(later);
  }
  CHECK(got);
  ::close(held);
  CHECK(pool.stats().refused == 3);
}

// One forwarded port (socks_route.hpp): a controller that reaches only one agent's port reaches
// another agent through it, and only once that agent was told of the other (allow_remote, from
// a controller's authenticated Gateway request); both agents count what they relayed.
TEST_CASE("a gateway agent lets a controller through only to the agents it was told of", "[tcp][relay][back][inv:transport.4]") {
  KeyFile key;
  Agent far(key.path);
  PortMux gateway("tcp://127.0.0.1:0");
  gateway.start(1);  // relays only: no agent of its own behind it here
  Node controller("controller", "tcp://127.0.0.1:*", "k", key.path);
  for (Node* n : {&far.node, &controller}) {
    n->transport().cookies().present_by_default("k");
    n->start();
  }
  controller.transport().set_gateway("127.0.0.1:" + std::to_string(gateway.port()));
  CHECK(controller.transport().gateway_for(far.addr) == "127.0.0.1:" + std::to_string(gateway.port()));
  CHECK(controller.transport().gateway_for("tcp://127.0.0.1:" + std::to_string(gateway.port())).empty());
  std::thread sender([&] { controller.send(far.addr, configure(), {}); });
  usleep(500000);
  CHECK(far.node.control().queued() == 0);  // not let through yet: the gateway refuses, the dialer retries
  CHECK(gateway.stats().refused >= 1);
  gateway.allow_remote("127.0.0.1", port_of(far.addr));
  sender.join();
  REQUIRE(far.node.control().pop(5000));
  far.node.send(controller.addr(), configure(), {});  // and back, directly (reachable here)
  REQUIRE(controller.control().pop(5000));
  CHECK(gateway.stats().relayed_to_remote >= 1);
  CHECK(far.mux.stats().relayed_to_agent >= 1);
  CHECK_THROWS_WITH(gateway.allow_remote("no-such-host.invalid", 7000), Catch::Contains("cannot resolve"));
  CHECK_THROWS_AS(controller.transport().set_gateway("tcp://127.0.0.1:7000/5"), std::invalid_argument);
}

// A gateway that goes away (a port forward that ended with its job) and a new one: the DEALERs
// dialled through the old one reconnect through the new one (Transport::set_gateway moves the
// RelayDialer's routes), with what they had unacknowledged.
TEST_CASE("a controller whose gateway changed reaches its agents through the new one", "[tcp][relay][back]") {
  KeyFile key;
  Agent far(key.path);
  auto old_gateway = std::make_unique<PortMux>("tcp://127.0.0.1:0");
  old_gateway->start(1);
  old_gateway->allow_remote("127.0.0.1", port_of(far.addr));
  Node controller("controller", "tcp://127.0.0.1:*", "k", key.path);
  for (Node* n : {&far.node, &controller}) {
    n->transport().cookies().present_by_default("k");
    n->start();
  }
  controller.transport().set_gateway("127.0.0.1:" + std::to_string(old_gateway->port()));
  controller.send(far.addr, configure(), {});
  REQUIRE(far.node.control().pop(5000));
  CHECK(old_gateway->stats().relayed_to_remote >= 1);
  old_gateway.reset();  // its connections end: the controller's DEALER reconnects
  PortMux new_gateway("tcp://127.0.0.1:0");
  new_gateway.start(1);
  new_gateway.allow_remote("127.0.0.1", port_of(far.addr));
  controller.transport().set_gateway("127.0.0.1:" + std::to_string(new_gateway.port()));
  controller.send(far.addr, configure(), {});
  REQUIRE(far.node.control().pop(10000));
  CHECK(new_gateway.stats().relayed_to_remote >= 1);
}
