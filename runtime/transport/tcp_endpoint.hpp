// TCP endpoints as xmesh names them ("tcp://host:port", IPv6 hosts in brackets): parsing, the
// checks a listening address needs (loopback, wildcard), and the free ports a host agent hands
// to the procs it starts for controllers over TCP. One home for these, shared by the transport
// and the host agent.
//
// A proc reached through its host agent's one port has an address "tcp://host:port/N": the agent
// listens at host:port and relays a SOCKS5 CONNECT to the proc's loopback port N there
// (port_mux.hpp); a node dials such an address through that proxy (ZMQ_SOCKS_PROXY), the ZMTP
// handshake and CURVE running end to end.
#pragma once
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

namespace xmesh {

struct TcpEndpoint {
  std::string host;  // without brackets
  int port = 0;      // 0: any (a wildcard port, "*" or "0")
  int behind = 0;    // a loopback port on that host reached through the agent at host:port; 0: none

  // "tcp://host:port" ("tcp://" optional); throws std::invalid_argument naming what is wrong.
  static TcpEndpoint parse(const std::string& text);
  std::string str() const;  // "tcp://host:port[/behind]", brackets around an IPv6 host
  std::string proxy() const;  // "host:port" (the agent that relays to `behind`)
  bool loopback() const;    // 127.0.0.0/8, ::1, localhost
  bool wildcard() const;    // 0.0.0.0, ::, * (every interface: not an address to advertise)
};

// Whether a tcp:// address is one only this machine reaches.
bool loopback_tcp(const std::string& addr);

// The loopback port of a proc reached through its host agent's port (tcp://host:port/N); 0 for
// any other address. Cheap: it parses only addresses that have the "/N".
int relayed_port(const std::string& addr);

// A port on host that nobody listens on now, for a proc to bind: from [first, last] skipping
// `taken` (first = 0: any port the kernel gives). nullopt when none is free. A port is tried by
// binding it (SO_REUSEADDR, as ZeroMQ binds) and closing again.
std::optional<int> free_tcp_port(const std::string& host, int first, int last, const std::set<int>& taken);
// The same, looking from the top of the range down (ports kept apart from those taken from below).
std::optional<int> free_tcp_port_from_top(const std::string& host, int first, int last, const std::set<int>& taken);

// A non-blocking socket listening at `at` (an IP address; port 0: any), and the port it got.
// Throws std::runtime_error naming the address and why.
int listening_socket(const TcpEndpoint& at, int* bound_port);
// A non-blocking socket whose connection to `to` (an IP address) is under way (poll it for
// writing to learn the outcome). Throws std::runtime_error naming the address and why.
int connecting_socket(const TcpEndpoint& to);

}  // namespace xmesh
