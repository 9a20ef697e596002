// The transport's making and closing (transport.hpp): its identity, its routers and their
// listening addresses, the peer tables' plain questions, its counters. Sending is in
// transport_send.cpp, receiving in transport_receive.cpp, the link upgrades in
// transport_links.cpp (rings: transport_rings.cpp; lanes: transport_lanes.cpp).
#include "transport.hpp"

#include <sys/stat.h>
#include <chrono>
#include <cstring>
#include <thread>
#include <unistd.h>

#include <zmq_addon.hpp>

#include "bodies.hpp"
#include "link_bodies.hpp"
#include "relay_dialer.hpp"
#include "tcp_endpoint.hpp"
#include "transport_sockets.hpp"
#include "util.hpp"

namespace xmesh {
using namespace transport_sockets;

namespace {
constexpr size_t kIpcPathMax = 107;
constexpr size_t kHeaderRoom = kMaxHeaderBytes;  // what a header frame may take beyond the wire frame limit

std::string short_host() {
  std::string h = hostname();
  auto dot = h.find('.');
  return dot == std::string::npos ? h : h.substr(0, dot);
}
}  // namespace

Transport::Transport(std::string role, const std::string& bind_addr, const std::string& accept_cookie,
                     const std::string& key_file, const std::string& advertise)
    : ctx_(1), rings_(static_cast<size_t>(env_int("XMESH_MAX_MESSAGE_BYTES", int64_t(1) << 30))) {
  self_.role = std::move(role);
  self_.kind = parse_role(self_.role);  // throws std::invalid_argument naming an unknown role
  kinds_ = {make_ring_kind(), make_lane_kind()};
  std::string inc_hex = random_hex(8);
  self_.incarnation = std::stoull(inc_hex, nullptr, 16);
  if (self_.incarnation == 0) self_.incarnation = 1;
  // Controllers and procs talk to each other over shared memory on one host (ring_links.hpp);
  // host agents keep ZeroMQ alone. XMESH_RINGS=0 turns the rings off.
  if (takes_fast_links(self_.kind) && env_int("XMESH_RINGS", 1) != 0) {
    ring_bytes_ = static_cast<size_t>(env_int("XMESH_RING_BYTES", 256 << 10));
    rings_.enable();
  }
  self_.id = self_.role + "-" + short_host() + "-" + std::to_string(getpid()) + "-" + inc_hex.substr(0, 8);
  self_.max_message_bytes = static_cast<size_t>(env_int("XMESH_MAX_MESSAGE_BYTES", int64_t(1) << 30));
  send_timeout_ms_ = env_int("XMESH_SEND_TIMEOUT_MS", 30000);
  resend_buffer_bytes_ = static_cast<size_t>(std::max<int64_t>(1, env_int("XMESH_RESEND_BUFFER_BYTES", int64_t(1) << 30)));
  ack_every_ = static_cast<uint64_t>(std::max<int64_t>(1, env_int("XMESH_ACK_EVERY", 128)));
  max_pending_peers_ = static_cast<size_t>(std::max<int64_t>(1, env_int("XMESH_MAX_PENDING_PEERS", 10000)));
  raise_fd_limit();
  if (!accept_cookie.empty()) cookies_.accept(accept_cookie);
  if (!key_file.empty()) {
    keys_ = std::make_shared<const CurveKeys>(read_key_file(key_file));  // KeyFileError naming what is wrong
    key_file_ = key_file;
  }
  // Before the ROUTER exists, so that no connection is ever accepted unjudged.
  gatekeeper_ = std::make_unique<Gatekeeper>(
      ctx_, self_.role,
      [this](const std::string& cookie) { return cookies_.accepts(cookie); },
      keys_ ? keys_->public_z85 : std::string());
  try {
    if (bind_addr.rfind("ipc://", 0) == 0) {
      std::string path = bind_addr.substr(6);
      if (path.size() > kIpcPathMax)
        throw std::runtime_error("socket path " + path + " is " + std::to_string(path.size()) +
                                 " bytes; unix socket paths must fit in " + std::to_string(kIpcPathMax) +
                                 " bytes (use a shorter XMESH_RUNTIME_DIR)");
      unlink(path.c_str());
    }
    router_ = make_router(bind_addr, &self_.addr);
    if (self_.addr.rfind("ipc://", 0) == 0 && advertise.rfind("tcp://", 0) == 0) {
      // Known by its TCP address (a listen_tcp to follow), reached on its host at the socket.
      self_.unix_addr = self_.addr;
      self_.addr = advertise;
    } else {
      std::string bound = self_.addr;
      if (!advertise.empty()) self_.addr = advertise;
      if (self_.addr.rfind("tcp://", 0) == 0) {
        tcp_addr_ = self_.addr;
        tcp_bound_ = bound;
      }
    }
  } catch (...) {
    ctx_.shutdown();
    gatekeeper_->join();
    throw;
  }
  lanes_write_ = env_int("XMESH_LANES", 1) != 0;
  // A proc whose controller cannot be connected to: its agent says so, and with what token.
  if (const std::string back = env_str("XMESH_CONTROLLER_BACK", ""); !back.empty() && self_.kind == Role::proc)
    learn_back(env_str("XMESH_CONTROLLER_ADDR", ""), back);
  if (!tcp_addr_.empty()) listen_for_lanes(tcp_bound_, tcp_addr_);
}

Transport::~Transport() { close(); }

std::unique_ptr<zmq::socket_t> Transport::make_router(const std::string& bind_addr, std::string* endpoint) {
  const bool tcp = bind_addr.rfind("tcp://", 0) == 0;
  auto keys = this->keys();
  if (tcp && !keys && !loopback_tcp(bind_addr))
    throw std::runtime_error("refusing to listen on " + bind_addr + " without a key file: anyone who can reach it "
                             "could make this process run code (write one with `xmesh keygen FILE`)");
  auto router = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::router);
  set_common_options(*router);
  if (tcp) set_tcp_link_options(*router, /*router=*/true);
  if (tcp && ipv6_literal(bind_addr)) router->set(zmq::sockopt::ipv6, 1);
  if (tcp && keys)
    require_curve_handshake(*router, keys->secret_z85);
  else
    require_handshake(*router);
  // A connection that has not finished its handshake by then is closed: held connections
  // cannot pile up (each is an fd) faster than they go.
  router->set(zmq::sockopt::handshake_ivl, static_cast<int>(env_int("XMESH_HANDSHAKE_MS", 5000)));
  router->set(zmq::sockopt::router_mandatory, 1);
  router->set(zmq::sockopt::rcvhwm, 100000);
  router->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kWireFrameBytes + kHeaderRoom));
  // Files this node creates (its ipc socket) are for this user only.
  mode_t old = umask(077);
  try {
    router->bind(bind_addr);
  } catch (const zmq::error_t& e) {
    umask(old);
    throw std::runtime_error("cannot listen on " + bind_addr + ": " + e.what());
  }
  umask(old);
  *endpoint = router->get(zmq::sockopt::last_endpoint);
  if (endpoint->rfind("ipc://", 0) == 0) chmod(endpoint->substr(6).c_str(), 0600);
  return router;
}

