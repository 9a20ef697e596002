#include "transport.hpp"

#include <sys/stat.h>
#include <chrono>
#include <cstring>
#include <thread>
#include <unistd.h>

#include <zmq_addon.hpp>

#include "bodies.hpp"
#include "relay_dialer.hpp"
#include "tcp_endpoint.hpp"
#include "util.hpp"

namespace xmesh {

namespace {
constexpr size_t kIpcPathMax = 107;
constexpr size_t kHeaderRoom = kMaxHeaderBytes;  // what a header frame may take beyond the wire frame limit
constexpr size_t kFdSpare = 32;          // kept free for libzmq, pipes and files whatever happens

// A piece of a large frame, sharing its memory: the last piece libzmq is done with frees it.
zmq::message_t piece_of(const std::shared_ptr<zmq::message_t>& whole, size_t offset, size_t n) {
  auto* hold = new std::shared_ptr<zmq::message_t>(whole);
  char* data = static_cast<char*>(whole->data()) + offset;
  return zmq::message_t(
      data, n, [](void*, void* hint) { delete static_cast<std::shared_ptr<zmq::message_t>*>(hint); }, hold);
}

std::string short_host() {
  std::string h = hostname();
  auto dot = h.find('.');
  return dot == std::string::npos ? h : h.substr(0, dot);
}

void set_common_options(zmq::socket_t& s) {
  s.set(zmq::sockopt::linger, static_cast<int>(env_int("XMESH_LINGER_MS", 1000)));
}

// A TCP connection whose peer stops answering ZMTP heartbeats is closed and made again (the
// DEALER's side), so that a link that comes back is used at once rather than after TCP's
// retransmission back-off; what it lost is sent again (transport.hpp). A ROUTER lets the new
// connection take over the routing id of the old one it may not have noticed dead yet.
void set_tcp_link_options(zmq::socket_t& s, bool router) {
  s.set(zmq::sockopt::heartbeat_ivl, static_cast<int>(env_int("XMESH_LINK_HEARTBEAT_MS", 1000)));
  s.set(zmq::sockopt::heartbeat_timeout, static_cast<int>(env_int("XMESH_LINK_TIMEOUT_MS", 3000)));
  if (router) s.set(zmq::sockopt::router_handover, 1);
}

bool is_tcp(const std::string& addr) { return addr.rfind("tcp://", 0) == 0; }

// A proc behind its host agent's one port (tcp_endpoint.hpp).
bool is_relayed(const std::string& addr) { return relayed_port(addr) != 0; }
}  // namespace

Transport::Transport(std::string role, const std::string& bind_addr, const std::string& accept_cookie,
                     const std::string& key_file, const std::string& advertise)
    : role_(std::move(role)), role_kind_(parse_role(role_)), ctx_(1), rings_(static_cast<size_t>(env_int("XMESH_MAX_MESSAGE_BYTES", int64_t(1) << 30))) {
  std::string inc_hex = random_hex(8);
  incarnation_ = std::stoull(inc_hex, nullptr, 16);
  if (incarnation_ == 0) incarnation_ = 1;
  id_ = role_ + "-" + short_host() + "-" + std::to_string(getpid()) + "-" + inc_hex.substr(0, 8);
  max_message_bytes_ = static_cast<size_t>(env_int("XMESH_MAX_MESSAGE_BYTES", int64_t(1) << 30));
  send_timeout_ms_ = env_int("XMESH_SEND_TIMEOUT_MS", 30000);
  resend_buffer_bytes_ = static_cast<size_t>(std::max<int64_t>(1, env_int("XMESH_RESEND_BUFFER_BYTES", int64_t(1) << 30)));
  ack_every_ = static_cast<uint64_t>(std::max<int64_t>(1, env_int("XMESH_ACK_EVERY", 128)));
  max_pending_peers_ = static_cast<size_t>(std::max<int64_t>(1, env_int("XMESH_MAX_PENDING_PEERS", 10000)));
  raise_fd_limit();
  if (!accept_cookie.empty()) accepted_cookies_.insert(accept_cookie);
  if (!key_file.empty()) {
    keys_ = std::make_shared<const CurveKeys>(read_key_file(key_file));  // KeyFileError naming what is wrong
    key_file_ = key_file;
  }
  // Before the ROUTER exists, so that no connection is ever accepted unjudged.
  gatekeeper_ = std::make_unique<Gatekeeper>(
      ctx_, role_,
      [this](const std::string& cookie) {
        std::lock_guard<std::mutex> g(mu_);
        return accepted_cookies_.count(cookie) > 0;
      },
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
    router_ = make_router(bind_addr, &addr_);
    if (addr_.rfind("ipc://", 0) == 0 && advertise.rfind("tcp://", 0) == 0) {
      // Known by its TCP address (a listen_tcp to follow), reached on its host at the socket.
      unix_addr_ = addr_;
      addr_ = advertise;
    } else {
      std::string bound = addr_;
      if (!advertise.empty()) addr_ = advertise;
      if (addr_.rfind("tcp://", 0) == 0) {
        tcp_addr_ = addr_;
        tcp_bound_ = bound;
      }
    }
  } catch (...) {
    ctx_.shutdown();
    gatekeeper_->join();
    throw;
  }
  lanes_write_ = env_int("XMESH_LANES", 1) != 0;
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
  if (dest_addr.rfind("tcp://", 0) != 0) return unix_addr_.empty() ? addr_ : unix_addr_;
  std::lock_guard<std::mutex> g(mu_);
  return tcp_addr_.empty() ? addr_ : tcp_addr_;
}

void Transport::close() {
  if (closed_.exchange(true)) return;
  std::vector<std::shared_ptr<OutPeer>> peers;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& kv : out_) peers.push_back(kv.second);
    out_.clear();
  }
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
  if (addr_.rfind("ipc://", 0) == 0) unlink(addr_.substr(6).c_str());
  ctx_.shutdown();  // the gatekeeper's blocking receive ends
  gatekeeper_->join();
  ctx_.close();
}

