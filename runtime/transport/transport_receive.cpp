// The transport's receiving side (transport.hpp), the I/O thread's: what the routers (and the
// lanes, transport_lanes.cpp) bring, admitted only after Hello (its version and credentials
// checked, a refusal sent back naming why), numbered messages taken in order once, split frames
// joined, acknowledgements sent, peers that are gone forgotten.
#include <unistd.h>

#include <zmq_addon.hpp>

#include "bodies.hpp"
#include "link_bodies.hpp"
#include "transport.hpp"
#include "transport_sockets.hpp"
#include "util.hpp"

namespace xmesh {
using namespace transport_sockets;

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
    h.sender = self_.id;
    h.incarnation = self_.incarnation;
    h.body = RefuseBody{reason, self_.addr, connection};
    auto bytes = encode_header(h);
    zmq::message_t m(bytes.data(), bytes.size());
    (void)s.send(m, zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
  } catch (const std::exception&) {
  }
}

// The routers' wait, set when it changes (the I/O thread's alone).
void Transport::use_receive_timeout(int ms) {
  if (ms == receive_timeout_ms_) return;
  receive_timeout_ms_ = ms;
  routers_stale_.store(true, std::memory_order_release);
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
  routers_stale_.store(true, std::memory_order_release);  // reading ZMQ_EVENTS takes their commands
  try {
    return readable(router_.get()) || readable(tcp_ready_.load(std::memory_order_acquire));
  } catch (const zmq::error_t&) {
    return false;
  }
}

std::optional<Transport::Received> Transport::receive(int timeout_ms) {
  use_receive_timeout(timeout_ms);
  if (link_steps_deferred_.load(std::memory_order_relaxed)) retry_deferred_link_steps();
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
    if (++counts_.malformed <= 5) log_diag(self_.role, "dropped a malformed message: " + error);
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
  if (got.payload_bytes() > self_.max_message_bytes) {  // answered by the node, naming both limits
    received->too_large = true;
    ++counts_.too_large;
    received->payload_bytes = got.payload_bytes();
    received->sender_limit = in_peer(identity).max_message_bytes;
    got.frames.clear();
    return received;
  }
  if (!join_pieces(got)) {
    if (++counts_.malformed <= 5) log_diag(self_.role, "dropped a message whose frame pieces do not match its header");
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
        log_diag(self_.role, std::string("dropped a '") + kind_name(m.header.kind) +
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

void Transport::send_ack(const std::string& identity, InPeer& in) {
  if (!in.router) return;
  Header h;
  h.kind = Kind::Ack;
  h.sender = self_.id;
  h.incarnation = self_.incarnation;
  h.seq = in.seq.last();
  auto bytes = encode_header(h);
  try {
    zmq::message_t to(identity.data(), identity.size()), ack(bytes.data(), bytes.size());
    routers_stale_.store(true, std::memory_order_release);  // a send takes the router's commands too
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

void Transport::forget_gone_peers() {
  std::set<std::string> gone(gone_addrs_.begin(), gone_addrs_.end());
  gone_addrs_.clear();
  for (auto& a : gone) {  // what its Hellos taught goes with it: a later process there teaches again
    cookies_.forget_learned(a);
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
             std::to_string(hello.proto) + "); this " + self_.role + " runs xmesh " + version_string() + " (protocol " +
             std::to_string(protocol_version()) + "): connection refused";
  } else if (by_key) {
    if (!cookies_.accepts(hello.cookie))
      reason = "the " + peer + " holds this cluster's key but presented a wrong or missing cookie (another "
               "job's controller?): connection refused";
  }
  if (!reason.empty()) {
    in.refused = true;
    ++counts_.rejected;
    log_diag_limited(refusal_log_, self_.role, reason);
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
    bool predecessor = hello.acks && hello.peer_incarnation != 0 && hello.peer_incarnation != self_.incarnation;
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
  // A controller this node cannot connect to: reached through the connections it opens.
  if (!hello.back.empty() && is_tcp(hello.addr)) {
    learn_back(hello.addr, hello.back);
    reroute_to_back(hello.addr);
  }
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
    cookies_.forget_learned(addr);  // one Cookies::present() gave stays
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
  cookies_.learn(addr, reply_cookie);
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

void Transport::count_malformed(const std::string& what) {
  ++counts_.malformed;
  log_diag(self_.role, what);
}

}  // namespace xmesh
