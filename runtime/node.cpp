#include "node.hpp"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include <zmq_addon.hpp>

#include "bodies.hpp"
#include "util.hpp"

namespace xmesh {

namespace {
constexpr size_t kIpcPathMax = 107;

std::string short_host() {
  std::string h = hostname();
  auto dot = h.find('.');
  return dot == std::string::npos ? h : h.substr(0, dot);
}

void set_common_options(zmq::socket_t& s) {
  s.set(zmq::sockopt::linger, static_cast<int>(env_int("XMESH_LINGER_MS", 1000)));
}
}  // namespace

Node::Node(std::string role, std::string bind_addr, std::string accept_cookie)
    : role_(std::move(role)), ctx_(1) {
  std::string inc_hex = random_hex(8);
  incarnation_ = std::stoull(inc_hex, nullptr, 16);
  if (incarnation_ == 0) incarnation_ = 1;
  id_ = role_ + "-" + short_host() + "-" + std::to_string(getpid()) + "-" + inc_hex.substr(0, 8);
  max_message_bytes_ = static_cast<size_t>(env_int("XMESH_MAX_MESSAGE_BYTES", int64_t(1) << 30));
  heartbeat_ms_ = env_int("XMESH_HEARTBEAT_MS", 1000);
  hostd_timeout_ms_ = env_int("XMESH_HOSTD_TIMEOUT_MS", 10000);
  actor_wait_ms_ = env_int("XMESH_ACTOR_WAIT_MS", 10000);
  max_pending_peers_ = static_cast<size_t>(std::max<int64_t>(1, env_int("XMESH_MAX_PENDING_PEERS", 10000)));
  if (!accept_cookie.empty()) accepted_cookies_.insert(accept_cookie);
  register_builtin_handlers();

  if (bind_addr.rfind("ipc://", 0) == 0) {
    std::string path = bind_addr.substr(6);
    if (path.size() > kIpcPathMax)
      throw std::runtime_error("socket path " + path + " is " + std::to_string(path.size()) +
                               " bytes; unix socket paths must fit in " + std::to_string(kIpcPathMax) +
                               " bytes (use a shorter XMESH_RUNTIME_DIR)");
    unlink(path.c_str());
  }
  router_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::router);
  set_common_options(*router_);
  router_->set(zmq::sockopt::router_mandatory, 1);
  router_->set(zmq::sockopt::rcvhwm, 100000);
  router_->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_message_bytes_ + (1 << 20)));
  // Files this node creates (its ipc socket) are for this user only.
  mode_t old = umask(077);
  try {
    router_->bind(bind_addr);
  } catch (const zmq::error_t& e) {
    umask(old);
    throw std::runtime_error("cannot listen on " + bind_addr + ": " + e.what());
  }
  umask(old);
  addr_ = router_->get(zmq::sockopt::last_endpoint);
  if (addr_.rfind("ipc://", 0) == 0) chmod(addr_.substr(6).c_str(), 0600);
}

Node::~Node() { stop(); }

void Node::start() {
  if (running_.exchange(true)) return;
  io_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "xmesh-io");  // shows in top -H, perf, gdb
    io_loop();
  });
}

void Node::stop() {
  if (stopping_.exchange(true)) return;
  if (io_.joinable()) io_.join();
  running_ = false;
  control_.close();
  logs_.close();
  actor_events_.close();
  std::vector<std::shared_ptr<Inbox>> actors;
  std::vector<std::shared_ptr<OutPeer>> peers;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& kv : actors_) actors.push_back(kv.second);
    for (auto& kv : out_) peers.push_back(kv.second);
    out_.clear();
  }
  for (auto& a : actors) a->close();
  for (auto& p : peers) {
    std::lock_guard<std::mutex> g(p->mu);
    p->sock.reset();
  }
  router_.reset();
  if (addr_.rfind("ipc://", 0) == 0) unlink(addr_.substr(6).c_str());
  ctx_.close();
}

void Node::set_peer_cookie(const std::string& addr, const std::string& cookie) {
  std::lock_guard<std::mutex> g(mu_);
  peer_cookies_[addr] = cookie;
}