std::string Transport::connection_id() { return id_ + "." + std::to_string(++connections_); }

void Transport::close_peer_locked(OutPeer& p) {
  p.watch.reset();  // it watches sock: gone first
  p.sock.reset();
  if (p.lane) p.lane->close();
  p.lane_up.store(false);
  if (p.ring) p.ring->close();  // a writer waiting for room stops; the reader reads what came
}

void Transport::set_peer_cookie(const std::string& addr, const std::string& cookie) {
  std::lock_guard<std::mutex> g(mu_);
  peer_cookies_[addr] = cookie;
}

void Transport::set_default_cookie(const std::string& cookie) {
  std::lock_guard<std::mutex> g(mu_);
  default_cookie_ = cookie;
}

void Transport::expect_listening(const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  expected_listening_.insert(addr);
}

void Transport::add_accepted_cookie(const std::string& cookie) {
  std::lock_guard<std::mutex> g(mu_);
  accepted_cookies_.insert(cookie);
}

std::shared_ptr<Transport::OutPeer> Transport::out_peer(const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = out_.find(addr);
  if (it != out_.end()) return it->second;
  if (closed_) throw SendError("this process's xmesh node has stopped");
  // A connection costs a few fds (its socket, libzmq's mailboxes): failing this send beats
  // libzmq aborting the process (a flood of connections may hold the rest for a while).
  if (auto shortage = fd_shortage(kFdSpare); !shortage.empty())
    throw SendError("cannot connect to " + addr + ": " + shortage + " (raise `ulimit -n`)");
  auto p = std::make_shared<OutPeer>();
  p->addr = addr;
  p->sock = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
  set_common_options(*p->sock);
  // A routing id of its own per connection: a ROUTER ignores a connection whose id is still in
  // use, which a reconnect (or a refusal sent beside the main connection) would race into.
  p->routing_id = connection_id();
  p->sock->set(zmq::sockopt::routing_id, p->routing_id);
  p->sock->set(zmq::sockopt::sndhwm, 100000);
  // Procs are connected to before they listen: retry quickly so the first message is not late.
  p->sock->set(zmq::sockopt::reconnect_ivl, 10);
  p->sock->set(zmq::sockopt::reconnect_ivl_max, 200);
  p->sock->set(zmq::sockopt::sndtimeo, static_cast<int>(send_timeout_ms_));
  if (is_tcp(addr)) {
    set_tcp_link_options(*p->sock, /*router=*/false);
    p->resends = true;
  }
  auto c = peer_cookies_.find(addr);
  p->cookie = c != peer_cookies_.end() ? c->second : default_cookie_;
  present_to(*p->sock, addr, p->cookie);
  try {
    p->watch = std::make_unique<HandshakeWatch>(ctx_, *p->sock, addr, expected_listening_.count(addr) > 0);
    dial(*p->sock, addr);
  } catch (const std::runtime_error& e) {  // a relayed address whose host does not resolve
    throw SendError("cannot connect to " + addr + ": " + e.what());
  } catch (const zmq::error_t& e) {
    throw SendError("cannot connect to " + addr + ": " + e.what());
  } catch (const std::invalid_argument& e) {
    throw SendError("cannot connect to " + addr + ": " + e.what());
  }
  out_[addr] = p;
  handshaking_.push_back(p);
  return p;
}

void Transport::disconnect(const std::string& addr) {
  std::shared_ptr<OutPeer> peer;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = out_.find(addr);
    if (it == out_.end()) return;
    peer = it->second;
    out_.erase(it);
  }
  // A sender waiting for room in its ring (holding the peer's lock) stops now, before the lock.
  if (auto ring = std::atomic_load(&peer->ring_closer)) ring->close_ring();
  // Nothing more goes to a dead peer: drop its queue and stop reconnecting to it.
  {
    std::lock_guard<std::mutex> g(peer->mu);
    if (peer->sock) {
      peer->sock->set(zmq::sockopt::linger, 0);
      close_peer_locked(*peer);
    }
  }
  rings_.drop(addr);
  {
    std::lock_guard<std::mutex> g(lanes_mu_);
    lanes_in_.erase(addr);
  }
  std::lock_guard<std::mutex> g(dialer_mu_);
  if (dialer_ && is_relayed(addr)) dialer_->forget(addr);
}

