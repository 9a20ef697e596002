#include "handshake.hpp"

#include "tcp_endpoint.hpp"
#include "util.hpp"

#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include <zmq_addon.hpp>

namespace xmesh {

namespace {
constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";  // fixed by ZAP (RFC 27)
constexpr const char* kDomain = "xmesh";

// The peer's uid and pid from a ZAP address: libzmq appends ":uid:gid:pid" (SO_PEERCRED) to
// the address of a unix-socket peer. False when they are not there.
bool peer_credentials(const std::string& address, long* uid, long* pid) {
  std::vector<std::string> tail;
  size_t end = address.size();
  for (int i = 0; i < 3; ++i) {
    size_t colon = address.rfind(':', end == 0 ? 0 : end - 1);
    if (colon == std::string::npos) return false;
    tail.push_back(address.substr(colon + 1, end - colon - 1));
    end = colon;
  }
  for (auto& t : tail)
    if (t.empty() || t.size() > 12 || t.find_first_not_of("0123456789") != std::string::npos) return false;
  *pid = std::stol(tail[0]);
  *uid = std::stol(tail[2]);
  return true;
}

std::string frame_str(const std::vector<zmq::message_t>& f, size_t i) {
  return i < f.size() ? f[i].to_string() : std::string();
}
}  // namespace

Gatekeeper::Gatekeeper(zmq::context_t& ctx, std::string role, Accepts accepts, const std::string& curve_public_z85)
    : role_(std::move(role)), accepts_(std::move(accepts)), refusal_log_(3, 60000) {
  if (!curve_public_z85.empty()) set_cluster_key(curve_public_z85);
  zap_ = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::rep);
  zap_->set(zmq::sockopt::linger, 0);
  zap_->bind(kZapEndpoint);
  // The socket moves to the handler thread (thread creation is the memory barrier it needs).
  thread_ = runtime_thread([this] { serve(*zap_); });
}

Gatekeeper::~Gatekeeper() { join(); }

void Gatekeeper::set_cluster_key(const std::string& curve_public_z85) {
  uint8_t raw[32];
  if (curve_public_z85.size() != 40 || zmq_z85_decode(raw, curve_public_z85.c_str()) == nullptr)
    throw std::invalid_argument("Gatekeeper: not a Z85 CURVE public key");
  std::lock_guard<std::mutex> g(key_mu_);
  curve_public_.assign(reinterpret_cast<const char*>(raw), sizeof raw);
}

void Gatekeeper::join() {
  if (thread_.joinable()) thread_.join();
}

void Gatekeeper::serve(zmq::socket_t& zap) {
  for (;;) {
    std::vector<zmq::message_t> request;
    try {
      if (!zmq::recv_multipart(zap, std::back_inserter(request))) continue;
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
      continue;
    }
    std::string user_id;
    std::string why = judge(request, &user_id);
    if (why.empty()) {
      ++admitted_;
    } else {
      ++refused_;
      log_diag_limited(refusal_log_, role_, "refused a connection: " + why);
    }
    std::vector<zmq::message_t> reply;
    reply.emplace_back(std::string("1.0"));
    reply.emplace_back(frame_str(request, 1));  // the request id
    reply.emplace_back(std::string(why.empty() ? "200" : "400"));
    reply.emplace_back(why.empty() ? std::string("OK") : why);
    reply.emplace_back(why.empty() ? user_id : std::string());  // user id (a message's "User-Id")
    reply.emplace_back(std::string());  // metadata
    try {
      zmq::send_multipart(zap, reply);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
    }
  }
  zap.close();
}