void Transport::use_key_file(const std::string& key_file) {
  auto current = keys();
  CurveKeys read = read_key_file(key_file);  // KeyFileError naming what is wrong
  if (current) {
    if (current->public_z85 != read.public_z85)
      throw std::runtime_error("this process already uses another cluster key (" + key_file_ + "); one cluster key "
                               "per process");
    return;
  }
  gatekeeper_->set_cluster_key(read.public_z85);
  std::atomic_store(&keys_, std::make_shared<const CurveKeys>(std::move(read)));
  std::lock_guard<std::mutex> g(mu_);
  key_file_ = key_file;
}

std::string Transport::listen_tcp(const std::string& bind_addr, const std::string& key_file,
                                  const std::string& advertise) {
  if (bind_addr.rfind("tcp://", 0) != 0) throw std::runtime_error("not a tcp:// address: " + bind_addr);
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!tcp_addr_.empty()) throw std::runtime_error("this node already listens on TCP at " + tcp_addr_);
  }
  if (!key_file.empty()) use_key_file(key_file);
  std::string endpoint;
  tcp_router_ = make_router(bind_addr, &endpoint);
  {
    std::lock_guard<std::mutex> g(mu_);
    tcp_addr_ = advertise.empty() ? endpoint : advertise;
    tcp_bound_ = endpoint;
  }
  tcp_ready_.store(tcp_router_.get(), std::memory_order_release);
  routers_stale_.store(true, std::memory_order_release);  // its ZMQ_EVENTS read before the I/O thread sleeps
  listen_for_lanes(endpoint, tcp_addr());
  return tcp_addr();
}

std::string Transport::cluster_cookie() const {
  auto k = keys();
  return k ? xmesh::cluster_cookie(*k) : "";
}

std::string Transport::tcp_addr() const {
  std::lock_guard<std::mutex> g(mu_);
  return tcp_addr_;
}

std::string Transport::tcp_bound_addr() const {
  std::lock_guard<std::mutex> g(mu_);
  return tcp_bound_;
}