void Transport::send_hello_locked(OutPeer& p, zmq::send_flags flags) {
  Header h;
  h.kind = Kind::Hello;
  h.sender = id_;
  h.incarnation = incarnation_;
  h.seq = 0;  // outside the numbered stream: it says where the stream goes on
  HelloBody hello;
  {
    std::lock_guard<std::mutex> g(mu_);
    hello.reply_cookie = accepted_cookies_.empty() ? "" : *accepted_cookies_.begin();
  }
  hello.cookie = p.cookie;  // what a key-authenticated (TCP) link checks here, the handshake carrying none
  hello.proto = protocol_version();
  hello.version = version_string();
  hello.build = build_id();
  hello.addr = own_addr_for(p.addr);  // a TCP peer answers over TCP
  if (hello.addr != addr_)
    hello.also = addr_;
  else if (!unix_addr_.empty())
    hello.also = unix_addr_;  // where nodes of its host reach it (the peer learns the alias)
  hello.role = role_;
  hello.pid = getpid();
  hello.max_message_bytes = max_message_bytes_;
  hello.host = hostname();
  hello.acks = p.resends;
  hello.fresh = p.seq + 1;
  hello.resume = p.unacked.empty() ? hello.fresh : p.unacked.front().seq;
  hello.peer_incarnation = p.peer_incarnation;
  h.body = hello;
  auto bytes = encode_header(h);
  zmq::message_t m(bytes.data(), bytes.size());
  if (!p.sock->send(m, flags)) throw SendError("sending to " + p.addr + " would block or timed out (hello)");
}

void Transport::resume_locked(OutPeer& p, zmq::send_flags flags) {
  if (p.lane) lane_gone_locked(p, "its ZeroMQ link was made again");  // what it took is resent below
  send_hello_locked(p, flags);
  for (auto& u : p.unacked) {
    std::vector<zmq::message_t> again(u.frames.size());
    for (size_t i = 0; i < u.frames.size(); ++i) again[i].copy(u.frames[i]);
    send_frames_locked(p, u.header, again, flags, flags == zmq::send_flags::none);
    ++counts_.resent;
  }
  p.hello_due = false;
}

void Transport::send_frames_locked(OutPeer& p, const std::vector<uint8_t>& header, std::vector<zmq::message_t>& frames,
                                   zmq::send_flags flags, bool blocking) {
  try {
    zmq::message_t hm(header.data(), header.size());
    if (!p.sock->send(hm, frames.empty() ? flags : zmq::send_flags::sndmore | flags))
      throw SendError(blocking ? "sending to " + p.addr + " timed out after " + std::to_string(send_timeout_ms_) +
                                     " ms (peer not reading)"
                               : "sending to " + p.addr + " would block (the link is down or the peer not reading)",
                      false, !blocking);
    // The rest of a message whose first frame was taken is always taken.
    for (size_t i = 0; i < frames.size(); ++i) {
      auto f = i + 1 == frames.size() ? zmq::send_flags::none : zmq::send_flags::sndmore;
      if (!p.sock->send(frames[i], f)) throw SendError("sending to " + p.addr + " timed out (payload)", false, false, true);
    }
  } catch (const zmq::error_t& e) {
    throw SendError("sending to " + p.addr + " failed: " + e.what(), false, false, true);
  }
}

void Transport::read_acks_locked(OutPeer& p) {
  if (!p.resends || !p.sock) return;
  try {
    for (;;) {
      zmq::message_t m;
      if (!p.sock->recv(m, zmq::recv_flags::dontwait)) return;
      bool whole = !m.more();
      for (zmq::message_t rest; !whole && p.sock->recv(rest, zmq::recv_flags::dontwait);) whole = !rest.more();
      std::string error;
      auto h = decode_header(m.data(), m.size(), error);
      if (!h || h->kind != Kind::Ack) continue;  // only acknowledgements come back on a DEALER
      p.peer_incarnation = h->incarnation;
      while (!p.unacked.empty() && p.unacked.front().seq <= h->seq) {
        p.unacked_bytes -= p.unacked.front().bytes;
        p.unacked.pop_front();
        p.unacked_count.store(p.unacked.size(), std::memory_order_relaxed);
      }
    }
  } catch (const zmq::error_t&) {
  }
}

void Transport::notice_reconnect_locked(OutPeer& p) {
  if (p.handshaken && p.watch && p.sock && p.watch->reconnected()) {
    p.hello_due = true;
    ++counts_.reconnects;
  }
}

void Transport::make_room_locked(OutPeer& p, size_t bytes, bool blocking) {
  read_acks_locked(p);
  auto full = [&] { return !p.unacked.empty() && p.unacked_bytes + bytes > resend_buffer_bytes_; };
  if (!full()) return;
  const std::string why = "the link to " + p.addr + " holds " + std::to_string(p.unacked_bytes) +
                          " bytes its peer has not acknowledged (XMESH_RESEND_BUFFER_BYTES is " +
                          std::to_string(resend_buffer_bytes_) + "): the peer is not keeping up or the link is down";
  if (!blocking) throw SendError(why, false, true);
  const int64_t deadline = now_ms() + send_timeout_ms_;
  while (full()) {
    int64_t left = deadline - now_ms();
    if (left <= 0) throw SendError(why + " (waited " + std::to_string(send_timeout_ms_) + " ms)");
    notice_reconnect_locked(p);  // the I/O thread skips a peer busy here: its link is tended here
    if (p.hello_due) {
      try {
        resume_locked(p, zmq::send_flags::dontwait);
      } catch (const SendError&) {
      }
    }
    zmq::pollitem_t item{p.sock->handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(std::min<int64_t>(left, 50)));
    read_acks_locked(p);
  }
}