// Frames: version, request id, domain, address, routing id, mechanism, credentials...
std::string Gatekeeper::judge(const std::vector<zmq::message_t>& request, std::string* user_id) const {
  if (request.size() < 6 || frame_str(request, 0) != "1.0") return "a malformed ZAP request";
  const std::string address = frame_str(request, 3), mechanism = frame_str(request, 5);
  long uid = -1, pid = -1;
  const bool local = peer_credentials(address, &uid, &pid);
  const std::string who = local ? "pid " + std::to_string(pid) : (address.empty() ? "a peer" : address);
  if (local && uid != static_cast<long>(geteuid()))
    return who + " runs as uid " + std::to_string(uid) + ", this " + role_ + " as uid " + std::to_string(geteuid());
  if (mechanism == "CURVE" && request.size() >= 7) {
    std::string cluster_key;
    {
      std::lock_guard<std::mutex> g(key_mu_);
      cluster_key = curve_public_;
    }
    if (cluster_key.empty()) return who + " presented a CURVE key; this " + role_ + " takes no keys";
    if (frame_str(request, 6) != cluster_key) return who + " presented a key that is not this cluster's";
    *user_id = kCurveUserId;  // its cookie is checked at its Hello
    return "";
  }
  if (mechanism != "PLAIN" || request.size() < 8)
    return who + " presented no credentials (mechanism " + mechanism + ")";
  if (!accepts_(frame_str(request, 7))) return who + " presented a wrong or missing cookie";
  *user_id = "plain";
  return "";
}

void require_handshake(zmq::socket_t& router) {
  router.set(zmq::sockopt::plain_server, 1);
  router.set(zmq::sockopt::zap_domain, kDomain);
}

void require_curve_handshake(zmq::socket_t& router, const std::string& secret_z85) {
  router.set(zmq::sockopt::curve_server, 1);
  router.set(zmq::sockopt::curve_secretkey, secret_z85);
  router.set(zmq::sockopt::zap_domain, kDomain);
}

void present_curve_key(zmq::socket_t& dealer, const std::string& public_z85, const std::string& secret_z85) {
  dealer.set(zmq::sockopt::curve_serverkey, public_z85);  // one pair for the cluster: the server's too
  dealer.set(zmq::sockopt::curve_publickey, public_z85);
  dealer.set(zmq::sockopt::curve_secretkey, secret_z85);
}

void present_credentials(zmq::socket_t& dealer, const std::string& role, const std::string& cookie) {
  dealer.set(zmq::sockopt::plain_username, role);
  // PLAIN needs a password; with none known the peer refuses it as a missing cookie.
  dealer.set(zmq::sockopt::plain_password, cookie.empty() ? std::string("-") : cookie.substr(0, 255));
}

HandshakeWatch::HandshakeWatch(zmq::context_t& ctx, zmq::socket_t& watched, std::string peer_addr, bool must_listen,
                               bool spliced)
    : watched_(&watched),
      peer_addr_(std::move(peer_addr)),
      tcp_(peer_addr_.rfind("tcp://", 0) == 0),
      relayed_(spliced || relayed_port(peer_addr_) != 0),
      must_listen_(must_listen) {
  static std::atomic<uint64_t> serial{0};
  const std::string endpoint =
      "inproc://xmesh-handshake-" + std::to_string(getpid()) + "-" + std::to_string(++serial);
  // A CURVE server that cannot open a client's HELLO (another cluster's key) just closes the
  // connection: on TCP a disconnect before the handshake succeeded is a refusal too.
  const int events = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                     ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                     (tcp_ && !relayed_ ? ZMQ_EVENT_DISCONNECTED : 0) | (must_listen_ ? ZMQ_EVENT_CONNECT_RETRIED : 0) |
                     (tcp_ ? ZMQ_EVENT_CONNECTED : 0);
  if (zmq_socket_monitor(watched.handle(), endpoint.c_str(), events) != 0)
    throw zmq::error_t();
  events_ = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::pair);
  events_->set(zmq::sockopt::linger, 0);
  events_->connect(endpoint);
}

HandshakeWatch::~HandshakeWatch() { stop(); }

