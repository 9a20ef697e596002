#include "node.hpp"

#include <pthread.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

#include "bodies.hpp"
#include "link_bodies.hpp"
#include "node_bodies.hpp"
#include "util.hpp"

namespace xmesh {

// The feed of the actors' inboxes: an idle actor thread reads the rings itself and sleeps on the
// node's doorbell with a bit of its own, so that a call on a ring wakes the thread that runs it.
class Node::RingFeed : public WaitFeed {
 public:
  explicit RingFeed(Node& node) : node_(&node) {}
  bool live() const override { return node_.load() != nullptr; }
  uint32_t seq() override { return node_.load() ? readers().seq() : 0; }
  void pump() override {
    if (Node* n = node_.load()) n->pump_rings(nullptr);
  }
  void sleep(uint32_t bit, uint32_t seen, int timeout_ms, const std::function<bool()>& still_idle) override {
    if (node_.load()) readers().sleep_idle(bit, seen, timeout_ms, still_idle);
  }
  void wake(uint32_t bit) override {
    if (node_.load()) readers().wake(bit);
  }
  void awake(bool on) override {
    if (node_.load()) readers().awake(on);
  }
  // The node stops: waiters still holding this feed wait the usual way.
  void detach() { node_ = nullptr; }

 private:
  RingReaders& readers() { return node_.load()->transport_.ring_readers(); }
  std::atomic<Node*> node_;
};

Node::Node(std::string role, std::string bind_addr, std::string accept_cookie, std::string key_file,
           std::string advertise)
    : order_gate_(env_int("XMESH_ORDER_WAIT_MS", 10000)),
      transport_(std::move(role), bind_addr, accept_cookie, key_file, advertise),
      supervision_(env_int("XMESH_HEARTBEAT_MS", 1000), env_int("XMESH_HOSTD_TIMEOUT_MS", 4000)),
      actors_(env_int("XMESH_ACTOR_WAIT_MS", 10000)) {
  register_builtin_handlers();
  transport_.set_link_break_handler([this](const Transport::LinkBreak& b, const Header& sending) {
    if (!b.closed) return ring_broke(b.peer, b.token, b.why, BreakFound::by_sender, &sending);
    // Its reader closed it: stopping (supervision speaks), or it found garbage and its
    // RingBroken, naming this ring, follows. The message goes over ZeroMQ meanwhile.
    transport_.set_closed_ring_aside(b.peer, b.token);
    return !supervision_.is_dead(b.peer);
  });
  inbox_limit_ = static_cast<size_t>(std::max<int64_t>(1, env_int("XMESH_INBOX_LIMIT", 10000)));
  if (transport_.ring_readers().enabled()) {  // a controller or a proc (Transport: XMESH_RINGS)
    ring_feed_ = std::make_shared<RingFeed>(*this);
    actors_.feed_inboxes_from(ring_feed_);
  }
}

Node::~Node() { stop(); }

void Node::start() {
  if (running_.exchange(true)) return;
  io_ = runtime_thread([this] {
    pthread_setname_np(pthread_self(), "xmesh-io");  // shows in top -H, perf, gdb
    io_thread_id_ = std::this_thread::get_id();
    io_loop();
  });
  if (transport_.ring_readers().enabled())
    rings_ = runtime_thread([this] {
      pthread_setname_np(pthread_self(), "xmesh-rings");
      rings_thread_id_ = std::this_thread::get_id();
      rings_loop();
    });
}

void Node::stop() {
  if (stopping_.exchange(true)) return;
  if (io_.joinable()) io_.join();
  transport_.ring_readers().wake();
  if (rings_.joinable()) rings_.join();
  deferred_.stop();
  {
    std::lock_guard<std::mutex> g(relay_start_mu_);
    if (relay_.joinable()) relay_.join();
  }
  running_ = false;
  control_.close();
  logs_.close();
  actor_events_.close();
  actors_.close_all();  // wakes actor threads asleep on the feed, which then wait the usual way
  if (ring_feed_) ring_feed_->detach();
  transport_.close();
}

bool Node::mine(const std::string& a) const { return a == addr() || (!a.empty() && a == transport_.tcp_addr()); }

void Node::forget_peer(const std::string& addr) {
  transport_.forget_peer(addr);
  transport_.disconnect(addr);
}
NodeStats Node::stats() const {
  NodeStats s = transport_.stats();
  if (router_) router_->add_stats(s);
  s.order_held = order_gate_.held();
  s.order_late = order_gate_.late();
  s.order_dropped = order_gate_.dropped();
  s.deferred = deferred_.pushed();
  return s;
}

void Node::set_stack_dumper(StackDumper dumper) {
  std::lock_guard<std::mutex> g(dumper_mu_);
  stack_dumper_ = std::move(dumper);
}

// ---- sending ---------------------------------------------------------------------------------
void Node::send(const std::string& to, Header h, std::vector<zmq::message_t> frames) {
  send_waiting(to, h, frames, may_block());
}

void Node::send_if_ready(const std::string& to, Header h, std::vector<zmq::message_t> frames) {
  send_waiting(to, h, frames, false);
}

void Node::send_waiting(const std::string& to, Header& h, std::vector<zmq::message_t>& frames, bool blocking) {
  transport_.check_size(frames);
  std::string routed;
  const std::string& addr = transport_.route(to, routed);
  json err;
  if (supervision_.is_dead(addr, &err))
    throw SendError("peer " + addr + " is dead: " + err.value("text", std::string("unknown")));
  transport_.send(addr, h, frames, blocking);
}

namespace {
// Actor messages: numbered per destination and taken in that order there (order.hpp).
bool ordered_kind(Kind k) { return k == Kind::Call || k == Kind::StopActor || k == Kind::SpawnActor; }
}  // namespace

std::shared_ptr<Call> Node::call(const std::vector<Target>& targets, Header tmpl, std::vector<zmq::message_t> frames,
                                 bool expect_reply) {
  transport_.check_size(frames);
  std::vector<std::string> addrs;
  addrs.reserve(targets.size());
  std::string routed;
  for (auto& t : targets) addrs.push_back(transport_.route(t.addr, routed));
  auto c = std::make_shared<Call>(calls_.next_id(), addrs);
  if (ring_feed_) c->fed_by(ring_feed_);
  std::vector<bool> dead(targets.size(), false);
  auto dead_now = supervision_.dead_among(addrs);
  for (auto& [i, error] : dead_now) dead[i] = true;
  const bool ordered = ordered_kind(tmpl.kind);
  std::vector<CastTarget> direct = number_targets(targets, addrs, dead, ordered);
  CallRouter::Route route;
  if (router_ && ordered) route = router_->plan(direct);
  const auto& tree = route.targets;
  if (!tree.empty() && expect_reply) {  // supervision fails what is behind a relay that dies
    std::vector<int32_t> parents(targets.size(), -1);
    std::vector<uint64_t> oseqs(targets.size(), 0);
    for (size_t p = 0; p < tree.size(); ++p) {
      const int32_t relay = route.relay_of[p];
      parents[tree[p].index] = relay < 0 ? -1 : static_cast<int32_t>(tree[static_cast<size_t>(relay)].index);
      oseqs[tree[p].index] = tree[p].oseq;
    }
    c->set_tree(std::move(parents), std::move(oseqs));
  }
  if (expect_reply) calls_.add(c);
  for (auto& [i, error] : dead_now) {  // targets already dead fail at once
    CallResult r;
    r.index = static_cast<int64_t>(i);
    r.body = std::move(error);
    c->deliver(std::move(r));
  }
  tmpl.corr = expect_reply ? c->id() : 0;  // no correlation id: nobody waits for an answer
  {
    // The first answers may come while later targets are still sent to: this thread reads
    // them itself (it is about to wait for them) rather than have them wake another.
    AwakeOnFeed awake(expect_reply ? ring_feed_.get() : nullptr);
    for (auto& t : direct) send_direct(*c, t, tmpl, frames);
    if (!tree.empty()) router_->send(c, route, tmpl, frames);
  }
  if (expect_reply && c->settled()) forget_call(c->id());
  return c;
}

std::shared_ptr<Call> Node::expect(const std::vector<std::string>& addrs) {
  auto c = std::make_shared<Call>(calls_.next_id(), addrs);
  if (ring_feed_) c->fed_by(ring_feed_);
  calls_.add(c);
  for (auto& [i, error] : supervision_.dead_among(addrs)) {
    CallResult r;
    r.index = static_cast<int64_t>(i);
    r.body = std::move(error);
    c->deliver(std::move(r));
  }
  return c;
}

void Node::retarget(const std::shared_ptr<Call>& c, size_t index, const std::string& addr) {
  c->set_target_addr(index, addr);
  calls_.add_addr(c->id(), addr);
  json error;
  if (supervision_.is_dead(addr, &error)) c->fail_addr(addr, error);
}

std::shared_ptr<Call> Node::local_call(std::vector<std::string> addrs) {
  return std::make_shared<Call>(calls_.next_id(), std::move(addrs));
}

std::shared_ptr<Call> Node::open_port(bool once) {
  auto c = std::make_shared<Call>(calls_.next_id(), Call::PortTag{}, once);
  if (ring_feed_) c->fed_by(ring_feed_);
  calls_.add(c);
  return c;
}

void Node::reply(const Message& call_msg, bool ok, json body, std::vector<zmq::message_t> frames) {
  if (call_msg.sender_addr.empty() || call_msg.header.corr == 0) return;  // nobody waits
  if (call_msg.gathered && router_) {  // it came through the router (a cast tree): its way back
    CallResult r;
    r.index = call_msg.header.index;
    r.ok = ok;
    if (!ok) r.body = body;
    r.frames = std::move(frames);
    try {
      transport_.check_size(r.frames);
    } catch (const SendError& e) {  // answered with the error, naming both sizes, as below
      r.ok = false;
      r.body = error_body(ErrorKind::Send, std::string("result could not be sent: ") + e.what());
      r.frames.clear();
    }
    if (router_->carry_reply(call_msg, r)) return;
    frames = std::move(r.frames);  // its way is gone: straight to the origin
  }
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

void Node::forget_call(uint64_t id) { calls_.forget(id); }

// ---- the actor directory ---------------------------------------------------------------------
void Node::remove_actor(const std::string& name, const json& tombstone) {
  auto box = actors_.remove(name, tombstone);
  if (!box) return;
  // Calls queued behind the stop get an answer instead of waiting forever.
  while (auto m = box->pop(0)) answer_no_actor(*m, "it was stopped");
}

void Node::answer_no_actor(const Message& m, const std::string& why) {
  if (!m.header.corr) return;
  if (m.header.kind == Kind::StopActor) {  // a stop of an actor already gone: it is stopped
    reply(m, true, nullptr, {});
    return;
  }
  if (m.header.kind != Kind::Call) return;
  if (auto stone = actors_.tombstone(m.header.actor)) {
    reply(m, false, std::move(*stone), {});
    return;
  }
  reply(m, false, error_body(ErrorKind::NoActor, "no actor named '" + m.header.actor + "' on this proc (" + why + ")"),
        {});
}

void Node::expire_waiting_for_actor() {
  for (auto& m : actors_.expire(now_ms())) answer_no_actor(m, "it was never spawned here");
}

// ---- supervision -----------------------------------------------------------------------------
void Node::fail_calls_to(const std::string& addr, const json& error, uint64_t spare) {
  std::vector<std::pair<std::string, uint64_t>> behind;  // targets whose relay was addr
  for (auto& c : calls_.to_addr(addr)) {
    if (c->id() == spare) continue;
    c->fail_addr(addr, error, &behind);
    if (c->settled()) forget_call(c->id());
  }
  if (router_) router_->peer_failed(addr);  // answers that were to go up through addr go around it
  if (behind.empty()) return;
  std::vector<CastTarget> lost;
  for (auto& [a, oseq] : behind) lost.push_back(CastTarget{a, "", 0, oseq, ""});
  tell_lost(lost, id());  // they need not wait for what did not come through it
}

void Node::mark_dead(const std::string& addr, const json& error) {
  supervision_.mark_dead(addr, error);
  {
    std::lock_guard<std::mutex> g(oseq_mu_);
    oseq_out_.erase(addr);
  }
  fail_calls_to(addr, error);  // first: a send that the disconnect ends fails with this error, not its own
  for (auto& p : parts_) p->peer_dead(addr);
  transport_.disconnect(addr);
}


void Node::tick_heartbeats() {
  auto tick = supervision_.tick(now_ms());
  for (auto& a : tick.heartbeats_due) {
    Header h;
    h.kind = Kind::Heartbeat;
    try {
      send(a, std::move(h), {});  // on the I/O thread: never waits on a dead link
    } catch (const SendError&) {
    }
  }
  for (auto& l : tick.lost) fail_host(l.host, l.dependents, l.reason);
}

void Node::lose_host(const std::string& hostd_addr, const std::string& text) {
  auto dependents = supervision_.lose_host(hostd_addr);
  if (dependents) fail_host(hostd_addr, *dependents, text);
}

void Node::fail_host(const std::string& hostd_addr, const std::set<std::string>& dependents, const std::string& text) {
  json err = error_body(ErrorKind::Supervision, text);
  mark_dead(hostd_addr, err);
  for (auto& d : dependents) mark_dead(d, err);
  // Procs that subscribed hear of each proc lost with the host, as of one that exited.
  for (auto& s : supervision_.subscribers()) {
    for (auto& d : dependents) {
      try {
        send(s, PeerDeadBody{d, err, false});
      } catch (const SendError&) {
      }
    }
  }
  Message m;
  m.header.kind = Kind::PeerDead;
  m.header.sender = id();
  m.header.body = PeerDeadBody{hostd_addr, err, true};
  control_.push(std::move(m));
}

// ---- the I/O thread --------------------------------------------------------------------------
void Node::io_loop() {
  int64_t poll_ms = std::max<int64_t>(10, std::min<int64_t>(100, supervision_.heartbeat_ms() / 2));
  int64_t next_tick = 0;
  // A blocking receive with a timeout costs fewer system calls than zmq_poll per message.
  while (!stopping_) {
    try {
      if (auto r = transport_.receive(static_cast<int>(poll_ms))) {
        if (r->refusal)
          on_refusal(r->msg, *r->refusal);
        else if (r->too_large)
          on_too_large(r->msg, r->payload_bytes, r->sender_limit);
        else
          dispatch(std::move(r->msg));
      }
      if (router_ && router_->holding() && !transport_.input_pending()) router_->flush();  // what came together goes together
      for (auto& addr : transport_.take_successors()) supervision_.revive(addr);  // a new process there
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
    }
    // Timers at most every poll_ms, not after every message.
    int64_t now = now_ms();
    if (now >= next_tick) {
      next_tick = now + poll_ms;
      for (auto& refusal : transport_.tidy()) {  // peers that refused this node's handshake
        Message m;
        m.header.kind = Kind::Refuse;
        m.header.sender = id();
        m.header.body = refusal;
        m.sender_addr = refusal.addr;
        on_refusal(m, refusal);
      }
      tick_heartbeats();
      expire_waiting_for_actor();
      expire_order_waits();
      if (router_) router_->flush();
    }
  }
}

thread_local bool Node::pumping_ = false;

size_t Node::pump_rings(bool* held) {
  auto deliver = [this](Message& m) {
    if (!has_room(m)) return false;
    try {
      dispatch(std::move(m));
    } catch (const std::exception& e) {  // a handler's failure never ends the reading
      log_diag(role(), std::string("a message from a shared-memory link failed: ") + e.what());
    }
    return true;
  };
  RingReaders::Report report;
  bool was_pumping = pumping_;
  pumping_ = true;  // handlers run here never wait in a send (as on the I/O thread)
  auto delivered = transport_.ring_readers().poll(deliver, report);
  pumping_ = was_pumping;
  if (delivered && router_) router_->flush();
  for (auto& b : report.broken) {
    transport_.count_malformed("the ring from " + b.addr + " was closed: " + b.why);
    ring_broke(b.addr, b.token, b.why, BreakFound::by_reader);
  }
  for (auto& t : report.too_large) {
    transport_.count_too_large();
    on_too_large(t.msg, t.payload_bytes, t.sender_limit);
  }
  if (held) *held = report.held;
  return delivered;
}

void Node::rings_loop() {
  while (!stopping_) {
    bool held = false;
    // A held message waits for its actor to take what it has: looked at again every ms.
    if (pump_rings(&held) == 0) transport_.ring_readers().wait(held ? 1 : 100);
  }
}

bool Node::has_room(const Message& m) const {
  if (m.header.kind != Kind::Call && m.header.kind != Kind::StopActor) return true;
  if (deferred_.size() >= inbox_limit_) return false;  // a relay's forwards wait: hold its senders back
  auto box = actors_.inbox(m.header.actor);
  return !box || box->queued() < inbox_limit_;
}

void Node::on(Kind kind, Handler handler) {
  if (running_) throw std::logic_error("Node::on: register handlers before start()");
  handlers_[static_cast<int>(kind)] = std::move(handler);
}

// The node's own concerns: replies complete their calls, actor messages reach the actor
// directory, supervision notices mark addresses dead, DumpStacks is answered here.
void Node::register_builtin_handlers() {
  handlers_[static_cast<int>(Kind::Reply)] = [this](Message& m) { on_reply(m); };
  handlers_[static_cast<int>(Kind::Call)] = [this](Message& m) { on_actor_message(m); };
  handlers_[static_cast<int>(Kind::StopActor)] = [this](Message& m) { on_actor_message(m); };
  handlers_[static_cast<int>(Kind::SpawnActor)] = [this](Message& m) { on_spawn_actor(m); };
  handlers_[static_cast<int>(Kind::Log)] = [this](Message& m) { logs_.push(std::move(m)); };
  handlers_[static_cast<int>(Kind::ProcExited)] = [this](Message& m) { on_proc_exited(m); };
  handlers_[static_cast<int>(Kind::PeerDead)] = [this](Message& m) { on_peer_dead(m); };
  handlers_[static_cast<int>(Kind::DumpStacks)] = [this](Message& m) { on_dump_stacks(m); };
  handlers_[static_cast<int>(Kind::CastLost)] = [this](Message& m) { on_cast_lost(m); };
  handlers_[static_cast<int>(Kind::RingBroken)] = [this](Message& m) { on_ring_broken(m); };
  // The link upgrades' own messages (rings, lanes): the transport's, dispatched here in order.
  for (Kind k : transport_.link_message_kinds()) {
    handlers_[static_cast<int>(k)] = [this](Message& m) { transport_.on_link_message(m); };
    link_kinds_.insert(k);
  }
  handlers_[static_cast<int>(Kind::HeartbeatAck)] = [this](Message& m) {
    if (!supervision_.heartbeat_acked(m.sender_addr, m.header.incarnation))
      lose_host(m.sender_addr, "the host agent at " + m.sender_addr +
                                   " restarted: the procs it ran ended with its previous process");
  };
}

// Every authenticated message, in order: its kind's handler, or the control inbox. The registry
// is only read once the I/O thread runs, so it needs no lock.
void Node::dispatch(Message m) {
  if (ordered_kind(m.header.kind)) {
    if (m.header.body.is_object() && m.header.body.contains("cast") && !(router_ ? router_->take(m) : refuse_relay(m))) {
      if (m.header.oseq)  // its number is passed: what follows it from its sender is not held for it
        dispatch_released([&] { return order_gate_.skip(m.header.sender, {m.header.oseq}); });
      return;
    }
    if (m.header.oseq) {
      const std::string origin = m.header.sender;  // not read after m moved into the gate
      dispatch_released([&] { return order_gate_.admit(origin, std::move(m)); });
      return;
    }
  }
  dispatch_now(std::move(m));
}

// A peer this node declared dead (its proc exited, its host was lost, it refused us) is fenced:
// what it still sends (a partition that healed, late output) is dropped, so ranks whose failure
// was reported never act again here. Heartbeat acks and the links' own messages pass (they say
// nothing of the program). A peer revived (an agent used again, one restarted) is heard again.
bool Node::fenced(const Message& m) {
  if (m.sender_addr.empty() || m.header.kind == Kind::HeartbeatAck || link_kinds_.count(m.header.kind)) return false;
  json why;
  if (!supervision_.is_dead(m.sender_addr, &why)) return false;
  const std::string text = why.is_object() && why.contains("text") && why["text"].is_string()
                               ? why["text"].get<std::string>() : std::string("it was declared dead");
  log_fenced(text, "ignoring '" + std::string(kind_name(m.header.kind)) + "' messages from " + m.sender_addr +
                       ", declared lost earlier: " + text);
  return true;
}

void Node::log_fenced(const std::string& loss, const std::string& text) {
  std::lock_guard<std::mutex> g(fenced_logs_mu_);
  if (fenced_logs_.size() >= 256 && !fenced_logs_.count(loss)) fenced_logs_.clear();  // bounded: a long-lived controller
  auto it = fenced_logs_.emplace(std::piecewise_construct, std::forward_as_tuple(loss), std::forward_as_tuple(1, 60000));
  log_diag_limited(it.first->second, role(), text);
}

void Node::dispatch_now(Message m) {
  if (fenced(m)) return;  // (past the order gate already: its number is not waited for)
  if (auto refusal = actors_.refusal_for(m)) {
    if (m.header.corr) reply(m, false, std::move(*refusal), {});
    return;
  }
  auto it = handlers_.find(static_cast<int>(m.header.kind));
  if (it != handlers_.end())
    it->second(m);
  else
    control_.push(std::move(m));
}

// A peer refused this node's Hello (another version, wrong credentials): calls to it fail now.
// A message over this node's size limit never vanishes: a call is answered with an error naming
// both limits (the sender's own may be larger), anything else is logged (rate-limited).
void Node::on_too_large(const Message& m, uint64_t payload_bytes, uint64_t sender_limit) {
  std::string text = "a " + std::string(kind_name(m.header.kind)) + " message of " + std::to_string(payload_bytes) +
                     " bytes from " + (m.sender_addr.empty() ? std::string("a peer") : m.sender_addr) +
                     " exceeds the maximum message size of the " + role() + " at " + addr() + ": " +
                     std::to_string(transport_.self().max_message_bytes) + " bytes (its XMESH_MAX_MESSAGE_BYTES" +
                     (sender_limit ? "; the sender's is " + std::to_string(sender_limit) + " bytes)" : ")");
  if (m.header.corr) {  // someone waits for an answer
    reply(m, false, error_body(ErrorKind::Send, text), {});
  } else {
    log_diag_limited(size_refusal_log_, role(), "dropped " + text);
  }
  // Never dispatched: its order number is passed, so its sender's next messages are not held for it.
  if (ordered_kind(m.header.kind) && m.header.oseq && !m.header.sender.empty())
    dispatch_released([&] { return order_gate_.skip(m.header.sender, {m.header.oseq}); });
}

// Calls to the refusing peer fail with the reason; the user hears of it through the control
// inbox, a few times a minute at most however many peers refuse.
void Node::on_refusal(Message& m, const RefuseBody& refusal) {
  if (!refusal.addr.empty()) mark_dead(refusal.addr, error_body(ErrorKind::Refused, refusal.reason));
  uint64_t held_back = 0;
  if (!refusal_notices_.take(&held_back)) return;
  if (held_back) {  // the user learns how many were not shown since the last one
    RefuseBody counted = refusal;
    counted.reason += " (" + std::to_string(held_back) + " more refusals were not shown)";
    m.header.body = counted;
  }
  control_.push(std::move(m));
}

void Node::on_reply(Message& m) {
  auto c = calls_.find(m.header.corr);
  if (!c) return;  // a late reply for a forgotten call
  CallResult r;
  r.index = m.header.index;
  r.ok = m.header.ok;
  r.body = std::move(m.header.body);
  r.frames = std::move(m.frames);
  c->deliver(std::move(r));
  if (c->settled()) forget_call(c->id());
}

void Node::on_actor_message(Message& m) {
  std::optional<Message> stop_notice;
  if (m.header.kind == Kind::StopActor) {  // the actor host bounds how long a busy actor delays it
    stop_notice.emplace();
    stop_notice->header = m.header;
    stop_notice->sender_addr = m.sender_addr;
  }
  if (!actors_.deliver(m)) {
    answer_no_actor(m, "it was stopped or never spawned");
    return;
  }
  if (stop_notice) actor_events_.push(std::move(*stop_notice));
}

void Node::on_spawn_actor(Message& m) {
  Message notice;
  notice.header = m.header;
  notice.sender_addr = m.sender_addr;
  if (!actors_.spawn(m)) {
    if (m.header.corr)
      reply(m, false, error_body(ErrorKind::Spawn, "an actor named '" + m.header.actor + "' already exists on this proc"),
            {});
    return;
  }
  actor_events_.push(std::move(notice));
}

void Node::note_malformed_body(const Message& m, const std::string& why) {
  transport_.count_malformed(std::string("dropped a malformed '") + kind_name(m.header.kind) + "' message: " + why);
}

void Node::on_proc_exited(Message& m) {
  ProcExitedBody exited;
  if (!typed_body(m, exited)) return;
  json err = error_body(ErrorKind::Supervision, exited.text);
  err["info"] = m.header.body;
  mark_dead(exited.addr, err);
  forget_peer(exited.addr);  // the process ended: its connections will say nothing more
  for (auto& s : supervision_.subscribers()) {
    try {
      send(s, PeerDeadBody{exited.addr, err, false});
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

// A request whose body does not read is answered saying so (its sender waits for an answer).
void Node::refuse_malformed(const Message& m, ErrorKind kind, const std::string& why) {
  reply(m, false, error_body(kind, std::string("malformed ") + kind_name(m.header.kind) + " request: " + why), {});
}

RouterHost& Node::set_router(CallRouter& router) {
  if (running_) throw std::logic_error("Node::set_router: set the router before start()");
  router_ = &router;
  return *this;
}

void Node::deliver(uint64_t corr, std::vector<CallResult> results) {
  auto c = calls_.find(corr);
  if (!c) return;  // a forgotten call
  for (auto& r : results) c->deliver(std::move(r));
  if (c->settled()) forget_call(c->id());
}

bool Node::refuse_relay(Message& m) {
  auto cast = read_as<CastBody>(m.header.body["cast"], nullptr);
  m.header.body.erase("cast");
  transport_.count_malformed("dropped a cast-tree message from " + m.sender_addr + ": this " + role() + " relays none");
  const std::string text = "not delivered: the " + role() + " at " + addr() + " relays no cast trees";
  reply(m, false, error_body(ErrorKind::Send, text), {});
  if (!cast) return false;
  // The targets behind this node get nothing: their answers say why, their numbers are passed.
  for (auto& t : cast->behind) {
    Message one;
    one.sender_addr = m.sender_addr;
    one.header.corr = m.header.corr;
    one.header.index = t.index;
    reply(one, false, error_body(ErrorKind::Send, text), {});
  }
  tell_lost(cast->behind, m.header.sender);
  return false;
}

void Node::add_part(std::unique_ptr<NodePart> part) {
  if (running_) throw std::logic_error("Node::add_part: add parts before start()");
  parts_.push_back(std::move(part));
}

void Node::on_dump_stacks(Message& m) {
  StackDumper dumper;
  {
    std::lock_guard<std::mutex> g(dumper_mu_);
    dumper = stack_dumper_;
  }
  if (!m.header.corr) return;
  if (!dumper) {
    reply(m, false, error_body(ErrorKind::NoStacks, "this process cannot dump its stacks"), {});
    return;
  }
  reply(m, true, dumper(), {});
}

}  // namespace xmesh