void Transport::send(const std::string& addr, Header& h, std::vector<zmq::message_t>& frames, bool blocking) {
  auto p = out_peer(addr);
  RingBreak broke;
  send_once(p, h, frames, blocking, &broke);
  if (broke.token == 0) return;
  // The ring broke under this message (nothing of it written): the node fails what was in flight
  // on it, then the message goes again, over ZeroMQ once the link is dropped.
  if (!ring_break_handler_ || !ring_break_handler_(broke, h))
    throw SendError("the shared-memory link to " + addr + " is closed (" + broke.why + ")");
  broke = RingBreak{};
  send_once(p, h, frames, blocking, &broke);
  if (broke.token != 0) throw SendError("the shared-memory link to " + addr + " broke again (" + broke.why + ")");
}

void Transport::send_once(const std::shared_ptr<OutPeer>& p, Header& h, std::vector<zmq::message_t>& frames,
                          bool blocking, RingBreak* broke) {
  std::lock_guard<std::mutex> g(p->mu);
  if (!p->sock) throw SendError("connection to " + p->addr + " is closed");
  h.sender = id_;
  h.incarnation = incarnation_;
  if (ring_send_locked(*p, h, frames, blocking, broke) || broke->token) return;
  if (lane_send_locked(*p, h, frames, blocking)) return;
  Kind kind = h.kind;
  send_zmq_locked(*p, h, frames, blocking);
  if (!p->ring_tried) offer_ring_locked(*p, kind, blocking);
  if (p->lane_state == OutPeer::Lane::none) ask_lane_locked(*p, kind, blocking);
}

void Transport::send_link_message_locked(OutPeer& p, Kind kind, json body, bool blocking) {
  Header h;
  h.kind = kind;
  h.sender = id_;
  h.incarnation = incarnation_;
  h.body = std::move(body);
  std::vector<zmq::message_t> none;
  send_zmq_locked(p, h, none, blocking);
}

std::string Transport::link_report(const std::string& addr) const {
  auto p = existing_out_peer(addr);
  if (!p) return "no link to it is open";
  // A diagnosis waits a moment for the link (the I/O thread holds it briefly), never for a
  // sender held back for long.
  std::unique_lock<std::mutex> g(p->mu, std::defer_lock);
  for (int i = 0; i < 200 && !g.try_lock(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!g.owns_lock()) return "a send to it has been under way for a while (waiting for room)";
  if (!p->sock) return "its link was closed";
  std::string report = p->watch ? p->watch->describe() : "its handshake succeeded";
  if (!p->unacked.empty())
    report += "; " + std::to_string(p->unacked.size()) + " message" + (p->unacked.size() == 1 ? "" : "s") +
              " sent to it not acknowledged";
  return report;
}

std::shared_ptr<Transport::OutPeer> Transport::existing_out_peer(const std::string& addr) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = out_.find(addr);
  return it == out_.end() ? nullptr : it->second;
}

void Transport::send_zmq_locked(OutPeer& p, Header& h, std::vector<zmq::message_t>& frames, bool blocking) {
  const auto wait = blocking ? zmq::send_flags::none : zmq::send_flags::dontwait;
  split_large_frames(h, frames);
  Unacked kept{};
  if (p.resends) {
    for (auto& f : frames) kept.bytes += f.size();
    make_room_locked(p, kept.bytes, blocking);
  }
  if (p.hello_due) resume_locked(p, wait);
  h.seq = p.seq + 1;
  auto header = header_for_wire(h);
  if (p.resends) {
    kept.seq = h.seq;
    kept.header = header;
    kept.bytes += header.size();
    kept.frames.resize(frames.size());
    for (size_t i = 0; i < frames.size(); ++i) kept.frames[i].copy(frames[i]);  // shares their memory
  }
  send_frames_locked(p, header, frames, wait, blocking);
  ++p.seq;  // taken only by a message that went out: a number skipped would read as a gap
  if (p.resends) {
    p.unacked_bytes += kept.bytes;
    p.unacked.push_back(std::move(kept));
    p.unacked_count.store(p.unacked.size(), std::memory_order_relaxed);
  }
  ++counts_.sent;
}

void Transport::split_large_frames(Header& h, std::vector<zmq::message_t>& frames) const {
  h.pieces.clear();
  bool large = false;
  for (auto& f : frames) large = large || f.size() > kWireFrameBytes;
  if (!large) return;
  std::vector<zmq::message_t> wire;
  for (auto& f : frames) {
    size_t n = std::max<size_t>(1, (f.size() + kWireFrameBytes - 1) / kWireFrameBytes);
    h.pieces.push_back(n);
    if (n == 1) {
      wire.push_back(std::move(f));
      continue;
    }
    auto whole = std::make_shared<zmq::message_t>(std::move(f));
    for (size_t off = 0; off < whole->size(); off += kWireFrameBytes)
      wire.push_back(piece_of(whole, off, std::min(kWireFrameBytes, whole->size() - off)));
  }
  frames.swap(wire);
}

// Joins the pieces of split frames back into one frame each; false when the pieces the header
// announces are not the frames that came.
bool Transport::join_pieces(Message& m) {
  const auto& pieces = m.header.pieces;
  if (pieces.empty()) return true;
  size_t wire = 0;
  for (uint64_t n : pieces) {
    if (n > m.frames.size() - wire) return false;
    wire += n;
  }
  if (wire != m.frames.size()) return false;
  std::vector<zmq::message_t> joined;
  size_t next = 0;
  for (uint64_t n : pieces) {
    if (n == 1) {
      joined.push_back(std::move(m.frames[next++]));
      continue;
    }
    size_t total = 0;
    for (size_t i = 0; i < n; ++i) total += m.frames[next + i].size();
    zmq::message_t whole(total);
    char* out = static_cast<char*>(whole.data());
    for (size_t i = 0; i < n; ++i, ++next) {
      std::memcpy(out, m.frames[next].data(), m.frames[next].size());
      out += m.frames[next].size();
    }
    joined.push_back(std::move(whole));
  }
  m.frames.swap(joined);
  m.header.pieces.clear();
  return true;
}

