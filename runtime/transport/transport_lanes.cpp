// The TCP lane as a link kind (link.hpp, tcp_lane.hpp; docs/architecture/03-transport-and-links.md, "TCP lanes between hosts"): the
// writer's end over a LaneWriter, what the transport asks and answers for it, and the reading
// side: the listener and the lanes the I/O thread reads beside its routers.
//
// The upgrade is link.hpp's: after its first Call or Reply over a ZeroMQ TCP link, the writer
// sends LaneAsk; the receiver answers LaneOffer with its listener's host and port and a fresh
// secret (over the CURVE link), or why not; the writer connects (without waiting) and, once the
// connection is up, sends LaneSwitch as its last message over ZeroMQ. A lane's messages are
// numbered and kept until acknowledged like the ZeroMQ ones: a lane that breaks costs nothing.
#include <poll.h>

#include <zmq_addon.hpp>

#include "spin.hpp"
#include "tcp_endpoint.hpp"
#include "transport.hpp"
#include "util.hpp"
#include "link_bodies.hpp"

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
  // A controller's back connections, handed over by the agent's PortMux (back_links.hpp).
  listener->set_back_adopter([this](unique_fd fd, std::string early) { adopt_back_connection(std::move(fd), std::move(early)); });
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
  // XMESH_LANES=0 turns lanes off; a proc whose controller it reaches back listens all the same
  // (its agent hands it the controller's connections there).
  if (!takes_fast_links(self_.kind) || (!lanes_write_ && !has_back_pool_.load())) return;
  // A proc's agent names the address (a port of its --ports range), or "off" when it has none.
  const std::string given = self_.kind == Role::proc ? env_str("XMESH_LANE_LISTEN", "") : "";
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
    log_diag(self_.role, std::string("no TCP lanes to this node (its peers use ZeroMQ): ") + e.what());
  }
}

// ---- the writer's side ------------------------------------------------------------------------
namespace {
constexpr LinkSpec kLaneSpec{"TCP lane", Kind::LaneAsk, Kind::LaneOffer, Kind::LaneSwitch,
                             /*breaks_allowed=*/kLaneBreaksAllowed, /*numbered=*/true};

// The writer's end of one lane: its own connection, or one its reader opened for it (a
// controller reached back, back_links.hpp), taken once one is free.
class LaneLink final : public LinkWriter {
 public:
  LaneLink(const SocksRoute& route, const LaneSecret& secret) : lane_(std::make_unique<LaneWriter>(route, secret)) {}
  LaneLink(std::function<unique_fd()> take, std::string reader, LaneSecret secret)
      : take_(std::move(take)), reader_(std::move(reader)), secret_(std::move(secret)),
        deadline_(now_ms() + kBackLaneWaitMs) {}
  bool ready(std::string* failed) override {
    if (!lane_ && !take_back(failed)) return false;
    auto state = lane_->state();
    if (state == LaneWriter::State::broken) *failed = lane_->error();
    return state == LaneWriter::State::up;
  }
  void switched() override { spin_for_network(); }
  LinkWrite write(const std::vector<uint8_t>& header, const std::vector<zmq::message_t>& frames, bool blocking,
                  int timeout_ms, uint32_t) override {
    if (!lane_) return LinkWrite::would_block;
    switch (lane_->write(header, frames, blocking, timeout_ms)) {
      case LaneWriter::Result::ok: return LinkWrite::ok;
      case LaneWriter::Result::would_block: return LinkWrite::would_block;
      case LaneWriter::Result::timed_out: return LinkWrite::timed_out;
      case LaneWriter::Result::broken: return LinkWrite::broken;
    }
    return LinkWrite::broken;
  }
  bool tend(std::string* why, bool* by_reader) override {
    *by_reader = false;
    if (!lane_) return true;
    // A writer's lane never carries anything back: readable means its reader closed it.
    pollfd pf{lane_->fd(), POLLIN, 0};
    *by_reader = ::poll(&pf, 1, 0) > 0 && (pf.revents & (POLLIN | POLLHUP | POLLERR));
    if (!*by_reader && lane_->flush(0) != LaneWriter::Result::broken) return true;
    *why = *by_reader ? "its reader closed it" : lane_->error();
    return false;
  }
  std::string error() const override { return lane_ ? lane_->error() : why_; }
  void close() override {
    if (lane_) lane_->close();
  }
  // interrupt(): none. Its fd may be closed under the peer's lock at any moment, so no other
  // thread touches it; a blocked write waits at most the send timeout.

