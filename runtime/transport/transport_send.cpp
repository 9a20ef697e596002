// The transport's sending side (transport.hpp): the out peers (one DEALER per destination, its
// handshake watched), Hello and what a connection made again sends again, the messages kept
// until acknowledged, frames split past the wire's limit, and the I/O thread's tending of TCP
// links. Which link a message takes is transport_links.cpp's.
#include <chrono>
#include <thread>
#include <unistd.h>

#include <zmq_addon.hpp>

#include "bodies.hpp"
#include "link_bodies.hpp"
#include "relay_dialer.hpp"
#include "transport.hpp"
#include "transport_sockets.hpp"
#include "util.hpp"

namespace xmesh {
using namespace transport_sockets;

namespace {
// A piece of a large frame, sharing its memory: the last piece libzmq is done with frees it.
zmq::message_t piece_of(const std::shared_ptr<zmq::message_t>& whole, size_t offset, size_t n) {
  auto* hold = new std::shared_ptr<zmq::message_t>(whole);
  char* data = static_cast<char*>(whole->data()) + offset;
  return zmq::message_t(
      data, n, [](void*, void* hint) { delete static_cast<std::shared_ptr<zmq::message_t>*>(hint); }, hold);
}
}  // namespace

std::string Transport::connection_id() { return self_.id + "." + std::to_string(++connections_); }

void Transport::close_peer_locked(OutPeer& p) {
  p.watch.reset();  // it watches sock: gone first
  p.sock.reset();
  for (auto& link : p.links) link.close();  // a ring: a writer waiting for room stops; the reader reads what came
}

std::shared_ptr<Transport::OutPeer> Transport::out_peer(const std::string& addr, bool* created) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = out_.find(addr);
  if (it != out_.end()) return it->second;
  if (closed_) throw SendError("this process's xmesh node has stopped");
  // A connection costs a few fds (its socket, libzmq's mailboxes): failing this send beats
  // libzmq aborting the process (a flood of connections may hold the rest for a while).
  if (auto shortage = fd_shortage(kFdSpare); !shortage.empty())
    throw SendError("cannot connect to " + addr + ": " + shortage + " (raise `ulimit -n`)");
  auto p = std::make_shared<OutPeer>(kinds_);
  p->addr = addr;
  open_socket_locked(*p, expected_listening_.count(addr) > 0);
  out_[addr] = p;
  handshaking_.push_back(p);
  if (created) *created = true;
  return p;
}

void Transport::open_socket_locked(OutPeer& p, bool listening_expected) {
  const std::string& addr = p.addr;
  p.sock = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
  set_common_options(*p.sock);
  // A routing id of its own per connection: a ROUTER ignores a connection whose id is still in
  // use, which a reconnect (or a refusal sent beside the main connection) would race into.
  p.routing_id = connection_id();
  p.sock->set(zmq::sockopt::routing_id, p.routing_id);
  p.sock->set(zmq::sockopt::sndhwm, 100000);
  // Procs are connected to before they listen: retry quickly so the first message is not late.
  p.sock->set(zmq::sockopt::reconnect_ivl, 10);
  p.sock->set(zmq::sockopt::reconnect_ivl_max, 200);
  p.sock->set(zmq::sockopt::sndtimeo, static_cast<int>(send_timeout_ms_));
  if (is_tcp(addr)) {
    set_tcp_link_options(*p.sock, /*router=*/false);
    p.sock->set(zmq::sockopt::ipv6, 1);
    p.resends = true;
  }
  p.cookie = cookies_.for_peer(addr);
  present_to(*p.sock, addr, p.cookie);
  p.via_back = has_back_pool_.load() && back_pool().knows(addr);
  const bool spliced = p.via_back || !gateway_for(addr).empty();
  try {
    p.watch = std::make_unique<HandshakeWatch>(ctx_, *p.sock, addr, listening_expected && !p.via_back, spliced);
    if (p.via_back)
      p.sock->connect(back_pool().local_endpoint(addr));
    else
      dial(*p.sock, addr);
  } catch (const std::runtime_error& e) {  // a relayed address whose host does not resolve
    throw SendError("cannot connect to " + addr + ": " + e.what());
  } catch (const zmq::error_t& e) {
    throw SendError("cannot connect to " + addr + ": " + e.what());
  } catch (const std::invalid_argument& e) {
    throw SendError("cannot connect to " + addr + ": " + e.what());
  }
}