void Node::set_stack_dumper(StackDumper dumper) {
  std::lock_guard<std::mutex> g(mu_);
  stack_dumper_ = std::move(dumper);
}

void Node::set_default_cookie(const std::string& cookie) {
  std::lock_guard<std::mutex> g(mu_);
  default_cookie_ = cookie;
}

void Node::add_accepted_cookie(const std::string& cookie) {
  std::lock_guard<std::mutex> g(mu_);
  accepted_cookies_.insert(cookie);
}

std::shared_ptr<Node::OutPeer> Node::out_peer(const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = out_.find(addr);
  if (it != out_.end()) return it->second;
  if (stopping_) throw SendError("this process's xmesh node has stopped");
  auto p = std::make_shared<OutPeer>();
  p->sock = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
  set_common_options(*p->sock);
  p->sock->set(zmq::sockopt::routing_id, id_);
  p->sock->set(zmq::sockopt::sndhwm, 100000);
  // Procs are connected to before they listen: retry quickly so the first message is not late.
  p->sock->set(zmq::sockopt::reconnect_ivl, 10);
  p->sock->set(zmq::sockopt::reconnect_ivl_max, 200);
  p->sock->set(zmq::sockopt::sndtimeo, static_cast<int>(env_int("XMESH_SEND_TIMEOUT_MS", 30000)));
  try {
    p->sock->connect(addr);
  } catch (const zmq::error_t& e) {
    throw SendError("cannot connect to " + addr + ": " + e.what());
  }
  auto c = peer_cookies_.find(addr);
  p->cookie = c != peer_cookies_.end() ? c->second : default_cookie_;
  out_[addr] = p;
  return p;
}

void Node::send_hello_locked(OutPeer& p) {
  Header h;
  h.kind = Kind::Hello;
  h.sender = id_;
  h.incarnation = incarnation_;
  h.seq = ++p.seq;
  std::string reply_cookie;
  {
    std::lock_guard<std::mutex> g(mu_);
    reply_cookie = accepted_cookies_.empty() ? "" : *accepted_cookies_.begin();
  }
  h.body = {{"proto", protocol_version()}, {"version", version_string()}, {"build", build_id()},
            {"cookie", p.cookie},          {"reply_cookie", reply_cookie}, {"addr", addr_},
            {"role", role_},               {"pid", getpid()},              {"host", hostname()}};
  auto bytes = encode_header(h);
  zmq::message_t m(bytes.data(), bytes.size());
  if (!p.sock->send(m, zmq::send_flags::none)) throw SendError("send timed out (hello)");
  p.hello_sent = true;
}

void Node::send_locked(OutPeer& p, const std::string& addr, Header& h, std::vector<zmq::message_t>& frames) {
  if (!p.sock) throw SendError("connection to " + addr + " is closed");
  if (!p.hello_sent) send_hello_locked(p);
  h.sender = id_;
  h.incarnation = incarnation_;
  h.seq = ++p.seq;
  auto bytes = encode_header(h);
  zmq::message_t hm(bytes.data(), bytes.size());
  try {
    auto flags = frames.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore;
    if (!p.sock->send(hm, flags))
      throw SendError("sending to " + addr + " timed out after " +
                      std::to_string(env_int("XMESH_SEND_TIMEOUT_MS", 30000)) + " ms (peer not reading)");
    for (size_t i = 0; i < frames.size(); ++i) {
      auto f = i + 1 == frames.size() ? zmq::send_flags::none : zmq::send_flags::sndmore;
      if (!p.sock->send(frames[i], f)) throw SendError("sending to " + addr + " timed out (payload)");
    }
  } catch (const zmq::error_t& e) {
    throw SendError("sending to " + addr + " failed: " + e.what());
  }
  std::lock_guard<std::mutex> g(mu_);
  ++stats_.sent;
}

