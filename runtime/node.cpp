#include "node.hpp"

#include <pthread.h>
#include <unistd.h>

#include <cstring>

#include "bodies.hpp"
#include "record_cipher.hpp"
#include "tcp_endpoint.hpp"
#include "tcp_lane.hpp"
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
  transport_.set_ring_break_handler([this](const Transport::RingBreak& b, const Header& sending) {
    if (!b.closed) return ring_broke(b.peer, b.token, b.why, BreakFound::by_sender, &sending);
    // Its reader closed it: stopping (supervision speaks), or it found garbage and its
    // RingBroken, naming this ring, follows. The message goes over ZeroMQ meanwhile.
    transport_.set_closed_ring_aside(b.peer, b.token);
    return !supervision_.is_dead(b.peer);
  });
  // Controllers and procs talk to each other over shared memory on one host (ring_links.hpp);
  // host agents keep ZeroMQ alone. XMESH_RINGS=0 turns the rings off.
  inbox_limit_ = static_cast<size_t>(std::max<int64_t>(1, env_int("XMESH_INBOX_LIMIT", 10000)));
  cast_fanout_ = static_cast<size_t>(std::max<int64_t>(0, env_int("XMESH_CAST_FANOUT", 16)));
  const std::string tree_mode = env_str("XMESH_CAST_TREE", "hosts");
  if (tree_mode != "hosts" && tree_mode != "all" && tree_mode != "off")
    log_diag(transport_.role(), "XMESH_CAST_TREE=" + tree_mode + " is not one of hosts, all, off: hosts is used");
  if (tree_mode == "off") cast_fanout_ = 0;
  cast_local_ = tree_mode == "all";
  const std::string& r = transport_.role();
  if ((r == "controller" || r == "proc") && env_int("XMESH_RINGS", 1) != 0) {
    transport_.enable_rings(static_cast<size_t>(env_int("XMESH_RING_BYTES", 256 << 10)));
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
  if (transport_.rings_enabled())
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

void Node::set_peer_cookie(const std::string& addr, const std::string& cookie) {
  transport_.set_peer_cookie(addr, cookie);
}
void Node::set_default_cookie(const std::string& cookie) { transport_.set_default_cookie(cookie); }
void Node::add_accepted_cookie(const std::string& cookie) { transport_.add_accepted_cookie(cookie); }
std::string Node::peer_addr(const std::string& identity) const { return transport_.peer_addr(identity); }
void Node::forget_peer(const std::string& addr) {
  transport_.forget_peer(addr);
  transport_.disconnect(addr);
}
NodeStats Node::stats() const {
  NodeStats s = transport_.stats();
  s.relayed = relayed_.load();
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
  transport_.check_size(frames);
  std::string routed;
  const std::string& addr = transport_.route(to, routed);
  json err;
  if (supervision_.is_dead(addr, &err))
    throw SendError("peer " + addr + " is dead: " + err.value("text", std::string("unknown")));
  transport_.send(addr, h, frames, may_block());
}

namespace {
// Actor messages: numbered per destination and taken in that order there (cast_tree.hpp).
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
  std::vector<CastTarget> direct, tree;
  split_cast(targets, addrs, dead, ordered_kind(tmpl.kind), direct, tree);
  const size_t fanout = cast_fanout_.load();
  if (!tree.empty() && expect_reply) {  // supervision fails what is behind a relay that dies
    std::vector<int32_t> parents(targets.size(), -1);
    std::vector<uint64_t> oseqs(targets.size(), 0);
    auto by_position = cast_parents(tree, fanout);
    for (size_t p = 0; p < tree.size(); ++p) {
      parents[tree[p].index] = by_position[p] < 0 ? -1 : static_cast<int32_t>(tree[by_position[p]].index);
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
    if (!tree.empty()) send_tree(c, tree, tmpl, frames, fanout);
  }
  if (expect_reply && c->done()) forget_call(c->id());
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
  if (call_msg.gathered) {  // it came through a cast tree: the answer goes up the tree
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
    if (gathers_.add(call_msg.sender_addr, call_msg.header.corr, r)) {
      flush_gathers();
      return;
    }
    frames = std::move(r.frames);  // its gather is gone: straight to the origin
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
std::shared_ptr<Inbox> Node::actor_inbox(const std::string& name) { return actors_.inbox(name); }

void Node::remove_actor(const std::string& name) {
  auto box = actors_.remove(name);
  if (!box) return;
  // Calls queued behind the stop get an answer instead of waiting forever.
  while (auto m = box->pop(0)) answer_no_actor(*m, "it was stopped");
}

void Node::refuse_calls_from(const std::string& addr, const json& error) { actors_.refuse_from(addr, error); }

void Node::answer_no_actor(const Message& m, const std::string& why) {
  if (m.header.kind == Kind::Call && m.header.corr)
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
    if (c->done()) forget_call(c->id());
  }
  gathers_.reroute(addr);  // answers that were to go up through addr go to their origins
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
  buffers_.release_holder(addr);  // a reader that died mid-copy: its leases end (a dropped buffer may go)
  {
    std::lock_guard<std::mutex> g(rdma_mu_);
    rdma_links_.erase(addr);
  }
  transport_.disconnect(addr);
}

bool Node::is_dead(const std::string& addr, json* error) const { return supervision_.is_dead(addr, error); }
void Node::revive(const std::string& addr) { supervision_.revive(addr); }
void Node::add_supervision_subscriber(const std::string& addr) { supervision_.subscribe(addr); }
void Node::remove_supervision_subscriber(const std::string& addr) { supervision_.unsubscribe(addr); }
void Node::watch_host(const std::string& hostd_addr, int64_t pid, const std::string& host) {
  supervision_.watch_host(hostd_addr, pid, host);
}
void Node::unwatch_host(const std::string& hostd_addr) { supervision_.unwatch_host(hostd_addr); }
void Node::add_dependent(const std::string& hostd_addr, const std::string& proc_addr) {
  supervision_.add_dependent(hostd_addr, proc_addr);
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
  transport_.set_receive_timeout(static_cast<int>(poll_ms));
  while (!stopping_) {
    try {
      if (auto r = transport_.receive()) {
        if (r->refusal)
          on_refusal(r->msg, *r->refusal);
        else if (r->too_large)
          on_too_large(r->msg, r->payload_bytes, r->sender_limit);
        else
          dispatch(std::move(r->msg));
      }
      if (gathers_.dirty() && !transport_.input_pending()) flush_gathers();  // what came together goes up together
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
      flush_gathers();
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
  if (delivered) flush_gathers();
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
  handlers_[static_cast<int>(Kind::Replies)] = [this](Message& m) { on_replies(m); };
  handlers_[static_cast<int>(Kind::CastLost)] = [this](Message& m) { on_cast_lost(m); };
  handlers_[static_cast<int>(Kind::RingBroken)] = [this](Message& m) { on_ring_broken(m); };
  handlers_[static_cast<int>(Kind::RingOffer)] = [this](Message& m) {
    RingOfferBody offer;
    if (typed_body(m, offer)) transport_.on_ring_offer(m.sender_addr, offer);
  };
  handlers_[static_cast<int>(Kind::RingAccept)] = [this](Message& m) {
    RingAcceptBody answer;
    if (typed_body(m, answer)) transport_.on_ring_accept(m.sender_addr, answer);
  };
  handlers_[static_cast<int>(Kind::RingSwitch)] = [this](Message& m) { transport_.on_ring_switch(m.sender_addr); };
  handlers_[static_cast<int>(Kind::LaneAsk)] = [this](Message& m) { transport_.on_lane_ask(m.sender_addr); };
  handlers_[static_cast<int>(Kind::LaneOffer)] = [this](Message& m) {
    LaneOfferBody offer;
    if (typed_body(m, offer)) transport_.on_lane_offer(m.sender_addr, offer);
  };
  handlers_[static_cast<int>(Kind::BufferLease)] = [this](Message& m) { on_buffer_lease(m); };
  handlers_[static_cast<int>(Kind::BufferDrop)] = [this](Message& m) { on_buffer_drop(m); };
  handlers_[static_cast<int>(Kind::BufferRelease)] = [this](Message& m) { on_buffer_release(m); };
  handlers_[static_cast<int>(Kind::LaneSwitch)] = [this](Message& m) {
    transport_.on_lane_switch(m.sender_addr, m.peer_identity);
  };
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
    if (m.header.body.is_object() && m.header.body.contains("cast") && !take_cast(m)) {
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

void Node::dispatch_now(Message m) {
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
                     std::to_string(transport_.max_message_bytes()) + " bytes (its XMESH_MAX_MESSAGE_BYTES" +
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
  if (c->done()) forget_call(c->id());
}

void Node::on_actor_message(Message& m) {
  if (!actors_.deliver(m)) answer_no_actor(m, "it was stopped or never spawned");
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

template <class Body>
bool Node::typed_body(const Message& m, Body& out, std::string* why_out) {
  std::string why;
  auto read = read_as<Body>(m.header.body, &why);
  if (!read) {
    transport_.count_malformed(std::string("dropped a malformed '") + kind_name(m.header.kind) + "' message: " + why);
    if (why_out) *why_out = why;
    return false;
  }
  out = std::move(*read);
  return true;
}
// The notices read in node_cast.cpp and node_ring_breaks.cpp.
template bool Node::typed_body<CastLostBody>(const Message&, CastLostBody&, std::string*);
template bool Node::typed_body<RingBrokenBody>(const Message&, RingBrokenBody&, std::string*);

void Node::on_proc_exited(Message& m) {
  ProcExitedBody exited;
  if (!typed_body(m, exited)) return;
  json err = error_body(ErrorKind::Supervision, exited.text);
  err["info"] = m.header.body;
  mark_dead(exited.addr, err);
  forget_peer(exited.addr);  // the process ended: its connections will say nothing more
  for (auto& s : supervision_.subscribers()) {
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

// A request whose body does not read is answered saying so (its sender waits for an answer).
template <class Body>
bool Node::request_body(const Message& m, Body& out, ErrorKind kind) {
  std::string why;
  if (typed_body(m, out, &why)) return true;
  reply(m, false, error_body(kind, std::string("malformed ") + kind_name(m.header.kind) + " request: " + why), {});
  return false;
}

void Node::on_buffer_lease(Message& m) {
  BufferLeaseBody b;
  if (!request_body(m, b, ErrorKind::Buffer)) return;
  std::string why;
  // A reader elsewhere (or one that may not read this process's memory) gets the bytes streamed.
  const bool stream = b.stream || (!b.host.empty() && b.host != host_key());
  std::string listener;
  if (stream && (listener = buffer_streams(&why)).empty()) {
    reply(m, false, error_body(ErrorKind::Buffer, "the owner cannot stream its buffers: " + why), {});
    return;
  }
  // Small and from elsewhere: the bytes in the messages (the control link seals them), no stream.
  const bool in_messages = b.inline_ && stream && b.size <= kInlineBytes;
  if (in_messages && b.write && (m.frames.size() != 1 || m.frames[0].size() != b.size)) {
    reply(m, false, error_body(ErrorKind::Buffer, "malformed BufferLease request: a write of " +
                                   std::to_string(b.size) + " bytes in the messages must carry them in one frame"), {});
    return;
  }
  // RDMA for a reader elsewhere that offered its address: the link to it and the buffer's
  // registration, made before the lease: a device buffer the NIC reaches itself (dma-buf) is
  // then leased direct, neither staged nor granted to streams.
  RdmaOffer offer;
  if (stream && !in_messages && !b.rdma.empty()) offer = prepare_rdma(m.sender_addr, b);
  const bool direct = offer.link && buffers_.on_device(b.buffer);
  auto lease = buffers_.lease(b.buffer, b.offset, b.size, b.write, m.sender_addr, &why, stream && !in_messages && !direct,
                              direct);
  if (!lease.id) {
    reply(m, false, error_body(ErrorKind::Buffer, why), {});
    return;
  }
  if (in_messages) {
    answer_in_messages(m, b, lease);
    return;
  }
  BufferLeaseReply r;
  r.pid = static_cast<int64_t>(getpid());
  r.addr = reinterpret_cast<uint64_t>(lease.addr);
  r.lease = lease.number;
  r.host = host_key();
  r.device = lease.staged;
  r.direct = direct;
  if (stream && !direct) {
    r.stream = listener;
    r.token = to_hex(lease.token);
    r.key = to_hex(lease.key);
    r.cipher = record_cipher_name(preferred_record_cipher());
  }
  if (offer.link) {
    r.rdma = offer.link->address().to_string();
    r.rkey = offer.region->rkey;
  } else {
    r.rdma_why = offer.why;
  }
  if (m.header.corr) {
    reply(m, true, r, {});
  } else {
    buffers_.release(b.buffer, lease.number, m.sender_addr);  // nobody to tell where: no lease
  }
}

void Node::set_rdma_nic_source(RdmaNicSource source) {
  std::lock_guard<std::mutex> g(rdma_mu_);
  rdma_source_ = std::move(source);
  rdma_made_ = false;
  rdma_nic_.reset();
  rdma_links_.clear();
}

std::shared_ptr<RdmaNic> Node::rdma_nic(std::string* why) {
  std::lock_guard<std::mutex> g(rdma_mu_);
  if (!rdma_made_) {
    rdma_made_ = true;
    if (rdma_source_) rdma_nic_ = rdma_source_(&rdma_why_);
    if (!rdma_nic_ && rdma_why_.empty()) rdma_why_ = "no RDMA NIC was given to this process";
  }
  if (!rdma_nic_ && why) *why = rdma_why_;
  return rdma_nic_;
}

size_t Node::rdma_links() const {
  std::lock_guard<std::mutex> g(rdma_mu_);
  return rdma_links_.size();
}

Node::RdmaOffer Node::prepare_rdma(const std::string& holder, const BufferLeaseBody& b) {
  RdmaOffer offer;
  std::string why;
  RdmaAddress peer;
  auto nic = rdma_nic(&why);
  if (!nic) return offer.why = "the owner has no working RDMA device: " + why, offer;
  if (!RdmaAddress::parse(b.rdma, &peer, &why)) return offer.why = why, offer;
  auto region = buffers_.registration(b.buffer, [&](char* addr, size_t size, bool writable, DeviceMemory* device,
                                                   std::string* failed) -> RdmaNic::RegionPtr {
    if (!device) return nic->register_memory(addr, size, true, writable, failed);
    uint64_t offset = 0;  // device memory: registered through a dma-buf of it, or staged
    const int fd = device->dmabuf(addr, size, &offset, failed);
    if (fd < 0) return nullptr;
    auto direct = nic->register_dmabuf(fd, offset, size, reinterpret_cast<uint64_t>(addr), true, writable, failed);
    close(fd);
    return direct;
  }, &why);
  if (!region) return offer.why = "the owner could not register the buffer's memory for RDMA: " + why, offer;
  auto link = rdma_link_for(holder, peer, &why);
  if (!link) return offer.why = "the owner could not connect to the reader: " + why, offer;
  offer.link = link;
  offer.region = region;
  return offer;
}

std::shared_ptr<RdmaNic::Link> Node::rdma_link_for(const std::string& holder, const RdmaAddress& peer, std::string* why) {
  std::lock_guard<std::mutex> g(rdma_mu_);
  auto& link = rdma_links_[holder];
  if (link && link->peer_qpn() == peer.qpn) return link;
  std::shared_ptr<RdmaNic::Link> fresh = rdma_nic_->open_link(why);
  if (fresh) {
    if (std::string bad = fresh->connect(peer); !bad.empty()) {
      *why = bad;
      fresh.reset();
    }
  }
  if (fresh)
    link = fresh;
  else
    rdma_links_.erase(holder);
  return fresh;
}

void Node::answer_in_messages(Message& m, const BufferLeaseBody& b, const BufferRegistry::Lease& lease) {
  std::vector<zmq::message_t> frames;
  std::string failed;
  if (b.write) {
    std::memcpy(lease.addr, m.frames[0].data(), lease.size);
    failed = buffers_.land(lease.id, lease.number, m.sender_addr);  // a device buffer's: copied in
  } else {
    frames.emplace_back(lease.addr, lease.size);  // a copy, made before the lease ends
  }
  buffers_.release(lease.id, lease.number, m.sender_addr);
  if (!failed.empty()) {
    reply(m, false, error_body(ErrorKind::Buffer, failed), {});
    return;
  }
  BufferLeaseReply r;
  r.pid = static_cast<int64_t>(getpid());
  r.host = host_key();
  r.inline_ = true;
  try {
    reply(m, true, r, std::move(frames));
  } catch (const SendError& e) {  // this thread does not wait for room: say so, small
    reply(m, false, error_body(ErrorKind::Send, std::string("the owner could not send the bytes: ") + e.what()), {});
  }
}

std::string Node::buffer_streams(std::string* why) {
  std::lock_guard<std::mutex> g(streams_mu_);
  // Where the node has a lane listener, streams come to it (no port of their own: a proc behind
  // its agent's one port is reached through the agent like its lanes) and are handed over here.
  if (const std::string lanes = transport_.lane_endpoint(); !lanes.empty()) {
    if (!adopting_) {
      adopting_ = std::make_unique<BufferStreamServer>(buffers_);
      // Called by the I/O thread under the transport's lane lock: it takes no lock of the
      // node's. The server outlives the transport (declared before it, so destroyed after).
      BufferStreamServer* server = adopting_.get();
      transport_.set_stream_adopter([server](int fd, std::string early) { server->adopt(fd, std::move(early)); });
    }
    return lanes;
  }
  const std::string bound = transport_.tcp_bound_addr(), reached = tcp_addr();
  if (streams_ && streams_bound_ == bound) return streams_->address();
  // Beside the node's TCP address (bound there, reached as peers reach the node); a node with
  // none is reached by nobody off this host: loopback (the same-host fallback). One placed
  // before the node listened on TCP stays for the streams it serves; a new one goes beside it.
  if (streams_) old_streams_.push_back(std::move(streams_));
  std::string bind_host = "127.0.0.1", reach_host = bind_host;
  try {
    if (!bound.empty()) {
      const auto b = TcpEndpoint::parse(bound), r = TcpEndpoint::parse(reached.empty() ? bound : reached);
      bind_host = b.wildcard() ? (b.host.find(':') != std::string::npos ? "::" : "0.0.0.0") : b.host;
      reach_host = r.wildcard() ? numeric_host(hostname()) : r.host;
      // A proc behind its agent's one port listens on loopback, reached through the agent: its
      // streams listen on the host's address the agent is reached at (a port of their own).
      if (r.behind) bind_host = r.host;
    }
    streams_ = std::make_unique<BufferStreamServer>(buffers_, bind_host, reach_host);
    streams_bound_ = bound;
  } catch (const std::exception& e) {
    *why = e.what();
    return "";
  }
  return streams_->address();
}

void Node::on_buffer_release(Message& m) {
  BufferReleaseBody b;
  if (!typed_body(m, b)) return;
  // A complete write into a device buffer: its staged bytes go to the device before the lease
  // ends, and the writer (waiting for this answer) learns whether they did.
  const std::string failed = b.complete ? buffers_.land(b.buffer, b.lease, m.sender_addr) : "";
  buffers_.release(b.buffer, b.lease, m.sender_addr);
  if (!m.header.corr) return;
  if (failed.empty())
    reply(m, true, json(), {});
  else
    reply(m, false, error_body(ErrorKind::Buffer, failed), {});
}

void Node::on_buffer_drop(Message& m) {
  BufferReleaseBody b;
  if (!request_body(m, b, ErrorKind::Buffer)) return;
  const int left = buffers_.drop(b.buffer);
  if (left < 0) {
    reply(m, false, error_body(ErrorKind::Buffer, "the buffer was dropped (or never lent by this process)"), {});
    return;
  }
  reply(m, true, json{{"leases", left}}, {});
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
