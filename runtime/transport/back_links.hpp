// Back connections: how a controller the nodes cannot connect to (a laptop behind a NAT, a pod,
// a notebook reached through a port forward) is reached anyway (docs/architecture/03-transport-and-links.md,
// "A controller reached back"). Only the direction in which the TCP connection is opened changes;
// everything above it is as on a direct link.
//
// A controller that says so (`reach back`, Transport::set_reach_back) opens, for each node it
// talks to, a few spare TCP connections to that node's host agent, naming the node (a SOCKS5
// CONNECT to "xmesh-back" at the node's port: 0 for the agent itself, a proc's loopback port
// behind it), followed by a preamble: kBackMagic, the controller's back token (random, told to
// the node in the controller's Hello over its authenticated link, or to a proc by its agent at
// start) and the controller's address. The node keeps such a connection (BackPool) and uses it
// where it would have dialled the controller: its DEALER to the controller connects to a
// loopback listener of the pool, which writes the tag 'Z' on a spare connection and splices the
// two; a TCP lane (or a data-plane stream) to the controller writes the tag 'L' and then what it
// would have sent after connecting. On the controller (BackDialer) a spare that hears 'Z' is
// spliced to its own TCP ROUTER on this machine, one that hears 'L' is handed to its lane
// listener as if accepted there, and a new spare is opened in its place.
//
// Trust: the ZMTP handshake, CURVE and Hello's cookie run end to end through the splices, as on
// a direct link, and a lane's token and key were given over that link; the back token only keeps
// strangers from filling a node's pool (a connection with a wrong one is closed, one for a
// controller not heard of yet is held at most kBackHoldMs, bounded in number).
#pragma once
#include <sys/socket.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "socks_route.hpp"
#include "splice.hpp"
#include "tcp_endpoint.hpp"
#include "unique_fd.hpp"

namespace xmesh {

constexpr char kBackMagic[4] = {'X', 'M', 'B', 'K'};
constexpr size_t kBackTokenBytes = 16;
constexpr char kBackTagZmtp = 'Z', kBackTagLane = 'L';
// The SOCKS5 domain name a back connection asks a host agent's PortMux for; the port names the
// node: 0 the agent itself, else the loopback port of one of its procs.
constexpr const char* kBackSocksName = "xmesh-back";

// The preamble a back connection starts with (after the SOCKS5 request).
std::string back_preamble(const std::string& token, const std::string& controller_addr);
// A preamble read from the front of `bytes`: complete (its parts set, *used its length), not yet
// (false, error empty) or malformed (false, *error why).
struct BackPreamble {
  std::string token, controller_addr;
};
bool read_back_preamble(const std::string& bytes, BackPreamble* out, size_t* used, std::string* error);

// The controller's side: spare connections to every node it is told to reach.
class BackDialer : private SpliceLoop {
 public:
  // A lane or stream written over a back connection (tag 'L'), with the bytes read after the
  // tag: the controller's lane listener takes it as an accepted connection.
  using LaneAdopter = std::function<void(unique_fd fd, std::string early)>;
  // token: this controller's back token; self_addr: its address as nodes name it; router: where
  // its TCP ROUTER listens (a wildcard host is reached on loopback).
  BackDialer(std::string token, std::string self_addr, TcpEndpoint router, LaneAdopter adopt_lane);
  ~BackDialer() override;
  // Keeps spare connections open to addr (a host agent, tcp://host:port, or a proc behind one,
  // tcp://host:port/N) until forgotten, through `gateway` ("host:port", socks_route.hpp; "":
  // directly). Throws std::invalid_argument for an address that does not parse,
  // std::runtime_error when the host it connects to does not resolve.
  void reach(const std::string& addr, const std::string& gateway = "");  // again: its route from now on
  std::vector<std::string> addrs() const;                                   // every peer it reaches
  void forget(const std::string& addr);
  struct Stats {
    uint64_t opened = 0, zmtp = 0, lanes = 0, failed = 0;
  };
  Stats stats() const;
  // How the back connections to addr stand, in words, for a node that does not answer ("" when
  // addr is not reached back): spares ready, none through yet (still connecting), or why they fail.
  std::string describe(const std::string& addr) const;