std::vector<uint8_t> Transport::header_for_wire(const Header& h) {
  auto bytes = encode_header(h);
  if (bytes.size() > kMaxHeaderBytes)
    throw SendError("a '" + std::string(kind_name(h.kind)) + "' message's header of " + std::to_string(bytes.size()) +
                        " bytes exceeds the " + std::to_string(kMaxHeaderBytes >> 20) +
                        " MiB header limit (what grows with the data belongs in its frames)",
                    /*too_large=*/true);
  return bytes;
}

void Transport::check_size(const std::vector<zmq::message_t>& frames) const {
  size_t n = 0;
  for (auto& f : frames) n += f.size();
  if (n > max_message_bytes_)
    throw SendError("message of " + std::to_string(n) + " bytes exceeds the maximum message size of " +
                        std::to_string(max_message_bytes_) + " bytes (XMESH_MAX_MESSAGE_BYTES)",
                    /*too_large=*/true);
}

// Only to a peer that passed the handshake (it holds a cookie this node accepts), with the
// cookie it said it accepts: a node never dials an address named by a stranger.
void Transport::send_refusal(const std::string& to_addr, const std::string& cookie, const std::string& reason,
                             const std::string& connection) {
  if (cookie.empty() || (to_addr.rfind("ipc://", 0) != 0 && to_addr.rfind("tcp://", 0) != 0)) return;
  if (!fd_shortage(kFdSpare).empty()) return;  // the refusal is logged; a socket now could abort
  try {
    zmq::socket_t s(ctx_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 500);
    s.set(zmq::sockopt::routing_id, connection_id());
    present_to(s, to_addr, cookie);
    dial(s, to_addr);
    Header h;
    h.kind = Kind::Refuse;
    h.sender = id_;
    h.incarnation = incarnation_;
    h.body = RefuseBody{reason, addr_, connection};
    auto bytes = encode_header(h);
    zmq::message_t m(bytes.data(), bytes.size());
    (void)s.send(m, zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
  } catch (const std::exception&) {
  }
}

void Transport::dial(zmq::socket_t& s, const std::string& addr) {
  if (!is_relayed(addr)) return s.connect(addr);
  RelayDialer* dialer;
  {
    std::lock_guard<std::mutex> g(dialer_mu_);
    if (!dialer_) dialer_ = std::make_unique<RelayDialer>();
    dialer = dialer_.get();
  }
  s.connect(dialer->local_endpoint(addr));
}

void Transport::present_to(zmq::socket_t& dealer, const std::string& addr, const std::string& cookie) {
  auto keys = this->keys();
  if (keys && addr.rfind("tcp://", 0) == 0)
    present_curve_key(dealer, keys->public_z85, keys->secret_z85);  // the cookie goes in Hello
  else
    present_credentials(dealer, role_, cookie);
}

void Transport::set_receive_timeout(int ms) {
  receive_timeout_ms_ = ms;
  router_->set(zmq::sockopt::rcvtimeo, ms);
}

zmq::socket_t* Transport::receive_parts(std::vector<zmq::message_t>& parts) {
  zmq::socket_t* tcp = tcp_ready_.load(std::memory_order_acquire);
  try {
    if (lanes_on_.load(std::memory_order_relaxed)) return receive_parts_with_lanes(parts);
    if (!tcp)  // one router: a blocking receive with a timeout costs fewer system calls than a poll
      return zmq::recv_multipart(*router_, std::back_inserter(parts)) ? router_.get() : nullptr;
    zmq::pollitem_t items[2] = {{router_->handle(), 0, ZMQ_POLLIN, 0}, {tcp->handle(), 0, ZMQ_POLLIN, 0}};
    if (zmq::poll(items, 2, std::chrono::milliseconds(receive_timeout_ms_)) <= 0) return nullptr;
    poll_tcp_first_ = !poll_tcp_first_;
    zmq::socket_t* order[2] = {router_.get(), tcp};
    if (poll_tcp_first_) std::swap(order[0], order[1]);
    for (zmq::socket_t* s : order)
      if (zmq::recv_multipart(*s, std::back_inserter(parts), zmq::recv_flags::dontwait)) return s;
    return nullptr;
  } catch (const zmq::error_t& e) {
    if (e.num() == ETERM) throw;
    parts.clear();
    return nullptr;  // EINTR and the like: go round again
  }
}

bool Transport::input_pending() {
  auto readable = [](zmq::socket_t* s) {
    return s != nullptr && (s->get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
  };
  if (!lane_ready_.empty()) return true;
  try {
    return readable(router_.get()) || readable(tcp_ready_.load(std::memory_order_acquire));
  } catch (const zmq::error_t&) {
    return false;
  }
}

std::optional<Transport::Received> Transport::receive() {
  if (auto r = take_lane_ready()) return r;  // what lanes brought, in the order it came
  std::vector<zmq::message_t> parts;
  zmq::socket_t* router = receive_parts(parts);
  if (!router) return take_lane_ready();
  if (parts.size() < 2) {
    ++counts_.malformed;
    return std::nullopt;
  }
  std::string error;
  auto h = decode_header(parts[1].data(), parts[1].size(), error);
  if (!h) {
    if (++counts_.malformed <= 5) log_diag(role_, "dropped a malformed message: " + error);
    return std::nullopt;
  }
  std::string identity = parts[0].to_string();
  // A Hello on a connection admitted by key (CURVE, a TCP link): its cookie is checked there.
  const char* user_id = h->kind == Kind::Hello ? zmq_msg_gets(parts[1].handle(), "User-Id") : nullptr;
  const bool by_key = user_id != nullptr && std::strcmp(user_id, kCurveUserId) == 0;
  Message m;
  m.header = std::move(*h);
  m.peer_identity = identity;
  m.frames.reserve(parts.size() - 2);
  for (size_t i = 2; i < parts.size(); ++i) m.frames.push_back(std::move(parts[i]));
  auto received = admit(identity, std::move(m), by_key, router);
  if (!received || received->refusal) return received;
  Message& got = received->msg;
  if (got.payload_bytes() > max_message_bytes_) {  // answered by the node, naming both limits
    received->too_large = true;
    ++counts_.too_large;
    received->payload_bytes = got.payload_bytes();
    received->sender_limit = in_peer(identity).max_message_bytes;
    got.frames.clear();
    return received;
  }
  if (!join_pieces(got)) {
    if (++counts_.malformed <= 5) log_diag(role_, "dropped a message whose frame pieces do not match its header");
    return std::nullopt;
  }
  return received;
}

// What a decoded message from identity becomes: its Hello handled, a refusal passed up,
// anything else from a stranger dropped; then its sequence number checked.
std::optional<Transport::Received> Transport::admit(const std::string& identity, Message m, bool by_key,
                                                    zmq::socket_t* router) {
  InPeer* in = &in_peer(identity);
  if (in->refused) return std::nullopt;
  in->router = router;
  if (m.header.kind == Kind::Hello) {
    // First on every connection; from an identity already known it is a new connection (its
    // peer lost the old one, say after this node stalled), whose numbers start again.
    handle_hello(identity, *in, m, by_key);
    return std::nullopt;
  }
  if (!in->authed) {
    if (m.header.kind == Kind::Refuse) {
      // Refuse keeps its number and body across versions, so a peer of any version is understood.
      RefuseBody refusal = read_as<RefuseBody>(m.header.body).value_or(RefuseBody{});
      if (refuses_a_closed_connection(refusal)) return std::nullopt;
      if (refusal.reason.empty()) refusal.reason = "connection refused";
      m.header.body = refusal;
      m.sender_addr = refusal.addr;
      return Received{std::move(m), std::move(refusal)};
    } else {
      if (++counts_.rejected <= 5)
        log_diag(role_, std::string("dropped a '") + kind_name(m.header.kind) +
                            "' message from a peer that has not authenticated");
    }
    return std::nullopt;
  }
  if (m.header.kind == Kind::Ack) {  // acknowledgements travel back on a DEALER's connection only
    count_malformed("dropped an acknowledgement sent as a message");
    return std::nullopt;
  }
  return accept_numbered(identity, *in, std::move(m));
}

std::optional<Transport::Received> Transport::accept_numbered(const std::string& identity, InPeer& peer, Message m) {
  InPeer* in = &peer;
  auto verdict = in->seq.accept(m.header.incarnation, m.header.seq, in->acks);
  if (verdict == SeqTracker::Duplicate) {  // sent again after a reconnect: acknowledge, so its sender drops it
    ++counts_.duplicates;
    if (in->acks) note_delivered(identity, *in, true);
    return std::nullopt;
  }
  if (verdict == SeqTracker::Early) return std::nullopt;  // those before it were lost: they come again first
  if (verdict == SeqTracker::Gap) ++counts_.gaps;
  if (in->acks) note_delivered(identity, *in, false);
  ++counts_.received;
  m.sender_addr = in->addr;  // the I/O thread alone writes in_ entries: no lock to read its own
  return Received{std::move(m), std::nullopt};
}

Transport::InPeer& Transport::in_peer(const std::string& identity) {
  std::lock_guard<std::mutex> g(mu_);
  if (!gone_addrs_.empty()) forget_gone_peers();
  auto it = in_.find(identity);
  if (it != in_.end()) return it->second;
  if (pending_peers_ >= max_pending_peers_) {
    // An identity flood (or a peer that never says Hello): drop the strangers, never a peer
    // that authenticated, whose Hello will not come again.
    for (auto e = in_.begin(); e != in_.end();) {
      if (e->second.authed) {
        ++e;
      } else {
        e = in_.erase(e);
        ++counts_.evicted;
      }
    }
    pending_peers_ = 0;
  }
  ++pending_peers_;
  return in_[identity];
}

void Transport::forget_peer(const std::string& addr) {
  if (addr.empty()) return;
  std::lock_guard<std::mutex> g(mu_);
  gone_addrs_.push_back(addr);
}

std::vector<RefuseBody> Transport::tidy() {
  bool verdicts_due = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!gone_addrs_.empty()) forget_gone_peers();
    verdicts_due = !handshaking_.empty();
  }
  auto refused = verdicts_due ? handshake_verdicts() : std::vector<RefuseBody>{};
  send_due_acks();
  tend_tcp_links();
  return refused;
}