 private:
  static constexpr int64_t kBackLaneWaitMs = 10000;
  bool take_back(std::string* failed) {
    if (unique_fd fd = take_()) {
      lane_ = std::make_unique<LaneWriter>(std::move(fd), reader_, secret_);
      return true;
    }
    if (now_ms() > deadline_) {
      why_ = "no connection " + reader_ + " opened for this node was free within " +
             std::to_string(kBackLaneWaitMs / 1000) + " s";
      *failed = why_;
    }
    return false;
  }
  std::unique_ptr<LaneWriter> lane_;
  std::function<unique_fd()> take_;
  std::string reader_, why_;
  LaneSecret secret_;
  int64_t deadline_ = 0;
};
}  // namespace

class Transport::LaneKind final : public LinkKind {
 public:
  explicit LaneKind(Transport& t) : t_(t) {}
  const LinkSpec& spec() const override { return kLaneSpec; }
  bool reaches(const std::string& addr, bool resends) const override {
    return t_.lanes_write_ && resends && takes_fast_links(t_.self_.kind) && lane_worth_asking(addr);
  }
  std::shared_ptr<LinkWriter> propose(json* body) override {
    *body = nullptr;  // the ask says nothing: the answer names the listener
    return nullptr;
  }
  std::shared_ptr<LinkWriter> answered(const std::string& from, const std::shared_ptr<LinkWriter>&, const json& answer,
                                       std::string* why) override {
    auto offer = read_as<LaneOfferBody>(answer, why);
    if (!offer) {
      *why = "its offer does not read: " + *why;
      return nullptr;
    }
    *why = offer->ok ? "" : offer->reason.empty() ? "the peer takes no lanes" : offer->reason;
    LaneSecret secret{unhex(offer->key, kLaneKeyBytes), unhex(offer->token, kLaneTokenBytes)};
    const bool port_ok = offer->back || (offer->port > 0 && offer->port <= 65535 && offer->via >= 0 && offer->via <= 65535);
    if (why->empty() && (secret.key.empty() || secret.token.empty() || !port_ok))
      *why = "its offer does not read (key, token or port)";
    if (!why->empty()) return nullptr;
    if (offer->back)  // a controller this node cannot connect to: over one of its connections
      return std::make_shared<LaneLink>([this, from] { return t_.take_back_connection(from); }, from, secret);
    try {
      TcpEndpoint reader{offer->host, static_cast<int>(offer->port), static_cast<int>(offer->via)};
      return std::make_shared<LaneLink>(socks_route(t_.gateway_for(from), reader), secret);
    } catch (const std::exception& e) {
      *why = e.what();
      return nullptr;
    }
  }
  json answer(const std::string& from, const json&) override { return t_.lane_answer(from); }
  void take(const std::string& from, const std::string& identity) override { t_.lane_switched(from, identity); }

 private:
  Transport& t_;
};

std::unique_ptr<LinkKind> Transport::make_lane_kind() { return std::make_unique<LaneKind>(*this); }

