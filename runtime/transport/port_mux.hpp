// PortMux: a host agent's one TCP port. Whoever opens a firewall for a node opens this port
// only; the agent and every proc it starts for controllers elsewhere are reached through it.
//
// Each connection is told apart by its first byte. A ZeroMQ connection (ZMTP greeting, 0xFF) is
// spliced to the agent's own TCP socket on loopback. A SOCKS5 greeting (0x05) comes from a
// process's RelayDialer (relay_dialer.hpp) dialling a proc behind this agent ("tcp://host:port/N",
// tcp_endpoint.hpp): the CONNECT may name only a loopback port that `allow` opened (a live proc of
// this agent), never anything else, so this is no open proxy; it is then spliced to that port,
// or, for a proc's TCP lane listener that takes connections handed over (tcp_lane.hpp), handed
// to the proc itself (SCM_RIGHTS): its lane's bytes then flow with no thread of the agent
// between the writer and the proc; the splice stays the way when the hand-over fails.
// Splicing copies bytes and reads none of them: the ZMTP handshake, CURVE's authentication and
// encryption run end to end between the two nodes, exactly as on a direct connection. Anything
// else, or a connection that has not said what it is within XMESH_HANDSHAKE_MS, is closed.
//
// Connections not yet authenticated are bounded in count as well as time, so that a flood of
// half-open ones (slowloris) cannot take every file of the agent: a ZMTP connection is spliced
// only once its whole 10-byte signature came; at most XMESH_PORT_PREAMBLES (128) connections may
// wait to say what they are and at most XMESH_PORT_HANDSHAKES (64) spliced to the agent may be
// younger than the handshake time (3 files each: the two ends here and the agent's own). Past
// either bound the oldest such connection is closed (counted as evicted): a legitimate peer
// says what it is and finishes its handshake within milliseconds, so it is always the newest
// and gets through a flood.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <map>
#include <string>
#include <vector>

#include <sys/socket.h>

#include "unique_fd.hpp"
#include "splice.hpp"
#include "tcp_endpoint.hpp"

namespace xmesh {

class PortMux : private SpliceLoop {
 public:
  // Binds `listen` (tcp://ADDR:PORT; port 0 or * for any). Throws std::runtime_error naming the
  // address when it cannot.
  explicit PortMux(const std::string& listen);
  ~PortMux() override;

  int port() const { return port_; }  // the one bound
  // Starts relaying: ZeroMQ connections go to the agent's socket at this loopback port.
  void start(int agent_port);
  // A proc listening at this loopback port may be reached (until forbid); a connection asking
  // for it is handed over to the unix datagram socket at `handover` where one is named.
  void allow(int port, const std::string& handover = "");
  // A controller's back connections (back_links.hpp: a SOCKS5 CONNECT to "xmesh-back") naming the
  // proc at this loopback port are handed over to it at `handover` (its lane listener's socket).
  void allow_back(int port, const std::string& handover);
  void forbid(int port);  // both
  // A gateway (socks_route.hpp): a SOCKS5 CONNECT naming host:port (by this name, or its address
  // as resolved now) is relayed to that address, for a controller outside the cluster that reaches
  // the other agents' ports through this one. Only agents' addresses its controllers name over
  // their authenticated link are let through (never an open proxy). Throws std::runtime_error
  // when host does not resolve here.
  void allow_remote(const std::string& host, int port);
  // Who takes the back connections naming port 0, this agent's own (before start()).
  using BackAdopter = std::function<void(unique_fd fd, std::string early)>;
  void set_back_adopter(BackAdopter adopter) { back_adopter_ = std::move(adopter); }

  struct Stats {
    uint64_t accepted = 0, relayed_to_agent = 0, relayed_to_procs = 0, lanes_handed_over = 0, refused = 0;
    uint64_t back = 0;  // a controller's back connections taken (for this agent or handed to a proc)
    uint64_t relayed_to_remote = 0;  // as a gateway: to another agent's port
    uint64_t evicted = 0;  // not authenticated yet, closed to make room for newer ones
    uint64_t event_wakes = 0;  // the relay thread's wake-ups for socket events
  };
  Stats stats() const;

 private:
  enum State { kPreamble, kSocksRequest, kConnecting };
  void on_listener(uint64_t key) override;
  bool on_event(Conn& c, Side side, uint32_t events) override;
  void on_tick(int64_t now) override;  // closes pairs that said nothing in time
  bool read_preamble(Conn& c);
  bool socks_request(Conn& c);
  bool connect_target(Conn& c, int port);
  bool target_connected(Conn& c);
  bool refuse(Conn& c, uint8_t socks_reply = 0);  // counts it; answers a SOCKS client why
  // Whether port may be reached; *handover: where its connections are handed over ("": none).
  bool allowed(int port, std::string* handover = nullptr) const;
  bool hand_over(Conn& c, const std::string& handover);
  bool back_connection(Conn& c, int port);  // a CONNECT to "xmesh-back": the agent's or a proc's
  // A CONNECT to another host: the address allow_remote let through for it, if any.
  struct Remote {
    std::string name, numeric;
    int port = 0;
    sockaddr_storage addr{};
    socklen_t len = 0;
  };
  bool remote_allowed(const std::string& name, int port, Remote* out) const;
  bool connect_remote(Conn& c, const Remote& to);
  void count(uint64_t Stats::*counter);
  // Closes the oldest connections still saying what they are while more than the bound wait.
  void bound_preambles();
  // A connection spliced to the agent now: the oldest of those still in their handshake time
  // closed while more than the bound are.
  void bound_handshakes(uint64_t id);

  unique_fd listen_fd_;
  unique_fd handover_sock_;  // an unbound unix datagram socket: hand-overs leave through it
  int port_ = 0, agent_port_ = 0;
  int64_t preamble_ms_;
  bool accepting_ = true;  // false for a while when out of files
  int64_t accept_again_ms_ = 0;
  mutable std::mutex mu_;  // guards allowed_ and stats_
  std::map<int, std::string> allowed_;  // port: its hand-over socket, or ""
  std::map<int, std::string> back_;     // a proc's port: where its back connections are handed over
  BackAdopter back_adopter_;
  std::vector<Remote> remotes_;  // under mu_
  Stats stats_;
  size_t max_preambles_, max_handshakes_;
  std::deque<std::pair<uint64_t, int64_t>> handshaking_;  // (conn id, spliced at) to the agent, oldest first
};

}  // namespace xmesh