// A TCP connection made again (the link came back, or another process listens at the address
// now) starts with Hello like a new one, then carries again what was not acknowledged: the
// receiver may not know this node (a restarted agent), and one that does takes in order only
// what it lacks. A peer busy in a send is left to its sender, which tends it the same way.
void Transport::tend_tcp_links() {
  std::vector<std::weak_ptr<OutPeer>> watching;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (reconnecting_.empty()) return;
    watching.swap(reconnecting_);
  }
  std::vector<std::weak_ptr<OutPeer>> kept;
  for (auto& w : watching) {
    auto p = w.lock();
    if (!p) continue;
    std::unique_lock<std::mutex> g(p->mu, std::try_to_lock);  // the I/O thread never waits for a sender
    if (!g.owns_lock()) {
      kept.push_back(w);
      continue;
    }
    if (!p->watch || !p->sock) continue;
    notice_reconnect_locked(*p);
    read_acks_locked(*p);
    tend_lane_locked(*p);
    if (p->hello_due) {
      try {
        resume_locked(*p, zmq::send_flags::dontwait);
      } catch (const SendError&) {  // it cannot take them now: the next tick, or the next send, tries again
      }
    }
    kept.push_back(w);
  }
  std::lock_guard<std::mutex> g(mu_);
  reconnecting_.insert(reconnecting_.end(), kept.begin(), kept.end());
}

