// What the transport's files share about its ZeroMQ sockets (internal to runtime/transport/).
#pragma once
#include <string>

#include <zmq.hpp>

#include "tcp_endpoint.hpp"
#include "util.hpp"

namespace xmesh::transport_sockets {

constexpr size_t kFdSpare = 32;  // kept free for libzmq, pipes and files whatever happens

inline void set_common_options(zmq::socket_t& s) {
  s.set(zmq::sockopt::linger, static_cast<int>(env_int("XMESH_LINGER_MS", 1000)));
}

// A TCP connection whose peer stops answering ZMTP heartbeats is closed and made again (the
// DEALER's side), so that a link that comes back is used at once rather than after TCP's
// retransmission back-off; what it lost is sent again (transport.hpp). A ROUTER lets the new
// connection take over the routing id of the old one it may not have noticed dead yet.
inline void set_tcp_link_options(zmq::socket_t& s, bool router) {
  s.set(zmq::sockopt::heartbeat_ivl, static_cast<int>(env_int("XMESH_LINK_HEARTBEAT_MS", 1000)));
  s.set(zmq::sockopt::heartbeat_timeout, static_cast<int>(env_int("XMESH_LINK_TIMEOUT_MS", 3000)));
  if (router) s.set(zmq::sockopt::router_handover, 1);
}

// Whether a tcp:// address names an IPv6 host ("tcp://[fd13::1]:7000", "tcp://[::]:*"). Without
// ZeroMQ's ipv6 option libzmq neither dials nor binds an IPv6 address: a DEALER always has it (an
// IPv6 literal, a name that resolves to IPv6; IPv4 still works), a ROUTER only where it binds an
// IPv6 address (with it, a bind to 127.0.0.1 would name itself tcp://[::ffff:127.0.0.1]:PORT).
inline bool ipv6_literal(const std::string& addr) { return addr.rfind("tcp://[", 0) == 0; }

inline bool is_tcp(const std::string& addr) { return addr.rfind("tcp://", 0) == 0; }

// A proc behind its host agent's one port (tcp_endpoint.hpp).
inline bool is_relayed(const std::string& addr) { return relayed_port(addr) != 0; }

}  // namespace xmesh::transport_sockets
