// Authentication in the ZMTP handshake, before a single message frame is accepted.
//
// Every node's ROUTER is a PLAIN server (require_handshake). The Gatekeeper, the ZAP handler of
// the node's ZeroMQ context, admits a connection only when the password it presents is a cookie
// the node accepts and, on a unix socket, its peer process runs as this user (SO_PEERCRED,
// which libzmq passes in the request's address). A process without the cookie therefore never
// gets a frame into the node: libzmq buffers nothing for it, nothing of it is decoded, nothing it
// names is dialled. Authentication belongs to the connection, not to the routing id a peer
// chooses. Every DEALER a node connects with presents the cookie of its peer
// (present_credentials) and is watched (HandshakeWatch) until its first handshake ends, so that
// a peer that refuses this node is known at once, with the reason, rather than as silence.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "util.hpp"

namespace xmesh {

class Gatekeeper {
 public:
  using Accepts = std::function<bool(const std::string& cookie)>;
  // Binds the context's ZAP endpoint; the handler thread answers until the context is shut
  // down. Construct it before any socket of ctx accepts connections.
  // curve_public_z85 (the cluster's key file, "" for none): CURVE connections (TCP links) are
  // admitted from peers proving they hold this key's pair, and refused without one. A CURVE
  // connection carries no cookie: the node checks the one its Hello presents (the ZAP reply's
  // User-Id, "curve", tells it so).
  Gatekeeper(zmq::context_t& ctx, std::string role, Accepts accepts, const std::string& curve_public_z85 = "");
  ~Gatekeeper();
  // The cluster's key, given later (a controller that starts using hosts over TCP). Throws
  // std::invalid_argument for a malformed key.
  void set_cluster_key(const std::string& curve_public_z85);
  Gatekeeper(const Gatekeeper&) = delete;
  Gatekeeper& operator=(const Gatekeeper&) = delete;
  // Waits for the handler thread; call after shutting the context down.
  void join();
  uint64_t admitted() const { return admitted_; }
  uint64_t refused() const { return refused_; }

 private:
  void serve(zmq::socket_t& zap);
  // The verdict on one ZAP request: "" to admit, else why not.
  std::string judge(const std::vector<zmq::message_t>& request, std::string* user_id) const;

  std::string role_;
  Accepts accepts_;
  mutable std::mutex key_mu_;
  std::string curve_public_;  // 32 bytes, empty: no CURVE (under key_mu_)
  std::unique_ptr<zmq::socket_t> zap_;
  std::thread thread_;
  std::atomic<uint64_t> admitted_{0}, refused_{0};
  LogBudget refusal_log_;
};

// Makes router a PLAIN server whose connections its context's Gatekeeper judges.
void require_handshake(zmq::socket_t& router);
// Makes dealer present cookie (as PLAIN password) on every connection it makes.
void present_credentials(zmq::socket_t& dealer, const std::string& role, const std::string& cookie);
// The same over TCP: router a CURVE server with the cluster's secret key (its Gatekeeper judges
// each client's key); dealer a CURVE client proving it holds the pair (encrypted from then on).
void require_curve_handshake(zmq::socket_t& router, const std::string& secret_z85);
void present_curve_key(zmq::socket_t& dealer, const std::string& public_z85, const std::string& secret_z85);
// The user id a Gatekeeper gives connections it admitted by key ("curve"), read from a message.
constexpr const char* kCurveUserId = "curve";

// Follows the handshakes of one DEALER until the first one ends (then stops watching, except on
// TCP, where the link can drop and come back, or reach a new process).
class HandshakeWatch {
 public:
  static constexpr int kFailedConnectsRefused = 5;
  enum class State { Pending, Succeeded, Refused };
  // must_listen: the peer is expected to listen already (a host agent, not a proc about to
  // start): connection attempts failing over and over before the first handshake (refused, no
  // route) are a refusal too, said at once instead of waited out.
  // spliced: the connection passes a relay of this process (a back connection, a gateway: a
  // connection that ends before its handshake is the relay's, not a refusal; a refusal of the
  // peer's credentials is still said as one).
  HandshakeWatch(zmq::context_t& ctx, zmq::socket_t& watched, std::string peer_addr, bool must_listen = false,
                 bool spliced = false);
  ~HandshakeWatch();
  HandshakeWatch(const HandshakeWatch&) = delete;
  HandshakeWatch& operator=(const HandshakeWatch&) = delete;
  // Never blocks. Refused: *why says what the peer refused and what to do. A TCP peer stays
  // watched after its first handshake succeeded (reconnected() tells of the next ones).
  State poll(std::string* why);
  // After the first handshake: whether the connection was made again since the last call (a
  // link that came back, or a new process at the address), which must hear Hello again.
  bool reconnected();
  // What became of the connection so far, as of the last poll, for a message about a peer that
  // does not answer: no TCP connection made (and attempts that failed), made but its handshake
  // not finished, or the handshake done.
  std::string describe() const;

 private:
  void stop();
  zmq::socket_t* watched_;
  std::unique_ptr<zmq::socket_t> events_;
  std::string peer_addr_;
  bool tcp_ = false;
  bool relayed_ = false;  // a proc behind its host agent's port (tcp://host:port/N)
  bool must_listen_ = false;
  int failed_connects_ = 0;
  int connects_ = 0;  // TCP connections made (ZMQ_EVENT_CONNECTED)
  State state_ = State::Pending;
};

}  // namespace xmesh