void Node::check_size(const std::vector<zmq::message_t>& frames) const {
  size_t n = 0;
  for (auto& f : frames) n += f.size();
  if (n > max_message_bytes_)
    throw SendError("message of " + std::to_string(n) + " bytes exceeds the maximum message size of " +
                        std::to_string(max_message_bytes_) + " bytes (XMESH_MAX_MESSAGE_BYTES)",
                    /*too_large=*/true);
}

void Node::send(const std::string& addr, Header h, std::vector<zmq::message_t> frames) {
  check_size(frames);
  json err;
  if (is_dead(addr, &err)) throw SendError("peer " + addr + " is dead: " + err.value("text", std::string("unknown")));
  auto p = out_peer(addr);
  std::lock_guard<std::mutex> g(p->mu);
  send_locked(*p, addr, h, frames);
}

std::shared_ptr<Call> Node::call(const std::vector<Target>& targets, Header tmpl, std::vector<zmq::message_t> frames,
                                 bool expect_reply) {
  check_size(frames);
  std::vector<std::string> addrs;
  addrs.reserve(targets.size());
  for (auto& t : targets) addrs.push_back(t.addr);
  uint64_t id = next_corr_++;
  auto c = std::make_shared<Call>(id, addrs);
  std::vector<std::pair<size_t, json>> dead_targets;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (expect_reply) {
      calls_[id] = c;
      for (auto& a : addrs) calls_by_addr_[a].insert(id);
    }
    for (size_t i = 0; i < addrs.size(); ++i) {
      auto d = dead_.find(addrs[i]);
      if (d != dead_.end()) dead_targets.emplace_back(i, d->second);
    }
  }
  std::vector<bool> skip(targets.size(), false);
  for (auto& dt : dead_targets) {
    skip[dt.first] = true;
    CallResult r;
    r.index = static_cast<int64_t>(dt.first);
    r.body = dt.second;
    c->deliver(std::move(r));
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    if (skip[i]) continue;
    Header h = tmpl;
    h.corr = expect_reply ? id : 0;  // no correlation id: nobody waits for an answer
    h.index = static_cast<int64_t>(i);
    h.actor = targets[i].actor;
    std::vector<zmq::message_t> copy(frames.size());
    for (size_t f = 0; f < frames.size(); ++f) copy[f].copy(frames[f]);  // shares large buffers
    try {
      auto p = out_peer(targets[i].addr);
      std::lock_guard<std::mutex> g(p->mu);
      send_locked(*p, targets[i].addr, h, copy);
    } catch (const SendError& e) {
      CallResult r;
      r.index = static_cast<int64_t>(i);
      r.body = error_body(ErrorKind::Send, e.what());
      c->deliver(std::move(r));
    }
  }
  if (expect_reply && c->done()) forget_call(id);
  return c;
}

std::shared_ptr<Call> Node::expect(const std::vector<std::string>& addrs) {
  uint64_t id = next_corr_++;
  auto c = std::make_shared<Call>(id, addrs);
  std::vector<std::pair<size_t, json>> dead;
  {
    std::lock_guard<std::mutex> g(mu_);
    calls_[id] = c;
    for (size_t i = 0; i < addrs.size(); ++i) {
      calls_by_addr_[addrs[i]].insert(id);
      auto d = dead_.find(addrs[i]);
      if (d != dead_.end()) dead.emplace_back(i, d->second);
    }
  }
  for (auto& d : dead) {
    CallResult r;
    r.index = static_cast<int64_t>(d.first);
    r.body = d.second;
    c->deliver(std::move(r));
  }
  return c;
}

void Node::reply(const Message& call_msg, bool ok, json body, std::vector<zmq::message_t> frames) {
  if (call_msg.sender_addr.empty() || call_msg.header.corr == 0) return;  // nobody waits
  Header h;
  h.kind = Kind::Reply;
  h.corr = call_msg.header.corr;
  h.index = call_msg.header.index;
  h.ok = ok;
  if (body.is_object() && !body.empty()) h.body = std::move(body);
  try {
    send(call_msg.sender_addr, std::move(h), std::move(frames));
  } catch (const SendError& e) {
    if (e.too_large) {
      // A result too large to send still gets an answer: the error, naming both sizes.
      Header eh;
      eh.kind = Kind::Reply;
      eh.corr = call_msg.header.corr;
      eh.index = call_msg.header.index;
      eh.body = error_body(ErrorKind::Send, std::string("result could not be sent: ") + e.what());
      try {
        send(call_msg.sender_addr, std::move(eh), {});
      } catch (const SendError&) {
      }
    }
  }
}

