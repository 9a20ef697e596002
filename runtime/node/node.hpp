// Node: one process's endpoint on the control plane. Every xmesh process (controller, proc,
// hostd) has exactly one. It is made of parts, each with its own small interface and lock:
//   - Transport (transport.hpp): the sockets, Hello and credentials, sequence numbers;
//   - Supervision (supervision.hpp): dead addresses, PeerDead subscribers, watched host agents;
//   - ActorDirectory (actor_directory.hpp): the actors' inboxes, messages held for a spawn,
//     refused callers;
//   - CallTable (call_table.hpp): the calls waiting for replies.
// The node's I/O thread receives and dispatches through a registry of handlers by kind
// (`on(Kind, handler)`); its own handlers wire the parts together: replies complete calls,
// actor messages reach the directory, supervision notices fail calls, DumpStacks is answered
// without the GIL. Everything else goes to the control inbox.
#pragma once
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "actor_directory.hpp"
#include "bodies.hpp"
#include "link_bodies.hpp"
#include "node_bodies.hpp"
#include "call.hpp"
#include "call_router.hpp"
#include "call_table.hpp"
#include "inbox.hpp"
#include "order.hpp"
#include "supervision.hpp"
#include "transport.hpp"
#include "wire.hpp"

namespace xmesh {

struct Target {
  std::string addr;   // the proc's node address
  std::string actor;  // actor name on that proc
};

// A subsystem's part of a node (the data plane's owner side, data_node.hpp): made by its
// subsystem, which registers its handlers with Node::on() before start() and adds it here; the
// node owns it from then on and tells it what the node learns that it may care about.
class NodePart {
 public:
  virtual ~NodePart() = default;
  // addr's process is gone (Node::mark_dead), after the calls to it failed. Any thread.
  virtual void peer_dead(const std::string& addr) { (void)addr; }
};

class Node : private RouterHost {
 public:
  // role: "controller", "proc", "hostd" (diagnostics and ids). bind_addr: "ipc://path" or
  // "tcp://host:port". accept_cookie: the credential peers must present in Hello.
  // key_file: the cluster's key (runtime/transport/keys.hpp) for TCP links; "" for none.
  // advertise: the address peers reach this node at when it is not the bound one (NAT).
  Node(std::string role, std::string bind_addr, std::string accept_cookie, std::string key_file = "",
       std::string advertise = "");
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const std::string& id() const { return transport_.self().id; }
  const std::string& addr() const { return transport_.self().addr; }
  const std::string& role() const { return transport_.self().role; }
  // Its parts, for what the node only passes through: the links and their credentials (a second
  // address on TCP, cookies, counters: Transport), who is dead and which host agents are
  // watched (Supervision; marking a death, which fails calls and closes links, is the node's
  // own mark_dead / lose_host), the actors' inboxes (ActorDirectory).
  Transport& transport() { return transport_; }
  const Transport& transport() const { return transport_; }
  Supervision& supervision() { return supervision_; }
  const Supervision& supervision() const { return supervision_; }
  ActorDirectory& actors() { return actors_; }

  // A handler for one kind of message, run on the I/O thread (it must not block). The node
  // registers its own (replies, actor messages, supervision, DumpStacks, heartbeats); a kind
  // with no handler goes to the control inbox. Register before start().
  using Handler = std::function<void(Message&)>;
  void on(Kind kind, Handler handler);

  void start();
  // Stops the I/O thread, closes every socket (bounded linger) and every inbox.
  void stop();
  bool running() const { return running_; }