 private:
  struct Target {
    std::string addr;
    sockaddr_storage agent{};
    socklen_t agent_len = 0;
    SocksRoute route;  // to the agent's PortMux (through a gateway's), then "xmesh-back" at the node's port
    int spares = 0;        // connections open and not used yet (connecting included)
    int ready = 0;         // of them, those its agent said yes to
    uint64_t used = 0;     // taken by the node so far
    int64_t backoff_ms = 0, retry_at = 0;
    std::string failure;
  };
  enum State { kConnecting = 1, kAwaitingReply, kSpare, kToRouter };
  void on_listener(uint64_t) override {}
  bool on_event(Conn& c, Side side, uint32_t events) override;
  void on_tick(int64_t now) override;
  void on_wake() override;
  void top_up();  // opens the spares each target lacks (not backing off)
  void open_spare(uint64_t key, Target& t);
  bool connected(Conn& c);
  bool read_reply(Conn& c);
  bool read_tag(Conn& c);
  bool to_router(Conn& c);
  void failed(Conn& c, const std::string& why);  // a spare that did not come up
  void used(Conn& c, bool lane);                  // a spare taken by its node: replaced

  const std::string token_, self_addr_;
  TcpEndpoint router_;
  LaneAdopter adopt_lane_;
  int spares_wanted_;
  mutable std::mutex mu_;  // the tables and the stats (changed by other threads, read by the loop)
  std::map<std::string, uint64_t> by_addr_;
  std::map<uint64_t, Target> targets_;
  uint64_t next_key_ = 1;
  Stats stats_;
};

// A node's side: the connections controllers opened for it, by controller address.
class BackPool : private SpliceLoop {
 public:
  BackPool();
  ~BackPool() override;
  // Connections presenting token for the controller at addr are taken from now on (the newest
  // token for an address wins); those held for it are checked now.
  void learn(const std::string& addr, const std::string& token);
  bool knows(const std::string& addr) const;
  std::string token_for(const std::string& addr) const;  // hex; "" when not known
  // A connection a controller opened for this node, with what was read of it so far (the
  // preamble or a part of it). Any thread; the pool's thread reads and checks the rest.
  void offer(unique_fd fd, std::string early);
  // The loopback endpoint ("tcp://127.0.0.1:L") a DEALER connects to in order to reach addr:
  // each connection made there is joined to one of addr's back connections, as soon as one is
  // there. Throws std::runtime_error when no listener can be made.
  std::string local_endpoint(const std::string& addr);
  // One of addr's back connections, its tag 'L' written, for a lane or stream; an invalid fd
  // when none is idle now.
  unique_fd take(const std::string& addr);
  void forget(const std::string& addr);
  struct Stats {
    uint64_t offered = 0, refused = 0, idle = 0, joined = 0, taken = 0;
  };
  Stats stats() const;

 private:
  enum State { kPreamble = 1, kWaitingForBack };
  void on_listener(uint64_t key) override;
  bool on_event(Conn& c, Side side, uint32_t events) override;
  void on_tick(int64_t now) override;
  void on_wake() override;  // offers taken, held connections checked against tokens learned
  void take_offers();
  bool read_preamble(Conn& c);
  // A checked connection for addr: to a DEALER connection waiting for one, else idle.
  void keep(Conn& c, const std::string& addr);
  bool join(Conn& local, int back_fd);
  std::string listener_endpoint(uint64_t key) const;  // under mu_

  mutable std::mutex mu_;  // everything below that other threads touch
  std::map<std::string, std::string> tokens_;       // controller address -> its back token (raw)
  std::map<std::string, std::deque<int>> idle_;     // checked connections not in use
  std::map<std::string, uint64_t> listeners_;       // controller address -> its listener key
  struct Listener {
    std::string addr;
    int fd = -1, port = 0;
  };
  std::map<uint64_t, Listener> listener_fds_;  // by key
  std::vector<std::pair<unique_fd, std::string>> offers_;
  std::vector<int> retired_fds_;
  uint64_t next_key_ = 1;
  bool learned_ = false;  // a token was learned since the loop last looked at held connections
  Stats stats_;
};

}  // namespace xmesh