void Node::forget_call(uint64_t id) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = calls_.find(id);
  if (it == calls_.end()) return;
  if (auto c = it->second.lock()) {
    for (size_t i = 0; i < c->size(); ++i) {
      auto b = calls_by_addr_.find(c->target_addr(i));
      if (b != calls_by_addr_.end()) {
        b->second.erase(id);
        if (b->second.empty()) calls_by_addr_.erase(b);
      }
    }
  }
  calls_.erase(it);
}

std::shared_ptr<Inbox> Node::actor_inbox(const std::string& name) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = actors_.find(name);
  return it == actors_.end() ? nullptr : it->second;
}

void Node::remove_actor(const std::string& name) {
  std::shared_ptr<Inbox> box;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = actors_.find(name);
    if (it == actors_.end()) return;
    box = it->second;
    actors_.erase(it);
    if (removed_actors_.size() > 10000) removed_actors_.clear();
    removed_actors_.insert(name);
  }
  box->close();
  // Calls queued behind the stop get an answer instead of waiting forever.
  while (auto m = box->pop(0))
    if (m->header.kind == Kind::Call && m->header.corr)
      reply(*m, false, error_body(ErrorKind::NoActor, "no actor named '" + name + "' on this proc (it was stopped)"), {});
}

void Node::fail_calls_to(const std::string& addr, const json& error) {
  std::vector<std::shared_ptr<Call>> calls;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto b = calls_by_addr_.find(addr);
    if (b == calls_by_addr_.end()) return;
    for (auto id : b->second) {
      auto it = calls_.find(id);
      if (it != calls_.end())
        if (auto c = it->second.lock()) calls.push_back(c);
    }
  }
  for (auto& c : calls) {
    c->fail_addr(addr, error);
    if (c->done()) forget_call(c->id());
  }
}

void Node::mark_dead(const std::string& addr, const json& error) {
  std::shared_ptr<OutPeer> peer;
  {
    std::lock_guard<std::mutex> g(mu_);
    dead_[addr] = error;
    subscribers_.erase(addr);
    auto it = out_.find(addr);
    if (it != out_.end()) {
      peer = it->second;
      out_.erase(it);
    }
  }
  if (peer) {
    // Nothing more goes to a dead peer: drop its queue and stop reconnecting to it.
    std::lock_guard<std::mutex> g(peer->mu);
    if (peer->sock) {
      peer->sock->set(zmq::sockopt::linger, 0);
      peer->sock.reset();
    }
  }
  fail_calls_to(addr, error);
}

void Node::revive(const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  dead_.erase(addr);
}

bool Node::is_dead(const std::string& addr, json* error) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = dead_.find(addr);
  if (it == dead_.end()) return false;
  if (error) *error = it->second;
  return true;
}

void Node::add_supervision_subscriber(const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  subscribers_.insert(addr);
}

void Node::remove_supervision_subscriber(const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  subscribers_.erase(addr);
}

void Node::watch_host(const std::string& hostd_addr) {
  std::lock_guard<std::mutex> g(mu_);
  auto& w = hosts_[hostd_addr];
  w.last_ack_ms = now_ms();
  w.dead = false;
}

void Node::unwatch_host(const std::string& hostd_addr) {
  std::lock_guard<std::mutex> g(mu_);
  hosts_.erase(hostd_addr);
}

void Node::add_dependent(const std::string& hostd_addr, const std::string& proc_addr) {
  std::lock_guard<std::mutex> g(mu_);
  hosts_[hostd_addr].dependents.insert(proc_addr);
}