  // Sends one message to the node at addr. Fills sender, incarnation and seq. Throws SendError
  // when the message exceeds the maximum size or the peer is known dead.
  // On the I/O thread (its handlers, heartbeats) a send never waits: a peer that cannot take the
  // message now (a TCP link down, its queue full) gets SendError at once, so that a dead link
  // never stalls receiving.
  void send(const std::string& addr, Header h, std::vector<zmq::message_t> frames);
  // The same, never waiting for the link: one that cannot take it now (a peer gone, a TCP link
  // down, its queue full) raises SendError at once. For messages that matter only if they go now (a
  // controller's Goodbye as it exits: an agent gone must not hold the exit for the send timeout).
  void send_if_ready(const std::string& addr, Header h, std::vector<zmq::message_t> frames);
  // A typed body as a message of its kind (each body knows it: bodies.hpp).
  template <class Body, class = std::enable_if_t<!std::is_same_v<Body, Header>, decltype(Body::kind)>>
  void send(const std::string& addr, const Body& body, std::vector<zmq::message_t> frames = {}) {
    Header h;
    h.kind = Body::kind;
    h.body = body;
    send(addr, std::move(h), std::move(frames));
  }
  // Sends a call to every target: one message each, or those the router takes (set_router: cast
  // trees past XMESH_CAST_FANOUT targets, runtime/cast/) its way. Actor messages carry
  // per-destination order numbers either way. With
  // expect_reply, registers and returns the Call that replies are filed into; targets already
  // dead fail at once.
  std::shared_ptr<Call> call(const std::vector<Target>& targets, Header tmpl, std::vector<zmq::message_t> frames,
                             bool expect_reply);
  // Registers a Call whose targets will answer without being sent anything (for example
  // procs announcing they are ready); supervision fails it like any other.
  std::shared_ptr<Call> expect(const std::vector<std::string>& addrs);
  // Names the address of target `index` of an expect()ed call, learned after it was registered
  // (a proc whose host agent chose its TCP port): supervision finds the call by it from then on,
  // and a target already known dead fails now.
  void retarget(const std::shared_ptr<Call>& c, size_t index, const std::string& addr);
  // A Call that this process answers itself (a data-plane transfer, data_plane.hpp): an id of
  // this node's, but never registered: no reply or supervision notice is filed into it.
  std::shared_ptr<Call> local_call(std::vector<std::string> addrs);
  // Opens a port (Monarch's Channel.open): Reply messages carrying its id land in it, from
  // whoever holds the id, until forget_call; a once port closes after its first.
  std::shared_ptr<Call> open_port(bool once);
  // Answers a Call message (sends Reply to the caller's address, same corr and index).
  void reply(const Message& call_msg, bool ok, json body, std::vector<zmq::message_t> frames);
  // Drops the Call registration (cancelled or abandoned futures).
  void forget_call(uint64_t id);

  Inbox& control() { return control_; }
  Inbox& logs() { return logs_; }
  Inbox& actor_events() { return actor_events_; }
  // The actor is gone: its inbox leaves the directory, and calls queued behind its stop, and
  // those that come later, are answered with tombstone (an error body: it failed, or was
  // stopped) or, when null, "it was stopped".
  void remove_actor(const std::string& name, const json& tombstone = nullptr);

  // Supervision: fail every pending and later call to addr with this error, tell the parts,
  // close the link.
  void mark_dead(const std::string& addr, const json& error);
  // The host agent is known gone (its pid ended) before its heartbeats time out: fail it and
  // its dependent procs now, as the heartbeat timeout would (once; text names the cause).
  void lose_host(const std::string& hostd_addr, const std::string& text);

  // The peer at addr is gone for good (its process ended, it said goodbye): its inbound
  // connections are forgotten and the outbound one closed, so that memory stays bounded by the
  // live peers (a host agent outlives thousands of short-lived controllers). Only gone peers are
  // forgotten: a peer says Hello once per connection, so a live one that was forgotten would be
  // muted. A ProcExited or PeerDead notice forgets that address too.
  void forget_peer(const std::string& addr);
  NodeStats stats() const;  // the transport's counters and the node's own (order, deferred, router)
  // The parts subsystems added (before start()); the one of type P, or nullptr.
  void add_part(std::unique_ptr<NodePart> part);
  template <class P>
  P* part() const {
    for (auto& p : parts_)
      if (auto* mine = dynamic_cast<P*>(p.get())) return mine;
    return nullptr;
  }
  // Adds a part of type P made from this node, once (a second call returns the first), after
  // wire(part) registered its handlers; before start().
  template <class P, class Wire>
  P& attach_part(Wire&& wire) {
    if (P* mine = part<P>()) return *mine;
    auto made = std::make_unique<P>(*this);
    P& added = *made;
    wire(added);
    add_part(std::move(made));
    return added;
  }
  // The part of type P, which must have been added: std::logic_error naming `what` (the
  // subsystem) and how to add it otherwise.
  template <class P>
  P& required_part(const std::string& what, const std::string& how) const {
    if (P* mine = part<P>()) return *mine;
    throw std::logic_error("this " + role() + " node has no " + what + " (" + how + " before start())");
  }
  // The way calls reach many targets and relayed messages go on (a part added before start(),
  // which keeps owning it): cast trees, runtime/cast/cast_trees.hpp. Without one, every target
  // gets its own message and a message to relay is refused. Returns what the node offers the
  // router (call_router.hpp), which only it uses.
  RouterHost& set_router(CallRouter& router);

