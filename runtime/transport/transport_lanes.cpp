// The transport's TCP lanes (tcp_lane.hpp; docs/ARCHITECTURE.md, "TCP lanes"): when a node asks
// for one and how it answers, how a message goes over a lane once it is up, how a lane that
// breaks gives its messages back to ZeroMQ, and how the I/O thread reads lanes beside its routers.
//
// The protocol, as for rings: after its first Call or Reply over a ZeroMQ TCP link, the writer
// sends LaneAsk; the receiver answers LaneOffer with its listener's host and port and a fresh
// secret (over the CURVE link), or why not; the writer connects (without waiting) and, once the
// connection is up, sends LaneSwitch as its last message over ZeroMQ; the receiver reads the lane
// only once it dispatched LaneSwitch, so per-sender order holds across the switch.
#include <poll.h>

#include <zmq_addon.hpp>

#include "spin.hpp"
#include "tcp_endpoint.hpp"
#include "transport.hpp"
#include "util.hpp"

namespace xmesh {

namespace {
constexpr int64_t kLaneOfferTtlMs = 30000;  // a secret given unused this long is forgotten
constexpr int kLaneBreaksAllowed = 3;       // then ZeroMQ alone to that peer

bool is_tcp_addr(const std::string& addr) { return addr.rfind("tcp://", 0) == 0; }

// "" when text is not hex of n bytes.
std::string unhex(const std::string& text, size_t n) {
  std::string out;
  return text.size() == 2 * n && from_hex(text, &out) ? out : "";
}

// Lanes go to nodes on other hosts (a proc behind its host agent's port too: its lane as well).
bool lane_worth_asking(const std::string& addr) {
  if (!is_tcp_addr(addr)) return false;
  try {
    TcpEndpoint::parse(addr);
    return true;
  } catch (const std::invalid_argument&) {
    return false;
  }
}
}  // namespace

void Transport::enable_lanes(const std::string& listen_host, int port, const std::string& advertise_host,
                             int agent_port, const std::string& handover) {
  auto listener = std::make_unique<LaneListener>(listen_host, port, handover);  // throws naming why
  std::string reach = numeric_host(advertise_host);
  std::lock_guard<std::mutex> g(lanes_mu_);
  lane_listener_ = std::move(listener);
  if (stream_adopter_) lane_listener_->set_stream_adopter(stream_adopter_);
  lane_host_ = reach;
  lane_agent_port_ = agent_port;
  lanes_on_.store(true);
}

std::string Transport::lane_endpoint() const {
  std::lock_guard<std::mutex> g(lanes_mu_);
  if (!lane_listener_) return "";
  TcpEndpoint e;
  e.host = lane_host_;
  e.port = lane_agent_port_ ? lane_agent_port_ : lane_listener_->port();
  e.behind = lane_agent_port_ ? lane_listener_->port() : 0;
  return e.str();
}

void Transport::set_stream_adopter(LaneListener::StreamAdopter adopter) {
  std::lock_guard<std::mutex> g(lanes_mu_);
  stream_adopter_ = std::move(adopter);
  if (lane_listener_) lane_listener_->set_stream_adopter(stream_adopter_);
}

void Transport::listen_for_lanes(const std::string& bound, const std::string& advertised) {
  if (!lanes_write_ || !takes_fast_links(role_kind_)) return;
  // A proc's agent names the address (a port of its --ports range), or "off" when it has none.
  const std::string given = role_kind_ == Role::proc ? env_str("XMESH_LANE_LISTEN", "") : "";
  if (given == "off") return;
  try {
    TcpEndpoint reach = TcpEndpoint::parse(advertised);
    if (reach.behind) {  // behind its agent's one port: its lanes too, at the loopback port given
      if (given.empty()) return;
      TcpEndpoint at = TcpEndpoint::parse(given);
      enable_lanes(at.host, at.port, reach.host, reach.port, env_str("XMESH_LANE_HANDOVER", ""));
      return;
    }
    TcpEndpoint at = TcpEndpoint::parse(given.empty() ? bound : given);
    enable_lanes(at.host, given.empty() ? 0 : at.port, reach.host);
  } catch (const std::exception& e) {
    log_diag(role_, std::string("no TCP lanes to this node (its peers use ZeroMQ): ") + e.what());
  }
}

// ---- the writer's side ------------------------------------------------------------------------
void Transport::ask_lane_locked(OutPeer& p, Kind sent, bool blocking) {
  if (!lanes_write_ || p.lane_state != OutPeer::Lane::none || !p.resends) return;
  if (sent != Kind::Call && sent != Kind::Reply && sent != Kind::Replies) return;
  if (!takes_fast_links(role_kind_)) return;
  if (!lane_worth_asking(p.addr)) {
    p.lane_state = OutPeer::Lane::declined;
    return;
  }
  try {
    send_link_message_locked(p, Kind::LaneAsk, nullptr, blocking);
    p.lane_state = OutPeer::Lane::asked;
  } catch (const SendError&) {  // the message itself went: the lane is only not asked for now
  }
}

void Transport::on_lane_offer(const std::string& from, const LaneOfferBody& offer) {
  auto p = existing_out_peer(from);
  if (!p) return;
  std::lock_guard<std::mutex> g(p->mu);
  if (p->lane_state != OutPeer::Lane::asked) return;
  std::string why = offer.ok ? "" : offer.reason.empty() ? "the peer takes no lanes" : offer.reason;
  LaneSecret secret{unhex(offer.key, kLaneKeyBytes), unhex(offer.token, kLaneTokenBytes)};
  if (why.empty() && (secret.key.empty() || secret.token.empty() || offer.port <= 0 || offer.port > 65535 ||
                      offer.via < 0 || offer.via > 65535))
    why = "its offer does not read (key, token or port)";
  if (why.empty()) {
    try {
      p->lane = std::make_unique<LaneWriter>(offer.host, static_cast<int>(offer.port), secret, static_cast<int>(offer.via));
      p->lane_state = OutPeer::Lane::connecting;
      return;
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  p->lane_state = OutPeer::Lane::declined;
  log_diag_limited(lane_log_, role_, "no TCP lane to " + from + " (ZeroMQ goes on): " + why);
}

bool Transport::lane_send_locked(OutPeer& p, Header& h, std::vector<zmq::message_t>& frames, bool blocking) {
  if (!p.lane) return false;
  if (p.hello_due) {  // the ZeroMQ link was made again: what is unacknowledged goes there first
    lane_gone_locked(p, "its ZeroMQ link was made again");
    return false;
  }
  if (p.lane_state == OutPeer::Lane::connecting) {
    auto state = p.lane->state();
    if (state == LaneWriter::State::broken) {
      lane_gone_locked(p, p.lane->error());
      return false;
    }
    if (state != LaneWriter::State::up) return false;
    // The last message over ZeroMQ: the receiver reads the lane once it dispatched this.
    send_link_message_locked(p, Kind::LaneSwitch, nullptr, blocking);  // SendError: the switch is still due
    p.lane_state = OutPeer::Lane::active;
    p.lane_up.store(true);
    spin_for_network();
  }
  if (p.lane_state != OutPeer::Lane::active) return false;
  Unacked kept{};
  for (auto& f : frames) kept.bytes += f.size();
  make_room_locked(p, kept.bytes, blocking);
  h.seq = p.seq + 1;
  h.pieces.clear();  // a lane carries frames whole
  auto header = header_for_wire(h);
  kept.seq = h.seq;
  kept.header = header;
  kept.bytes += header.size();
  kept.frames.resize(frames.size());
  for (size_t i = 0; i < frames.size(); ++i) kept.frames[i].copy(frames[i]);  // shares their memory
  auto result = p.lane->write(header, frames, blocking, static_cast<int>(send_timeout_ms_));
  if (result == LaneWriter::Result::would_block)  // nothing of it was written
    throw SendError("the lane to " + p.addr + " is full (this thread does not wait)", false, true);
  // Written, in part or whole, or waiting to leave: it is the link's now, kept until acknowledged.
  ++p.seq;
  p.unacked_bytes += kept.bytes;
  p.unacked.push_back(std::move(kept));
  p.unacked_count.store(p.unacked.size(), std::memory_order_relaxed);
  ++counts_.sent;
  ++counts_.lane_sent;
  if (result == LaneWriter::Result::broken) {  // it and everything unacknowledged go over ZeroMQ
    lane_gone_locked(p, p.lane->error());
    try {
      resume_locked(p, blocking ? zmq::send_flags::none : zmq::send_flags::dontwait);
    } catch (const SendError&) {  // hello_due stays set: the next send or tick sends them
    }
  }
  return true;
}

void Transport::lane_gone_locked(OutPeer& p, std::string why, bool quiet) {  // why: a copy (the lane's error goes with it)
  const bool was_active = p.lane_state == OutPeer::Lane::active;
  if (p.lane) p.lane->close();
  p.lane.reset();
  p.lane_up.store(false);
  p.lane_state = ++p.lane_breaks >= kLaneBreaksAllowed ? OutPeer::Lane::declined : OutPeer::Lane::none;
  ++counts_.lane_breaks;
  if (was_active) p.hello_due = true;  // Hello, then again whatever the lane took unacknowledged
  if (quiet) return;
  log_diag_limited(lane_log_, role_,
                   "the TCP lane to " + p.addr + " is given up (" + why + "): ZeroMQ carries its messages" +
                       (p.lane_state == OutPeer::Lane::declined ? " from now on" : " until a new lane is up"));
}

void Transport::tend_lane_locked(OutPeer& p) {
  if (!p.lane || p.lane_state != OutPeer::Lane::active) return;
  // A writer's lane never carries anything back: readable means its reader closed it.
  pollfd pf{p.lane->fd(), POLLIN, 0};
  bool closed = ::poll(&pf, 1, 0) > 0 && (pf.revents & (POLLIN | POLLHUP | POLLERR));
  if (!closed && p.lane->flush(0) != LaneWriter::Result::broken) return;
  // Closed by its reader: that node closed it or ended (a proc that stopped): said by
  // supervision if it matters; what it did not acknowledge goes again over ZeroMQ, quietly.
  lane_gone_locked(p, closed ? "its reader closed it" : p.lane->error(), closed);
  try {
    resume_locked(p, zmq::send_flags::dontwait);
  } catch (const SendError&) {
  }
}

// ---- the reader's side ------------------------------------------------------------------------
void Transport::on_lane_ask(const std::string& from) {
  LaneOfferBody answer;
  {
    std::lock_guard<std::mutex> g(lanes_mu_);
    if (!lane_listener_) {
      answer.reason = "this node listens for no lanes";
    } else if (!is_tcp_addr(from)) {
      answer.reason = "a lane is for a node on another host (" + from + " is not a TCP address)";
    } else {
      LaneSecret secret = make_lane_secret();
      lane_listener_->expect(secret, from, now_ms(), kLaneOfferTtlMs);
      answer.ok = true;
      answer.host = lane_host_;
      answer.port = lane_agent_port_ ? lane_agent_port_ : lane_listener_->port();
      answer.via = lane_agent_port_ ? lane_listener_->port() : 0;
      answer.key = to_hex(secret.key);
      answer.token = to_hex(secret.token);
    }
  }
  Header h;
  h.kind = Kind::LaneOffer;
  h.body = answer;
  std::vector<zmq::message_t> none;
  try {
    send(from, h, none, /*blocking=*/false);
  } catch (const SendError&) {  // the asker never hears: its secret expires unused
  }
}

void Transport::on_lane_switch(const std::string& from, const std::string& identity) {
  std::lock_guard<std::mutex> g(lanes_mu_);
  LaneRead& lane = lanes_in_[from];
  lane.switched = true;
  spin_for_network();
  lane.identity = identity;
  if (lane.in) read_lane(from, lane);  // records may have come with its token
}

void Transport::close_lanes() {
  std::lock_guard<std::mutex> g(lanes_mu_);
  for (auto& kv : lanes_in_) {
    kv.second.in.reset();
    kv.second.switched = false;
  }
}

void Transport::accept_lanes() {
  std::vector<std::string> refused;
  std::lock_guard<std::mutex> g(lanes_mu_);
  if (!lane_listener_) return;
  for (auto& a : lane_listener_->poll(now_ms(), &refused)) {
    std::string writer = a.writer_addr;
    LaneRead& lane = lanes_in_[writer];
    lane.in = std::make_unique<LaneIn>(std::move(a), max_message_bytes_);
    lane.switched = false;  // a lane made again: read once its own LaneSwitch came
  }
  for (auto& r : refused) {
    ++counts_.rejected;
    log_diag_limited(refusal_log_, role_, r);
  }
}

// Under lanes_mu_ (I/O thread): what `lane` holds now, admitted as from its writer's connection.
void Transport::read_lane(const std::string& writer, LaneRead& lane) {
  std::vector<Message> got;
  std::vector<LaneIn::TooLarge> too_large;
  std::string error;
  auto status = lane.in->read(got, too_large, &error);
  for (auto& m : got) {
    InPeer& in = in_peer(lane.identity);
    if (!in.authed) continue;
    if (auto r = accept_numbered(lane.identity, in, std::move(m))) {
      ++counts_.lane_received;
      lane_ready_.push_back(std::move(*r));
    }
  }
  for (auto& t : too_large) {
    ++counts_.too_large;
    Received r{std::move(t.msg), std::nullopt};
    r.too_large = true;
    r.payload_bytes = t.payload_bytes;
    r.sender_limit = in_peer(lane.identity).max_message_bytes;
    r.msg.sender_addr = writer;
    lane_ready_.push_back(std::move(r));
  }
  if (status == LaneIn::Status::open) return;
  if (status == LaneIn::Status::broken) count_malformed("a TCP lane from " + writer + " was closed: " + error);
  lane.in.reset();  // its writer sends again over ZeroMQ what this node did not acknowledge
  lane.switched = false;
}

std::optional<Transport::Received> Transport::take_lane_ready() {
  if (lane_ready_.empty()) return std::nullopt;
  Received r = std::move(lane_ready_.front());
  lane_ready_.pop_front();
  return r;
}

zmq::socket_t* Transport::receive_parts_with_lanes(std::vector<zmq::message_t>& parts) {
  zmq::socket_t* tcp = tcp_ready_.load(std::memory_order_acquire);
  // Kept between calls (the I/O thread's alone): no allocation per message.
  auto& items = poll_items_;
  auto& readers = poll_readers_;  // the writers whose lanes are polled, in items' order
  auto& fds = poll_fds_;
  items.clear();
  readers.clear();
  fds.clear();
  items.push_back({router_->handle(), 0, ZMQ_POLLIN, 0});
  if (tcp) items.push_back({tcp->handle(), 0, ZMQ_POLLIN, 0});
  const size_t routers = items.size();
  {
    std::lock_guard<std::mutex> g(lanes_mu_);
    if (lane_listener_) lane_listener_->fds(fds);
    for (int fd : fds) items.push_back({nullptr, fd, ZMQ_POLLIN, 0});
    for (auto& [writer, lane] : lanes_in_)
      if (lane.in && lane.switched) {
        items.push_back({nullptr, lane.in->fd(), ZMQ_POLLIN, 0});
        readers.push_back(writer);
      }
  }
  if (zmq::poll(items.data(), items.size(), std::chrono::milliseconds(receive_timeout_ms_)) <= 0) return nullptr;
  const size_t lanes_from = items.size() - readers.size();
  bool listener_ready = false;
  for (size_t i = routers; i < lanes_from; ++i) listener_ready = listener_ready || items[i].revents;
  if (listener_ready) accept_lanes();
  {
    std::lock_guard<std::mutex> g(lanes_mu_);
    for (size_t i = 0; i < readers.size(); ++i) {
      if (!items[lanes_from + i].revents) continue;
      auto it = lanes_in_.find(readers[i]);
      if (it != lanes_in_.end() && it->second.in && it->second.switched) read_lane(readers[i], it->second);
    }
  }
  for (size_t i = 0; i < routers; ++i) {
    zmq::socket_t* s = i == 0 ? router_.get() : tcp;
    if (items[i].revents && zmq::recv_multipart(*s, std::back_inserter(parts), zmq::recv_flags::dontwait)) return s;
  }
  return nullptr;
}

}  // namespace xmesh