void Transport::send_ack(const std::string& identity, InPeer& in) {
  if (!in.router) return;
  Header h;
  h.kind = Kind::Ack;
  h.sender = id_;
  h.incarnation = incarnation_;
  h.seq = in.seq.last();
  auto bytes = encode_header(h);
  try {
    zmq::message_t to(identity.data(), identity.size()), ack(bytes.data(), bytes.size());
    if (in.router->send(to, zmq::send_flags::sndmore | zmq::send_flags::dontwait) &&
        in.router->send(ack, zmq::send_flags::dontwait))
      in.acked = h.seq;
  } catch (const zmq::error_t&) {
    // Its connection is gone (or full): it sends again what this would have acknowledged.
  }
}

void Transport::note_delivered(const std::string& identity, InPeer& in, bool force) {
  if (in.seq.last() - in.acked >= ack_every_) {
    send_ack(identity, in);
  } else if (!in.ack_due && (force || in.seq.last() != in.acked)) {
    in.ack_due = true;
    ack_due_.push_back(identity);
  }
}

void Transport::send_due_acks() {
  std::vector<std::string> due;
  due.swap(ack_due_);
  for (auto& identity : due) {
    auto it = in_.find(identity);  // written by this (the I/O) thread alone
    if (it == in_.end()) continue;
    it->second.ack_due = false;
    send_ack(identity, it->second);
  }
}

// Polls the watches of out peers whose first handshake has not ended (a peer's mutex is never
// taken under mu_); a refusal also closes that connection, so libzmq stops retrying it.
std::vector<RefuseBody> Transport::handshake_verdicts() {
  std::vector<std::weak_ptr<OutPeer>> watching;
  {
    std::lock_guard<std::mutex> g(mu_);
    watching.swap(handshaking_);
  }
  std::vector<RefuseBody> refused;
  std::vector<std::weak_ptr<OutPeer>> pending, reconnects;
  for (auto& w : watching) {
    auto p = w.lock();
    if (!p) continue;
    std::lock_guard<std::mutex> g(p->mu);
    if (!p->watch) continue;
    std::string why;
    auto state = p->watch->poll(&why);
    if (state == HandshakeWatch::State::Pending) {
      pending.push_back(w);
    } else if (state == HandshakeWatch::State::Refused) {
      refused.push_back(RefuseBody{why, p->addr, ""});
      p->sock->set(zmq::sockopt::linger, 0);
      close_peer_locked(*p);
    } else if (p->addr.rfind("tcp://", 0) == 0) {
      p->handshaken = true;
      reconnects.push_back(w);  // still watched: its link may drop and come back
    } else {
      p->watch.reset();
    }
  }
  std::lock_guard<std::mutex> g(mu_);
  handshaking_.insert(handshaking_.end(), pending.begin(), pending.end());
  reconnecting_.insert(reconnecting_.end(), reconnects.begin(), reconnects.end());
  return refused;
}

void Transport::forget_gone_peers() {
  std::set<std::string> gone(gone_addrs_.begin(), gone_addrs_.end());
  gone_addrs_.clear();
  for (auto& a : gone) {  // what its Hellos taught goes with it: a later process there teaches again
    if (learned_cookies_.erase(a)) peer_cookies_.erase(a);
    addr_owners_.erase(a);
  }
  for (auto e = in_.begin(); e != in_.end();) {
    if (e->second.authed && gone.count(e->second.addr))
      e = in_.erase(e);
    else
      ++e;
  }
}