  // Answers DumpStacks from the I/O thread itself, without waiting for anything the rest of
  // the process holds (a proc's GIL): the debugger's `where` must see a rank stuck in a C call
  // or a deadlock. The Python module installs a dumper that reads every thread's frames.
  using StackDumper = std::function<json()>;  // the reply body
  void set_stack_dumper(StackDumper dumper);

  // Reads m's typed body (bodies.hpp); a malformed one is counted, logged and false (*why_out
  // says why). request_body also answers such a request with a `kind` error naming why.
  template <class Body>
  bool typed_body(const Message& m, Body& out, std::string* why_out = nullptr) {
    std::string why;
    auto read = read_as<Body>(m.header.body, &why);
    if (!read) {
      note_malformed_body(m, why);
      if (why_out) *why_out = why;
      return false;
    }
    out = std::move(*read);
    return true;
  }
  template <class Body>
  bool request_body(const Message& m, Body& out, ErrorKind kind) {
    std::string why;
    if (typed_body(m, out, &why)) return true;
    refuse_malformed(m, kind, why);
    return false;
  }

 private:
  // What the router uses (RouterHost, call_router.hpp).
  void tell_lost(const std::vector<CastTarget>& targets, const std::string& origin_id) override;
  void send_or_defer(const std::string& addr, Header h, const std::vector<zmq::message_t>& frames,
                     std::function<void(const std::string&)> failed, bool try_now = true) override;
  void deliver(uint64_t corr, std::vector<CallResult> results) override;
  bool mine(const std::string& addr) const override;
  void note_malformed_body(const Message& m, const std::string& why);
  // A message to relay on a node without a router: answered (not delivered) and its number passed.
  bool refuse_relay(Message& m);
  void refuse_malformed(const Message& m, ErrorKind kind, const std::string& why);
  void io_loop();
  // The `xmesh-rings` thread: reads the node's shared-memory links and dispatches what comes
  // whenever no idle actor thread does (RingFeed).
  void rings_loop();
  // Reads the rings once, dispatching what came (nothing when another thread reads them now):
  // how many messages; *held: one waits for its actor's room.
  size_t pump_rings(bool* held);
  class RingFeed;
  std::shared_ptr<RingFeed> ring_feed_;  // what actor inboxes and calls are fed by (rings enabled)
  // Whether m's actor can take it now: a message from a shared-memory link waits in its ring
  // while the actor's inbox holds XMESH_INBOX_LIMIT messages (the sender is held back).
  bool has_room(const Message& m) const;
  size_t inbox_limit_ = 10000;
  void register_builtin_handlers();
  // Every message that came: a cast tree's is relayed first, an actor message passes the order
  // gate, then dispatch_now.
  void dispatch(Message m);
  void dispatch_now(Message m);  // its kind's handler, or the control inbox
  bool fenced(const Message& m);  // from a peer declared dead: dropped (said once a minute per loss)
  // Runs one step of the order gate (admit, skip, expire) and dispatches what it releases, both
  // under one lock: the I/O thread and a ring pump (the rings thread, an actor thread) release
  // from the same origin's stream, and messages released in order by the gate must reach the
  // actor's queue in that order too (released outside the lock, a later one could be queued
  // first by the other thread).
  template <class GateStep>
  void dispatch_released(GateStep&& step) {
    std::lock_guard<std::recursive_mutex> g(ordered_dispatch_mu_);  // a handler may release more
    for (auto& next : step()) dispatch_now(std::move(next));
  }
  void on_refusal(Message& m, const RefuseBody& refusal);
  void on_too_large(const Message& m, uint64_t payload_bytes, uint64_t sender_limit);
  void on_reply(Message& m);
  void on_actor_message(Message& m);  // Call, StopActor: the actor's inbox (held until its spawn)
  void on_spawn_actor(Message& m);
  void on_proc_exited(Message& m);    // supervision: mark dead, relay PeerDead, then control
  void on_peer_dead(Message& m);
  void on_dump_stacks(Message& m);
  void answer_no_actor(const Message& m, const std::string& why);
  void tick_heartbeats();
  void expire_waiting_for_actor();
  // Fails every call waiting on addr (and the targets behind it in cast trees), but the call
  // `spare` (0: none); answers that were to go up through addr go to their origins instead.
  void fail_calls_to(const std::string& addr, const json& error, uint64_t spare = 0);