std::string Transport::own_addr_for(const std::string& dest_addr) const {
  if (dest_addr.rfind("tcp://", 0) != 0) return self_.unix_addr.empty() ? self_.addr : self_.unix_addr;
  std::lock_guard<std::mutex> g(mu_);
  return tcp_addr_.empty() ? self_.addr : tcp_addr_;
}

void Transport::close() {
  if (closed_.exchange(true)) return;
  {
    std::unique_lock<std::mutex> g(back_mu_);
    auto dialer = std::move(back_dialer_);
    auto pool = std::move(back_pool_);
    has_back_pool_.store(false);
    reach_back_.store(false);
    g.unlock();  // their threads stop outside the lock (the dialer's adopter takes lanes_mu_)
  }
  std::vector<std::shared_ptr<OutPeer>> peers;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& kv : out_) peers.push_back(kv.second);
    out_.clear();
  }
  for (auto& p : peers) stop_waiting_senders(*p);
  for (auto& p : peers) {
    std::lock_guard<std::mutex> g(p->mu);
    close_peer_locked(*p);
  }
  rings_.close_all();
  {
    std::lock_guard<std::mutex> g(lanes_mu_);
    lanes_in_.clear();
    lane_listener_.reset();
    lanes_on_.store(false);
  }
  tcp_ready_.store(nullptr);
  tcp_router_.reset();
  router_.reset();
  {
    std::lock_guard<std::mutex> g(dialer_mu_);
    dialer_.reset();
  }
  if (self_.addr.rfind("ipc://", 0) == 0) unlink(self_.addr.substr(6).c_str());
  ctx_.shutdown();  // the gatekeeper's blocking receive ends
  gatekeeper_->join();
  ctx_.close();
}

void Transport::expect_listening(const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  expected_listening_.insert(addr);
}

std::vector<RefuseBody> Transport::tidy() {
  bool verdicts_due = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!gone_addrs_.empty()) forget_gone_peers();
    verdicts_due = !handshaking_.empty() || !refusals_.empty();
  }
  auto refused = verdicts_due ? handshake_verdicts() : std::vector<RefuseBody>{};
  send_due_acks();
  tend_reroutes();
  tend_tcp_links();
  say_due_link_notes();
  return refused;
}

const std::string& Transport::route(const std::string& addr, std::string& storage) const {
  if (!has_aliases_.load(std::memory_order_relaxed) || addr.rfind("ipc://", 0) != 0) return addr;
  std::lock_guard<std::mutex> g(mu_);
  auto it = aliases_.find(addr);
  if (it == aliases_.end()) return addr;
  storage = it->second;
  return storage;
}

std::string Transport::unix_alias(const std::string& tcp_addr) const {
  if (!has_aliases_.load(std::memory_order_relaxed)) return "";
  std::lock_guard<std::mutex> g(mu_);
  auto it = unix_of_.find(tcp_addr);
  return it == unix_of_.end() ? "" : it->second;
}

Transport::PeerInfo Transport::peer(const std::string& identity) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = in_.find(identity);
  if (it == in_.end()) return {};
  return {it->second.addr, it->second.pid};
}

NodeStats Transport::stats() const {
  NodeStats s;
  s.sent = counts_.sent;
  s.received = counts_.received + rings_.received();
  s.rejected = counts_.rejected + gatekeeper_->refused();
  s.malformed = counts_.malformed;
  s.gaps = counts_.gaps;
  s.duplicates = counts_.duplicates;
  s.evicted = counts_.evicted;
  s.too_large = counts_.too_large;
  s.resent = counts_.resent;
  s.reconnects = counts_.reconnects;
  std::vector<std::shared_ptr<OutPeer>> peers;
  {
    std::lock_guard<std::mutex> g(mu_);
    s.peers = in_.size();
    for (auto& kv : out_) peers.push_back(kv.second);
  }
  for (auto& p : peers) {  // without the peer's mutex: a send may hold it, waiting for room
    s.unacked += p->unacked_count.load(std::memory_order_relaxed);
    s.rings_out += p->links[kRing].up();
    s.lanes_out += p->links[kLane].up();
  }
  s.ring_sent = counts_.link_sent[kRing];
  s.ring_received = rings_.received();
  s.rings_in = rings_.reading();
  s.lane_sent = counts_.link_sent[kLane];
  s.lane_received = counts_.lane_received;
  s.lane_breaks = counts_.link_breaks[kLane];
  {
    std::lock_guard<std::mutex> g(lanes_mu_);
    for (auto& kv : lanes_in_) s.lanes_in += kv.second.in && kv.second.switched;
  }
  return s;
}


}  // namespace xmesh