void HandshakeWatch::stop() {
  if (!events_) return;
  zmq_socket_monitor(watched_->handle(), nullptr, 0);
  events_.reset();
}

HandshakeWatch::State HandshakeWatch::poll(std::string* why) {
  while (events_ && state_ == State::Pending) {
    std::vector<zmq::message_t> event;
    if (!zmq::recv_multipart(*events_, std::back_inserter(event), zmq::recv_flags::dontwait)) break;
    if (event.empty() || event[0].size() < 6) continue;
    uint16_t id;
    uint32_t value;
    std::memcpy(&id, event[0].data(), sizeof id);
    std::memcpy(&value, static_cast<const char*>(event[0].data()) + 2, sizeof value);
    if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      state_ = State::Succeeded;
    } else if (id == ZMQ_EVENT_CONNECTED) {
      ++connects_;
    } else if (id == ZMQ_EVENT_CONNECT_RETRIED) {
      // A connection that could not be made (refused, no route) is retried at once; one that is
      // silently dropped waits for TCP's own timeout instead, and is the caller's to wait out.
      if (++failed_connects_ >= kFailedConnectsRefused) {
        state_ = State::Refused;
        *why = "nothing accepts connections at " + peer_addr_ + " (" + std::to_string(failed_connects_) +
               " attempts refused or unroutable): is the host agent running there (xmesh-hostd --listen " +
               peer_addr_ + ")?";
      }
    } else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      state_ = State::Refused;
      *why = "the node at " + peer_addr_ + " refused this node's credentials (" +
             (peer_addr_.rfind("tcp://", 0) == 0 ? "not this cluster's key file" : "wrong or missing cookie") +
             ", status " + std::to_string(value) + "): connection refused";
    } else if (relayed_ && id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
      // Through a relay a connection also ends before its handshake when the proc is not there
      // (yet): not a refusal. A wrong key is refused by the host agent first, which is direct.
    } else if (id == ZMQ_EVENT_DISCONNECTED || id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
      state_ = State::Refused;
      *why = "the node at " + peer_addr_ + " closed the connection during the handshake: the two sides do not "
             "hold the same key file (or one holds none): connection refused";
    } else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
      state_ = State::Refused;
      *why = value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
                 ? "the node at " + peer_addr_ +
                       (peer_addr_.rfind("tcp://", 0) == 0
                            ? " authenticates otherwise (one side has a key file and the other not, or it is not "
                              "an xmesh node): connection refused"
                            : " does not authenticate connections (an xmesh older than this one, or not an xmesh "
                              "node): connection refused")
                 : "the handshake with " + peer_addr_ + " failed (ZMTP protocol error " + std::to_string(value) +
                       "): connection refused";
    }
  }
  if (state_ == State::Refused || (state_ == State::Succeeded && !tcp_)) stop();
  return state_;
}

std::string HandshakeWatch::describe() const {
  if (state_ == State::Succeeded) return "its handshake succeeded";
  if (state_ == State::Refused) return "it was refused";
  if (!tcp_) return "its handshake has not finished";
  if (connects_ == 0)
    return "no TCP connection to it was made yet" +
           (failed_connects_ ? " (" + std::to_string(failed_connects_) + " attempts failed)" : std::string());
  return "a TCP connection to it was made" + (connects_ > 1 ? " " + std::to_string(connects_) + " times" : std::string()) +
         " but the handshake did not finish (" +
         (relayed_ ? "its host agent's relay" : "whatever accepted the connection") + " has not answered)";
}

bool HandshakeWatch::reconnected() {
  bool again = false;
  while (events_) {
    std::vector<zmq::message_t> event;
    if (!zmq::recv_multipart(*events_, std::back_inserter(event), zmq::recv_flags::dontwait)) break;
    uint16_t id = 0;
    if (!event.empty() && event[0].size() >= 2) std::memcpy(&id, event[0].data(), sizeof id);
    if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) again = true;
  }
  return again;
}

}  // namespace xmesh