void Transport::expect_gone(const std::string& addr) {
  if (auto p = existing_out_peer(addr)) p->going = true;
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
  // A sender waiting for room (holding the peer's lock) stops now, before the lock.
  stop_waiting_senders(*peer);
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
  {
    std::lock_guard<std::mutex> g(back_mu_);
    if (back_dialer_) back_dialer_->forget(addr);
    if (back_pool_) back_pool_->forget(addr);
  }
  std::lock_guard<std::mutex> g(dialer_mu_);
  if (dialer_ && is_relayed(addr)) dialer_->forget(addr);
}

void Transport::stop_waiting_senders(OutPeer& p) {
  p.dropped.store(true, std::memory_order_relaxed);  // make_room_locked's wait for acknowledgements
  for (auto& link : p.links)
    if (auto writer = link.writer_for_interrupt()) writer->interrupt();
}

void Transport::send_hello_locked(OutPeer& p, zmq::send_flags flags) {
  Header h;
  h.kind = Kind::Hello;
  h.sender = self_.id;
  h.incarnation = self_.incarnation;
  h.seq = 0;  // outside the numbered stream: it says where the stream goes on
  HelloBody hello;
  hello.reply_cookie = cookies_.reply_cookie();
  hello.cookie = p.cookie;  // what a key-authenticated (TCP) link checks here, the handshake carrying none
  hello.proto = protocol_version();
  hello.version = version_string();
  hello.build = build_id();
  hello.addr = own_addr_for(p.addr);  // a TCP peer answers over TCP
  if (hello.addr != self_.addr)
    hello.also = self_.addr;
  else if (!self_.unix_addr.empty())
    hello.also = self_.unix_addr;  // where nodes of its host reach it (the peer learns the alias)
  hello.role = self_.role;
  hello.pid = getpid();
  hello.max_message_bytes = self_.max_message_bytes;
  hello.host = hostname();
  hello.acks = p.resends;
  hello.fresh = p.seq + 1;
  hello.resume = p.unacked.empty() ? hello.fresh : p.unacked.front().seq;
  hello.peer_incarnation = p.peer_incarnation;
  if (reach_back_.load(std::memory_order_relaxed) && p.resends) {
    std::lock_guard<std::mutex> g(back_mu_);
    hello.back = to_hex(back_token_);
  }
  h.body = hello;
  auto bytes = encode_header(h);
  zmq::message_t m(bytes.data(), bytes.size());
  if (!send_first_frame_locked(p, m, flags))
    throw SendError("sending to " + p.addr + " would block or timed out (hello)");
}

bool Transport::send_first_frame_locked(OutPeer& p, zmq::message_t& m, zmq::send_flags flags) {
  const bool waits = (flags & zmq::send_flags::dontwait) == zmq::send_flags::none;
  if (!waits) return p.sock->send(m, flags).has_value();
  // A sender that waits does so in slices: it stops once its handshake is refused, or once the
  // link is closed or forgotten meanwhile (stop_waiting_senders).
  const int64_t deadline = now_ms() + send_timeout_ms_;
  for (;;) {
    if (p.sock->send(m, flags | zmq::send_flags::dontwait)) return true;
    if (p.watch && !p.handshaken) throw_if_refused_locked(p);
    if (p.dropped.load(std::memory_order_relaxed))
      throw SendError("the link to " + p.addr + " was closed while a send waited for it to take more");
    const int64_t left = deadline - now_ms();
    if (left <= 0) return false;
    zmq::pollitem_t item{p.sock->handle(), 0, ZMQ_POLLOUT, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(std::min<int64_t>(left, 20)));
  }
}