// A Hello of another protocol version, or with credentials this node does not accept, is
// refused (the peer is told why); else the identity is authenticated as the node at its addr.
void Transport::handle_hello(const std::string& identity, InPeer& in, const Message& m, bool by_key) {
  HelloBody hello;
  if (auto read = read_as<HelloBody>(m.header.body)) {
    hello = std::move(*read);
  } else {
    hello.proto = -1;  // refused below as a peer of another protocol, naming what it sent
    if (m.header.body.is_object()) {
      const json& b = m.header.body;
      auto str = [&](const char* k) { return b.contains(k) && b[k].is_string() ? b[k].get<std::string>() : ""; };
      hello.addr = str("addr");
      hello.role = str("role");
      hello.version = str("version");
      hello.reply_cookie = str("reply_cookie");
    }
  }
  std::string reason;
  const std::string peer = (hello.role.empty() ? std::string("peer") : hello.role) + " at " + hello.addr;
  if (hello.proto != protocol_version()) {
    reason = "the " + peer + " runs xmesh " + (hello.version.empty() ? "?" : hello.version) + " (protocol " +
             std::to_string(hello.proto) + "); this " + role_ + " runs xmesh " + version_string() + " (protocol " +
             std::to_string(protocol_version()) + "): connection refused";
  } else if (by_key) {
    std::lock_guard<std::mutex> g(mu_);
    if (!accepted_cookies_.count(hello.cookie))
      reason = "the " + peer + " holds this cluster's key but presented a wrong or missing cookie (another "
               "job's controller?): connection refused";
  }
  if (!reason.empty()) {
    in.refused = true;
    ++counts_.rejected;
    log_diag_limited(refusal_log_, role_, reason);
    send_refusal(hello.addr, hello.reply_cookie, reason, identity);
    return;
  }
  // The same sender on a connection made again goes on where this node is; a sender new here
  // starts where its Hello says, past what it had meant for a predecessor of this process.
  const bool goes_on = in.authed && in.node_id == m.header.sender && hello.acks;
  std::shared_ptr<OutPeer> predecessor_link;
  std::unique_lock<std::mutex> g(mu_);
  if (!in.authed && pending_peers_ > 0) --pending_peers_;
  in.authed = true;
  in.addr = hello.addr;
  in.node_id = m.header.sender;
  in.max_message_bytes = hello.max_message_bytes;
  in.pid = hello.pid;
  in.acks = hello.acks;
  if (!goes_on) {
    bool predecessor = hello.acks && hello.peer_incarnation != 0 && hello.peer_incarnation != incarnation_;
    uint64_t next = std::max<uint64_t>(1, predecessor ? hello.fresh : hello.resume);
    in.seq = SeqTracker{};
    in.seq.start(m.header.incarnation, next - 1);
    in.acked = next - 1;
  }
  if (!hello.addr.empty()) predecessor_link = note_owner_locked(hello.addr, m.header.sender, hello.reply_cookie);
  if (hello.also.rfind("ipc://", 0) == 0 && is_tcp(hello.addr)) {
    aliases_[hello.also] = hello.addr;
    unix_of_[hello.addr] = hello.also;
    has_aliases_ = true;
  }
  g.unlock();
  if (predecessor_link) {  // nothing it holds is for the new process; its reconnects would be refused
    std::lock_guard<std::mutex> pg(predecessor_link->mu);
    if (predecessor_link->sock) {
      predecessor_link->sock->set(zmq::sockopt::linger, 0);
      close_peer_locked(*predecessor_link);
    }
  }
}

std::shared_ptr<Transport::OutPeer> Transport::note_owner_locked(const std::string& addr, const std::string& sender,
                                                                 const std::string& reply_cookie) {
  std::shared_ptr<OutPeer> predecessor_link;
  auto owner = addr_owners_.find(addr);
  if (owner != addr_owners_.end() && owner->second != sender) {
    if (learned_cookies_.erase(addr)) peer_cookies_.erase(addr);  // one set_peer_cookie() gave stays
    auto o = out_.find(addr);
    if (o != out_.end()) {
      predecessor_link = o->second;
      out_.erase(o);
    }
    successors_.push_back(addr);
    has_successors_ = true;
    rings_.drop(addr);  // its predecessor's link
  }
  addr_owners_[addr] = sender;
  if (!reply_cookie.empty() && peer_cookies_.emplace(addr, reply_cookie).second) learned_cookies_.insert(addr);
  return predecessor_link;
}

// A refusal that names a connection this node no longer has (one to a predecessor at the
// refusing node's address, closed since) says nothing about the link of today.
bool Transport::refuses_a_closed_connection(const RefuseBody& refusal) {
  if (refusal.connection.empty()) return false;
  std::lock_guard<std::mutex> g(mu_);
  auto o = out_.find(refusal.addr);
  return o == out_.end() || o->second->routing_id != refusal.connection;
}

std::vector<std::string> Transport::take_successors() {
  if (!has_successors_.load(std::memory_order_relaxed)) return {};
  std::lock_guard<std::mutex> g(mu_);
  has_successors_ = false;
  return std::exchange(successors_, {});
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

std::string Transport::peer_addr(const std::string& identity) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = in_.find(identity);
  return it == in_.end() ? "" : it->second.addr;
}

int64_t Transport::peer_pid(const std::string& identity) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = in_.find(identity);
  return it == in_.end() ? 0 : it->second.pid;
}

void Transport::count_malformed(const std::string& what) {
  ++counts_.malformed;
  log_diag(role_, what);
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
    if (p->lane_up.load(std::memory_order_relaxed)) ++s.lanes_out;
    auto ring = std::atomic_load(&p->ring_closer);
    if (ring && ring->state() == RingWriter::State::active) ++s.rings_out;
  }
  s.ring_sent = counts_.ring_sent;
  s.ring_received = rings_.received();
  s.rings_in = rings_.reading();
  s.lane_sent = counts_.lane_sent;
  s.lane_received = counts_.lane_received;
  s.lane_breaks = counts_.lane_breaks;
  {
    std::lock_guard<std::mutex> g(lanes_mu_);
    for (auto& kv : lanes_in_) s.lanes_in += kv.second.in && kv.second.switched;
  }
  return s;
}

}  // namespace xmesh