  // ---- shared-memory links that break (node_ring_breaks.cpp) ----
  // A ring with peer broke: found by its reader here (by_reader), by a send here that found it
  // closed or its positions wrong (by_sender, with the message being sent, which is not lost),
  // or told by the peer (by_peer). Whatever was on it is lost: every call in flight between the
  // two fails naming why (its message or its answer may have been on it), the peer's order gate
  // hears which numbers will not come, the peer hears of the break, and the pair goes on over
  // ZeroMQ (a new link is offered at the next call). False when the peer is dead (supervision
  // speaks for it).
  enum class BreakFound { by_reader, by_sender, by_peer };
  bool ring_broke(const std::string& peer, uint64_t token, const std::string& why, BreakFound found,
                  const Header* sending = nullptr);
  void on_ring_broken(Message& m);
  LogBudget ring_break_log_{3, 60000};
  void fail_host(const std::string& hostd_addr, const std::set<std::string>& dependents, const std::string& text);

  // ---- order and deferred sends (node_order.cpp) ----
  uint64_t next_oseq(const std::string& addr);
  void unsent_oseqs(const std::vector<CastTarget>& targets);
  // The live targets with their order numbers (actor messages: `ordered`).
  std::vector<CastTarget> number_targets(const std::vector<Target>& targets, const std::vector<std::string>& addrs,
                                         const std::vector<bool>& dead, bool ordered);
  void send_direct(Call& c, const CastTarget& t, const Header& tmpl, const std::vector<zmq::message_t>& frames);
  void on_cast_lost(Message& m);
  void expire_order_waits();
  void relay_loop();     // the xmesh-relay thread: deferred sends, which may wait
  CallRouter* router_ = nullptr;
  std::mutex oseq_mu_;
  std::unordered_map<std::string, uint64_t> oseq_out_;  // the last order number per destination
  OrderGate order_gate_;
  std::recursive_mutex ordered_dispatch_mu_;  // dispatch_released
  DeferredSends deferred_;
  std::mutex relay_start_mu_;
  std::thread relay_;  // xmesh-relay, started by the first deferred send
  LogBudget order_log_{5, 60000};

  // Declared before the transport: destroyed after it (a part's callbacks run on the node's
  // threads, which stop() joins, but the transport may still hold one until it is gone).
  std::vector<std::unique_ptr<NodePart>> parts_;
  Transport transport_;
  Supervision supervision_;
  ActorDirectory actors_;
  CallTable calls_;
  std::thread io_, rings_;
  std::atomic<std::thread::id> io_thread_id_{}, rings_thread_id_{};
  // The threads that receive never wait in a send: a peer that cannot take a message now never
  // stalls what comes from every other peer.
  static thread_local bool pumping_;  // this thread is dispatching what came on a ring (an actor thread's pump)
  void send_waiting(const std::string& to, Header& h, std::vector<zmq::message_t>& frames, bool blocking);
  bool may_block() const {
    auto self = std::this_thread::get_id();
    return !pumping_ && self != io_thread_id_.load() && self != rings_thread_id_.load();
  }
  std::atomic<bool> running_{false};
  std::atomic<bool> stopping_{false};

  std::mutex dumper_mu_;
  StackDumper stack_dumper_;
  std::unordered_map<int, Handler> handlers_;  // by kind; filled before start(), never erased

  Inbox control_, logs_, actor_events_;
  LogBudget refusal_notices_{5, 60000};
  LogBudget size_refusal_log_{3, 60000};
  // What fenced peers still send, said once a minute at most per loss (keyed by its text: a host
  // and its procs share one), so that one lost host's late traffic cannot hide another's.
  std::mutex fenced_logs_mu_;
  std::map<std::string, LogBudget> fenced_logs_;
  void log_fenced(const std::string& loss, const std::string& text);
  std::set<Kind> link_kinds_;            // the links' own messages: never fenced
};

}  // namespace xmesh