std::string Node::peer_addr(const std::string& identity) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = in_.find(identity);
  return it == in_.end() ? "" : it->second.addr;
}

NodeStats Node::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  NodeStats s = stats_;
  s.peers = in_.size();
  return s;
}

void Node::send_refusal(const std::string& to_addr, const std::string& reason) {
  if (to_addr.rfind("ipc://", 0) != 0 && to_addr.rfind("tcp://", 0) != 0) return;
  try {
    zmq::socket_t s(ctx_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 500);
    s.set(zmq::sockopt::routing_id, id_);
    s.connect(to_addr);
    Header h;
    h.kind = Kind::Refuse;
    h.sender = id_;
    h.incarnation = incarnation_;
    h.body = {{"reason", reason}, {"addr", addr_}};
    auto bytes = encode_header(h);
    zmq::message_t m(bytes.data(), bytes.size());
    (void)s.send(m, zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
  }
}

void Node::io_loop() {
  int64_t poll_ms = std::max<int64_t>(10, std::min<int64_t>(100, heartbeat_ms_ / 2));
  int64_t next_tick = 0;
  // A blocking receive with a timeout costs fewer system calls than zmq_poll per message.
  router_->set(zmq::sockopt::rcvtimeo, static_cast<int>(poll_ms));
  while (!stopping_) {
    std::vector<zmq::message_t> parts;
    zmq::recv_result_t r;
    try {
      r = zmq::recv_multipart(*router_, std::back_inserter(parts));
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      r = std::nullopt;  // EINTR and the like: go round again
    }
    if (r) handle_frames(parts);
    // Timers at most every poll_ms, not after every message.
    int64_t now = now_ms();
    if (now >= next_tick) {
      next_tick = now + poll_ms;
      {
        std::lock_guard<std::mutex> g(mu_);
        if (!gone_addrs_.empty()) forget_gone_peers();
      }
      tick_heartbeats();
      expire_waiting_for_actor();
    }
  }
}

void Node::expire_waiting_for_actor() {
  std::vector<Message> expired;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (waiting_for_actor_.empty()) return;
    int64_t now = now_ms();
    for (auto it = waiting_for_actor_.begin(); it != waiting_for_actor_.end();) {
      if (it->second.deadline_ms <= now) {
        for (auto& m : it->second.msgs) expired.push_back(std::move(m));
        it = waiting_for_actor_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& m : expired)
    if (m.header.kind == Kind::Call && m.header.corr)
      reply(m, false,
            error_body(ErrorKind::NoActor, "no actor named '" + m.header.actor + "' on this proc (it was never spawned here)"),
            {});
}

void Node::handle_frames(std::vector<zmq::message_t>& parts) {
  if (parts.size() < 2) {
    std::lock_guard<std::mutex> g(mu_);
    ++stats_.malformed;
    return;
  }
  std::string identity = parts[0].to_string();
  std::string error;
  auto h = decode_header(parts[1].data(), parts[1].size(), error);
  if (!h) {
    std::lock_guard<std::mutex> g(mu_);
    ++stats_.malformed;
    if (stats_.malformed <= 5) log_diag(role_, "dropped a malformed message: " + error);
    return;
  }
  Message m;
  m.header = std::move(*h);
  m.peer_identity = identity;
  m.frames.reserve(parts.size() - 2);
  for (size_t i = 2; i < parts.size(); ++i) m.frames.push_back(std::move(parts[i]));

  InPeer* in = &in_peer(identity);
  if (in->refused) return;
  if (!in->authed) {
    if (m.header.kind == Kind::Hello) {
      handle_hello(*in, identity, m);
    } else if (m.header.kind == Kind::Refuse) {
      const json& b = m.header.body;
      std::string reason = b.is_object() && b.contains("reason") && b["reason"].is_string()
                               ? b["reason"].get<std::string>()
                               : std::string("connection refused");
      std::string who = b.is_object() && b.contains("addr") && b["addr"].is_string() ? b["addr"].get<std::string>() : "";
      if (!who.empty()) mark_dead(who, error_body(ErrorKind::Refused, reason));
      m.sender_addr = who;
      control_.push(std::move(m));
    } else {
      std::lock_guard<std::mutex> g(mu_);
      ++stats_.rejected;
      if (stats_.rejected <= 5)
        log_diag(role_, std::string("dropped a '") + kind_name(m.header.kind) +
                            "' message from a peer that has not authenticated");
    }
    return;
  }
  auto verdict = in->seq.accept(m.header.incarnation, m.header.seq);
  if (verdict == SeqTracker::Duplicate) {
    std::lock_guard<std::mutex> g(mu_);
    ++stats_.duplicates;
    return;
  }
  if (verdict == SeqTracker::Gap) {
    std::lock_guard<std::mutex> g(mu_);
    ++stats_.gaps;
  }
  m.sender_addr = in->addr;
  dispatch(*in, std::move(m));
}

Node::InPeer& Node::in_peer(const std::string& identity) {
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
        ++stats_.evicted;
      }
    }
    pending_peers_ = 0;
  }
  ++pending_peers_;
  return in_[identity];
}

