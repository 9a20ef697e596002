// SocksRoute: how one TCP connection reaches a node of the cluster, in one place for every kind
// of connection a process opens (its DEALERs' relay, lanes, a controller's back connections):
// to the node's port directly, or through a **gateway**, a host agent's PortMux that this
// process reaches when it reaches no other (a controller outside the cluster behind `ssh -L
// 7000:node1:7000`; docs/architecture/04-hosts-and-jobs.md, "One forwarded port"), asked with a
// SOCKS5 CONNECT for the node's host:port; then, for a proc behind its agent's port, a CONNECT
// for its loopback port there (or for "xmesh-back", back_links.hpp). Every request goes at once;
// each PortMux answers in turn (kSocks5ReplyBytes each) and passes on what follows its request.
#pragma once
#include <string>
#include <vector>

#include "tcp_endpoint.hpp"

namespace xmesh {

// What a PortMux answers one SOCKS5 greeting and CONNECT: its choice of method, then the reply.
constexpr size_t kSocks5ReplyBytes = 12;

struct SocksHop {
  std::string name;  // a host (name or address) the PortMux opens, "127.0.0.1" for its own procs, or "xmesh-back"
  int port = 0;
  bool operator==(const SocksHop& o) const { return name == o.name && port == o.port; }
};

struct SocksRoute {
  std::string host;  // where the TCP connection goes: the gateway, else the node's host
  int port = 0;
  std::vector<SocksHop> hops;  // CONNECTs, in order

  // The greeting and CONNECT of every hop, to send at once.
  std::string requests() const;
  size_t reply_bytes() const { return hops.size() * kSocks5ReplyBytes; }
  // What the PortMuxes answered so far (complete or not): "" while nothing is wrong, else why not,
  // naming the hop that refused.
  std::string reply_problem(const std::string& replies) const;
  std::string describe() const;  // "host:port" and the hops, for errors
  bool operator==(const SocksRoute& o) const { return host == o.host && port == o.port && hops == o.hops; }
  bool operator!=(const SocksRoute& o) const { return !(*this == o); }
};

// The route to `to` (a node's endpoint: host:port, and `behind` for a proc behind its agent)
// through `gateway` ("host:port"; "" for none); `last` replaces the CONNECT to `behind` (a lane's
// or back connection's own target; port 0 with an empty name: none).
SocksRoute socks_route(const std::string& gateway, const TcpEndpoint& to, const SocksHop& last = {});

// One hop's greeting and CONNECT (no authentication): 127.0.0.1 as an IPv4 address, anything
// else as a domain name.
std::string socks5_request(const SocksHop& hop);
// A single hop to the loopback port of a proc behind the agent: socks5_request({"127.0.0.1", port}).
std::string socks5_connect_request(int port);
// What the agent answered one request so far: "" while nothing is wrong, else why not.
std::string socks5_reply_problem(const std::string& reply, int port);

}  // namespace xmesh