// ---- the reader's side ------------------------------------------------------------------------
// An ask from `from`: a fresh secret for the listener (or why not). Not sent: its secret expires unused.
LaneOfferBody Transport::lane_answer(const std::string& from) {
  LaneOfferBody answer;
  std::lock_guard<std::mutex> g(lanes_mu_);
  if (!lane_listener_) {
    answer.reason = "this node listens for no lanes";
  } else if (!lanes_write_) {
    answer.reason = "this node takes no lanes (XMESH_LANES=0)";
  } else if (!is_tcp_addr(from)) {
    answer.reason = "a lane is for a node on another host (" + from + " is not a TCP address)";
  } else if (reach_back_.load()) {  // the asker writes over a connection this node opened for it
    LaneSecret secret = make_lane_secret();
    lane_listener_->expect(secret, from, now_ms(), kLaneOfferTtlMs);
    answer.ok = true;
    answer.back = true;
    answer.key = to_hex(secret.key);
    answer.token = to_hex(secret.token);
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
  return answer;
}

void Transport::lane_switched(const std::string& from, const std::string& identity) {
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
    // Its LaneSwitch may have come first (the switch over ZeroMQ overtook the connection, as a
    // lane over a back connection can): read it at once. A lane made again in place of one still
    // open is read once its own LaneSwitch comes.
    const bool switch_came_first = !lane.in && lane.switched;
    lane.in = std::make_unique<LaneIn>(std::move(a), self_.max_message_bytes);
    lane.switched = switch_came_first;
    if (switch_came_first) read_lane(writer, lane);
  }
  for (auto& r : refused) {
    ++counts_.rejected;
    log_diag_limited(refusal_log_, self_.role, r);
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

// Which routers hold a message now (bit 0: the first, bit 1: the TCP one). Reading ZMQ_EVENTS
// makes a socket take its pending commands, so its ZMQ_FD may fall quiet with a message waiting:
// after this (and after any receive or send on it) the routers are read again before a sleep.
unsigned Transport::routers_holding(zmq::socket_t* tcp) {
  unsigned holding = 0;
  if (router_->get(zmq::sockopt::events) & ZMQ_POLLIN) holding |= 1u;
  if (tcp && (tcp->get(zmq::sockopt::events) & ZMQ_POLLIN)) holding |= 2u;
  return holding;
}

// One poll(2) per wake-up: the routers' ZMQ_FDs, the lane listener and the lanes being read, the
// routers' ZMQ_EVENTS read only when their ZMQ_FD said something changed or this thread used
// them since (zmq_poll costs three or four system calls per wake-up, each lane message paid them).
zmq::socket_t* Transport::receive_parts_with_lanes(std::vector<zmq::message_t>& parts) {
  zmq::socket_t* tcp = tcp_ready_.load(std::memory_order_acquire);
  // Kept between calls (the I/O thread's alone): no allocation per message.
  auto& pfds = poll_fds_;
  auto& readers = poll_readers_;  // the writers whose lanes are polled, in pfds' order
  auto& listener_fds = listener_fds_;
  pfds.clear();
  readers.clear();
  listener_fds.clear();
  pfds.push_back({router_->get(zmq::sockopt::fd), POLLIN, 0});
  if (tcp) pfds.push_back({tcp->get(zmq::sockopt::fd), POLLIN, 0});
  const size_t routers = pfds.size();
  {
    std::lock_guard<std::mutex> g(lanes_mu_);
    if (lane_listener_) lane_listener_->fds(listener_fds);
    for (int fd : listener_fds) pfds.push_back({fd, POLLIN, 0});
    for (auto& [writer, lane] : lanes_in_)
      if (lane.in && lane.switched) {
        pfds.push_back({lane.in->fd(), POLLIN, 0});
        readers.push_back(writer);
      }
  }
  if (routers_stale_.exchange(false, std::memory_order_acq_rel)) routers_holding_ = routers_holding(tcp);
  // A router holding a message: only a look at the lanes, no sleep.
  const int timeout = routers_holding_ ? 0 : receive_timeout_ms_;
  if (::poll(pfds.data(), pfds.size(), timeout) < 0) return nullptr;  // EINTR: go round again
  bool router_moved = false;
  for (size_t i = 0; i < routers; ++i) router_moved = router_moved || pfds[i].revents;
  const size_t lanes_from = pfds.size() - readers.size();
  bool listener_ready = false;
  for (size_t i = routers; i < lanes_from; ++i) listener_ready = listener_ready || pfds[i].revents;
  if (listener_ready) accept_lanes();
  {
    std::lock_guard<std::mutex> g(lanes_mu_);
    for (size_t i = 0; i < readers.size(); ++i) {
      if (!pfds[lanes_from + i].revents) continue;
      auto it = lanes_in_.find(readers[i]);
      if (it != lanes_in_.end() && it->second.in && it->second.switched) read_lane(readers[i], it->second);
    }
  }
  if (router_moved || routers_stale_.exchange(false, std::memory_order_acq_rel))
    routers_holding_ = routers_holding(tcp);
  for (size_t i = 0; i < routers; ++i) {
    if (!(routers_holding_ & (1u << i))) continue;
    zmq::socket_t* s = i == 0 ? router_.get() : tcp;
    routers_stale_.store(true, std::memory_order_release);  // what it holds next is read again
    if (zmq::recv_multipart(*s, std::back_inserter(parts), zmq::recv_flags::dontwait)) return s;
  }
  return nullptr;
}

}  // namespace xmesh