void Node::forget_peer(const std::string& addr) {
  if (addr.empty()) return;
  std::lock_guard<std::mutex> g(mu_);
  gone_addrs_.push_back(addr);
}

void Node::forget_gone_peers() {
  std::set<std::string> gone(gone_addrs_.begin(), gone_addrs_.end());
  gone_addrs_.clear();
  for (auto e = in_.begin(); e != in_.end();) {
    if (e->second.authed && gone.count(e->second.addr))
      e = in_.erase(e);
    else
      ++e;
  }
}

void Node::handle_hello(InPeer& in, const std::string& identity, const Message& m) {
  (void)identity;
  const json& b = m.header.body;
  auto str = [&](const char* k) {
    return b.is_object() && b.contains(k) && b[k].is_string() ? b[k].get<std::string>() : std::string();
  };
  std::string addr = str("addr"), role = str("role"), version = str("version");
  int proto = b.is_object() && b.contains("proto") && b["proto"].is_number_integer() ? b["proto"].get<int>() : -1;
  std::string reason;
  if (proto != protocol_version()) {
    reason = "the " + (role.empty() ? std::string("peer") : role) + " at " + addr + " runs xmesh " +
             (version.empty() ? "?" : version) + " (protocol " + std::to_string(proto) + "); this " + role_ +
             " runs xmesh " + version_string() + " (protocol " + std::to_string(protocol_version()) +
             "): connection refused";
  } else {
    std::lock_guard<std::mutex> g(mu_);
    if (!accepted_cookies_.count(str("cookie")))
      reason = "the " + role_ + " at " + addr_ + " rejected the credentials of the " + role +
               " at " + addr + " (wrong or missing cookie): connection refused";
  }
  if (!reason.empty()) {
    in.refused = true;
    {
      std::lock_guard<std::mutex> g(mu_);
      ++stats_.rejected;
    }
    log_diag(role_, reason);
    send_refusal(addr, reason);
    return;
  }
  std::string reply_cookie = str("reply_cookie");
  std::lock_guard<std::mutex> g(mu_);
  in.authed = true;
  if (pending_peers_ > 0) --pending_peers_;
  in.addr = addr;
  in.node_id = m.header.sender;
  in.seq.accept(m.header.incarnation, m.header.seq);
  if (!addr.empty() && !reply_cookie.empty()) peer_cookies_.emplace(addr, reply_cookie);
}

void Node::refuse_calls_from(const std::string& addr, const json& error) {
  std::lock_guard<std::mutex> g(mu_);
  refused_callers_[addr] = error;
  any_refused_ = true;
}

bool Node::refused_caller(const Message& m) {
  if (!any_refused_.load()) return false;
  Kind k = m.header.kind;
  if (k != Kind::Call && k != Kind::SpawnActor && k != Kind::StopActor) return false;
  json error;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = refused_callers_.find(m.sender_addr);
    if (it == refused_callers_.end()) return false;
    error = it->second;
  }
  if (m.header.corr) reply(m, false, std::move(error), {});
  return true;
}