void Transport::throw_if_refused_locked(OutPeer& p) {
  std::string why;
  if (!p.watch || p.watch->poll(&why) != HandshakeWatch::State::Refused) return;
  {
    std::lock_guard<std::mutex> g(mu_);
    refusals_.push_back(RefuseBody{why, p.addr, ""});
  }
  p.sock->set(zmq::sockopt::linger, 0);
  close_peer_locked(p);
  throw SendError(why);
}

void Transport::resume_locked(OutPeer& p, zmq::send_flags flags) {
  for (size_t i = 0; i < kLinkKinds; ++i)  // what a numbered link took is resent below
    if (p.links[i].spec().numbered && p.links[i].writer()) link_gone_locked(p, i, "its ZeroMQ link was made again");
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
  MayWait waiting(p, blocking);  // at ZeroMQ's high-water mark
  try {
    zmq::message_t hm(header.data(), header.size());
    if (!send_first_frame_locked(p, hm, frames.empty() ? flags : zmq::send_flags::sndmore | flags))
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
  // Reading acknowledgements is a ZeroMQ receive (two system calls even when none came): a send
  // reads them once the kept messages reach what a receiver acknowledges at once (XMESH_ACK_EVERY)
  // or an eighth of the buffer, not on every send; the I/O thread reads them at every tick.
  if (p.unacked.size() >= ack_every_ || p.unacked_bytes + bytes > resend_buffer_bytes_ / 8) read_acks_locked(p);
  auto full = [&] { return !p.unacked.empty() && p.unacked_bytes + bytes > resend_buffer_bytes_; };
  if (!full()) return;
  const std::string why = "the link to " + p.addr + " holds " + std::to_string(p.unacked_bytes) +
                          " bytes its peer has not acknowledged (XMESH_RESEND_BUFFER_BYTES is " +
                          std::to_string(resend_buffer_bytes_) + "): the peer is not keeping up or the link is down";
  if (!blocking) throw SendError(why, false, true);
  MayWait waiting(p, true);
  const int64_t deadline = now_ms() + send_timeout_ms_;
  while (full()) {
    int64_t left = deadline - now_ms();
    if (left <= 0) throw SendError(why + " (waited " + std::to_string(send_timeout_ms_) + " ms)");
    if (p.dropped.load(std::memory_order_relaxed)) throw SendError(why + "; the link was closed meanwhile");
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
  bool created = false;
  auto p = out_peer(addr, &created);
  if (created && reach_back_.load(std::memory_order_relaxed)) {
    try {
      reach_back_to(addr);
    } catch (const std::exception& e) {
      throw SendError("cannot reach " + addr + " back: " + e.what());
    }
  }
  LinkBreak broke;
  send_once(p, h, frames, blocking, &broke);
  if (broke.token == 0) return;
  // A ring broke under this message (nothing of it written): the node fails what was in flight
  // on it, then the message goes again, over ZeroMQ once the link is dropped.
  if (!link_break_handler_ || !link_break_handler_(broke, h))
    throw SendError("the shared-memory link to " + addr + " is closed (" + broke.why + ")");
  broke = LinkBreak{};
  send_once(p, h, frames, blocking, &broke);
  if (broke.token != 0) throw SendError("the shared-memory link to " + addr + " broke again (" + broke.why + ")");
}

bool Transport::lock_unless_held_waiting(OutPeer& p, std::unique_lock<std::mutex>& g) {
  using clock = std::chrono::steady_clock;
  constexpr auto kGrace = std::chrono::microseconds(500);
  auto waited_since = clock::time_point::max();
  for (int tries = 0;; ++tries) {
    if (g.try_lock()) return true;
    if (p.holders_waiting.load(std::memory_order_relaxed) == 0) {
      waited_since = clock::time_point::max();
    } else {
      auto now = clock::now();
      if (waited_since == clock::time_point::max()) waited_since = now;
      if (now - waited_since > kGrace) return false;
    }
    if (tries < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void Transport::send_once(const std::shared_ptr<OutPeer>& p, Header& h, std::vector<zmq::message_t>& frames,
                          bool blocking, LinkBreak* broke) {
  std::unique_lock<std::mutex> g(p->mu, std::defer_lock);
  if (blocking)
    g.lock();
  else if (!lock_unless_held_waiting(*p, g))  // the receiving threads never wait for a stuck sender
    throw SendError("a send to " + p->addr + " is waiting for its link to take more (this thread does not wait)",
                    false, /*would_block=*/true);
  if (p->reroute_due) reroute_locked(p);
  if (!p->sock) throw SendError("connection to " + p->addr + " is closed");
  h.sender = self_.id;
  h.incarnation = self_.incarnation;
  if (links_send_locked(*p, h, frames, blocking, broke) || broke->token) return;
  Kind kind = h.kind;
  send_zmq_locked(*p, h, frames, blocking);
  propose_links_locked(*p, kind, blocking);
}

void Transport::send_link_message_locked(OutPeer& p, Kind kind, json body, bool blocking) {
  Header h;
  h.kind = kind;
  h.sender = self_.id;
  h.incarnation = self_.incarnation;
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
  else if (p->resends && p->seq > 0)  // it received them: what did not come is its answer
    report += "; " + std::string(kAllAcknowledged);
  if (p->via_back) report += "; reached through the connections it opens for this node";
  g.unlock();
  if (BackDialer* d = back_dialer()) {
    if (std::string back = d->describe(addr); !back.empty()) report += "; " + back;
  }
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
  if (p.resends) make_room_locked(p, payload_bytes(frames), blocking);
  if (p.hello_due) resume_locked(p, wait);
  h.seq = p.seq + 1;
  auto header = header_for_wire(h);
  Unacked kept;
  if (p.resends) kept = copy_for_resend(h.seq, header, frames);
  send_frames_locked(p, header, frames, wait, blocking);
  ++p.seq;  // taken only by a message that went out: a number skipped would read as a gap
  if (p.resends) keep_unacked_locked(p, std::move(kept));
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
  if (n > self_.max_message_bytes)
    throw SendError("message of " + std::to_string(n) + " bytes exceeds the maximum message size of " +
                        std::to_string(self_.max_message_bytes) + " bytes (XMESH_MAX_MESSAGE_BYTES)",
                    /*too_large=*/true);
}

void Transport::dial(zmq::socket_t& s, const std::string& addr) {
  const std::string gateway = gateway_for(addr);
  if (gateway.empty() && !is_relayed(addr)) return s.connect(addr);
  const SocksRoute route = socks_route(gateway, TcpEndpoint::parse(addr));
  RelayDialer* dialer;
  {
    std::lock_guard<std::mutex> g(dialer_mu_);
    if (!dialer_) dialer_ = std::make_unique<RelayDialer>();
    dialer = dialer_.get();
  }
  s.connect(dialer->local_endpoint(addr, route));
}

void Transport::present_to(zmq::socket_t& dealer, const std::string& addr, const std::string& cookie) {
  auto keys = this->keys();
  if (keys && addr.rfind("tcp://", 0) == 0)
    present_curve_key(dealer, keys->public_z85, keys->secret_z85);  // the cookie goes in Hello
  else
    present_credentials(dealer, self_.role, cookie);
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
    tend_links_locked(*p);
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

// Polls the watches of out peers whose first handshake has not ended (a peer's mutex is never
// taken under mu_); a refusal also closes that connection, so libzmq stops retrying it. A peer
// busy in a send is left to its sender, which polls the watch while its send waits; the
// refusals senders found come with the I/O thread's own.
std::vector<RefuseBody> Transport::handshake_verdicts() {
  std::vector<std::weak_ptr<OutPeer>> watching;
  std::vector<RefuseBody> refused;
  {
    std::lock_guard<std::mutex> g(mu_);
    watching.swap(handshaking_);
    refused.swap(refusals_);
  }
  std::vector<std::weak_ptr<OutPeer>> pending, reconnects;
  for (auto& w : watching) {
    auto p = w.lock();
    if (!p) continue;
    std::unique_lock<std::mutex> g(p->mu, std::try_to_lock);  // the I/O thread never waits for a sender
    if (!g.owns_lock()) {
      pending.push_back(w);
      continue;
    }
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

}  // namespace xmesh
