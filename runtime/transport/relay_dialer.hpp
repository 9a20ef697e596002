// RelayDialer: how a process reaches a proc behind its host agent's one port
// ("tcp://host:port/N", tcp_endpoint.hpp). ZeroMQ cannot name such an address (and its own SOCKS
// client, in the libzmq of Debian 12, aborts the process when a socket closes after a failed
// proxy attempt), so the node's DEALER connects to a loopback listener of this dialer, one per
// such address. For each connection made there the dialer connects to host:port, asks the agent's
// PortMux (port_mux.hpp) for the proc's loopback port N with a SOCKS5 CONNECT, then splices the
// two. The ZMTP handshake and CURVE run end to end, through both relays, as on a direct link.
//
// Until the agent answers yes (the proc does not listen yet, the host is unreachable) the dialer
// tries again (10 ms, doubling to 200 ms, as ZeroMQ reconnects) and keeps the local connection
// open, so the node sees a connection whose handshake is slow, never one refused. When either
// end of a splice closes, both do: the node notices, connects again, and resends what it lost.
#pragma once
#include <sys/socket.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "socks_route.hpp"
#include "splice.hpp"

namespace xmesh {

class RelayDialer : private SpliceLoop {
 public:
  RelayDialer();
  ~RelayDialer() override;
  // The loopback endpoint ("tcp://127.0.0.1:L") a socket connects to in order to reach addr
  // (tcp://host:port/N, or any TCP address through a gateway) along `route`; the same for the
  // same addr. Another route for a known addr (its gateway changed) is taken from now on: the
  // connections made after it, the socket's reconnects included, go the new way. Throws
  // std::runtime_error when the route's host does not resolve or no listener can be made.
  std::string local_endpoint(const std::string& addr, const SocksRoute& route);
  std::vector<std::string> addrs() const;  // every addr it has an endpoint for
  // Nothing more goes to addr: its listener and connections close.
  void forget(const std::string& addr);

 private:
  struct Route {
    std::string addr;
    int listen_fd = -1;
    sockaddr_storage agent{};  // the route's host:port, resolved
    socklen_t agent_len = 0;
    SocksRoute route;
    std::string endpoint;
  };
  enum State { kConnecting, kAwaitingReply, kBackoff };
  void on_listener(uint64_t key) override;
  bool on_event(Conn& c, Side side, uint32_t events) override;
  void on_tick(int64_t now) override;  // tries again what backed off
  void connect_upstream(Conn& c);
  bool upstream_connected(Conn& c);
  bool read_reply(Conn& c);
  void back_off(Conn& c);
  void apply_changes();  // listeners added or forgotten by other threads

  mutable std::mutex mu_;  // guards the tables below and the change lists
  std::map<std::string, uint64_t> by_addr_;
  std::map<uint64_t, Route> routes_;  // by key
  uint64_t next_key_ = 1;
  std::vector<uint64_t> added_, forgotten_;
  std::vector<int> retired_fds_;  // listeners of forgotten routes, closed by the loop
};

}  // namespace xmesh