void Node::on(Kind kind, Handler handler) {
  if (running_) throw std::logic_error("Node::on: register handlers before start()");
  std::lock_guard<std::mutex> g(mu_);
  handlers_[static_cast<int>(kind)] = std::move(handler);
}

// The node's own concerns: replies complete their calls (transport), actor messages reach the
// actor directory, supervision notices mark addresses dead, DumpStacks is answered here.
void Node::register_builtin_handlers() {
  handlers_[static_cast<int>(Kind::Reply)] = [this](Message& m) { on_reply(m); };
  handlers_[static_cast<int>(Kind::Call)] = [this](Message& m) { on_actor_message(m); };
  handlers_[static_cast<int>(Kind::StopActor)] = [this](Message& m) { on_actor_message(m); };
  handlers_[static_cast<int>(Kind::SpawnActor)] = [this](Message& m) { on_spawn_actor(m); };
  handlers_[static_cast<int>(Kind::Log)] = [this](Message& m) { logs_.push(std::move(m)); };
  handlers_[static_cast<int>(Kind::ProcExited)] = [this](Message& m) { on_proc_exited(m); };
  handlers_[static_cast<int>(Kind::PeerDead)] = [this](Message& m) { on_peer_dead(m); };
  handlers_[static_cast<int>(Kind::DumpStacks)] = [this](Message& m) { on_dump_stacks(m); };
  handlers_[static_cast<int>(Kind::HeartbeatAck)] = [this](Message& m) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = hosts_.find(m.sender_addr);
    if (it != hosts_.end()) it->second.last_ack_ms = now_ms();
  };
}

// Every authenticated message: its kind's handler, or the control inbox.
void Node::dispatch(InPeer& in, Message m) {
  (void)in;
  Handler* handler = nullptr;
  {
    std::lock_guard<std::mutex> g(mu_);
    ++stats_.received;
    auto it = handlers_.find(static_cast<int>(m.header.kind));
    if (it != handlers_.end()) handler = &it->second;  // entries are never erased
  }
  if (refused_caller(m)) return;
  if (handler)
    (*handler)(m);
  else
    control_.push(std::move(m));
}

void Node::on_reply(Message& m) {
  std::shared_ptr<Call> c;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = calls_.find(m.header.corr);
    if (it != calls_.end()) c = it->second.lock();
  }
  if (!c) return;  // a late reply for a forgotten call
  CallResult r;
  r.index = m.header.index;
  r.ok = m.header.ok;
  r.body = std::move(m.header.body);
  r.frames = std::move(m.frames);
  c->deliver(std::move(r));
  if (c->done()) forget_call(c->id());
}

void Node::on_actor_message(Message& m) {
  auto box = actor_inbox(m.header.actor);
  if (box && box->push(std::move(m))) return;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!box && !removed_actors_.count(m.header.actor)) {
      auto& w = waiting_for_actor_[m.header.actor];
      if (w.msgs.empty()) w.deadline_ms = now_ms() + actor_wait_ms_;
      w.msgs.push_back(std::move(m));
      return;
    }
  }
  if (m.header.kind == Kind::Call && m.header.corr)
    reply(m, false,
          error_body(ErrorKind::NoActor,
                     "no actor named '" + m.header.actor + "' on this proc (it was stopped or never spawned)"),
          {});
}

void Node::on_spawn_actor(Message& m) {
  std::shared_ptr<Inbox> box;
  bool exists = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = actors_.find(m.header.actor);
    if (it != actors_.end()) {
      exists = true;
    } else {
      box = std::make_shared<Inbox>();
      actors_[m.header.actor] = box;
    }
  }
  if (exists) {
    if (m.header.corr)
      reply(m, false,
            error_body(ErrorKind::Spawn, "an actor named '" + m.header.actor + "' already exists on this proc"), {});
    return;
  }
  Message notice;
  notice.header = m.header;
  notice.sender_addr = m.sender_addr;
  std::string name = m.header.actor;
  box->push(std::move(m));
  {
    std::lock_guard<std::mutex> g(mu_);
    auto w = waiting_for_actor_.find(name);
    if (w != waiting_for_actor_.end()) {
      for (auto& held : w->second.msgs) box->push(std::move(held));
      waiting_for_actor_.erase(w);
    }
  }
  actor_events_.push(std::move(notice));
}

template <class Body>
bool Node::typed_body(const Message& m, Body& out) {
  try {
    out = m.header.body.get<Body>();
    return true;
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> g(mu_);
    ++stats_.malformed;
    log_diag(role_, std::string("dropped a malformed '") + kind_name(m.header.kind) + "' message: " + e.what());
    return false;
  }
}

void Node::on_proc_exited(Message& m) {
  ProcExitedBody exited;
  if (!typed_body(m, exited)) return;
  json err = error_body(ErrorKind::Supervision, exited.text);
  err["info"] = m.header.body;
  mark_dead(exited.addr, err);
  forget_peer(exited.addr);  // the process ended: its connections will say nothing more
  std::set<std::string> subs;
  {
    std::lock_guard<std::mutex> g(mu_);
    subs = subscribers_;
  }
  for (auto& s : subs) {
    Header h;
    h.kind = Kind::PeerDead;
    h.body = PeerDeadBody{exited.addr, err, false};
    try {
      send(s, std::move(h), {});
    } catch (const SendError&) {
    }
  }
  control_.push(std::move(m));
}

void Node::on_peer_dead(Message& m) {
  PeerDeadBody dead;
  if (!typed_body(m, dead)) return;
  mark_dead(dead.addr, dead.error);
  forget_peer(dead.addr);
  control_.push(std::move(m));
}

void Node::on_dump_stacks(Message& m) {
  StackDumper dumper;
  {
    std::lock_guard<std::mutex> g(mu_);
    dumper = stack_dumper_;
  }
  if (!m.header.corr) return;
  if (!dumper) {
    reply(m, false, error_body(ErrorKind::NoStacks, "this process cannot dump its stacks"), {});
    return;
  }
  reply(m, true, dumper(), {});
}

void Node::tick_heartbeats() {
  int64_t hb_ms = heartbeat_ms_;
  int64_t timeout_ms = hostd_timeout_ms_;
  int64_t now = now_ms();
  std::vector<std::string> due;
  std::vector<std::pair<std::string, std::set<std::string>>> lost;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& kv : hosts_) {
      auto& w = kv.second;
      if (w.dead) continue;
      if (now - w.last_ack_ms > timeout_ms) {
        w.dead = true;
        lost.emplace_back(kv.first, w.dependents);
        continue;
      }
      if (now - w.last_sent_ms >= hb_ms) {
        w.last_sent_ms = now;
        due.push_back(kv.first);
      }
    }
  }
  for (auto& a : due) {
    Header h;
    h.kind = Kind::Heartbeat;
    try {
      send(a, std::move(h), {});
    } catch (const SendError&) {
    }
  }
  for (auto& l : lost)
    fail_host(l.first, l.second,
              "host agent at " + l.first + " stopped answering heartbeats for " + std::to_string(timeout_ms) + " ms");
}

void Node::lose_host(const std::string& hostd_addr, const std::string& text) {
  std::set<std::string> dependents;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = hosts_.find(hostd_addr);
    if (it != hosts_.end()) {
      if (it->second.dead) return;  // already failed (heartbeats)
      it->second.dead = true;
      dependents = it->second.dependents;
    }
  }
  fail_host(hostd_addr, dependents, text);
}

void Node::fail_host(const std::string& hostd_addr, const std::set<std::string>& dependents, const std::string& text) {
  json err = error_body(ErrorKind::Supervision, text);
  mark_dead(hostd_addr, err);
  for (auto& d : dependents) mark_dead(d, err);
  Message m;
  m.header.kind = Kind::PeerDead;
  m.header.sender = id_;
  m.header.body = PeerDeadBody{hostd_addr, err, true};
  control_.push(std::move(m));
}

}  // namespace xmesh
