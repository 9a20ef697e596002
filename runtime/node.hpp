// Node: one process's endpoint on the control plane. Every xmesh process (controller, proc,
// hostd) has exactly one. It binds a ROUTER socket (inbound only) and keeps one DEALER per
// destination (outbound only), so:
//   - the I/O thread alone owns the ROUTER and never takes the GIL;
//   - any thread sends directly on a destination's DEALER under that peer's mutex (no thread
//     hop on the send side), which also gives per-(sender, receiver) FIFO order;
//   - inbound messages are filed by the I/O thread: replies into their Call, actor messages
//     into that actor's Inbox, the rest into the control or log inbox.
// Every connection starts with Hello (protocol version, build, credential cookie, the
// sender's own address and the cookie to present when connecting back). Nothing from an
// identity that has not passed Hello is ever handed to Python.
#pragma once
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "call.hpp"
#include "inbox.hpp"
#include "seq.hpp"
#include "wire.hpp"

namespace xmesh {

struct SendError : std::runtime_error {
  explicit SendError(const std::string& what, bool too_large = false)
      : std::runtime_error(what), too_large(too_large) {}
  bool too_large;  // the message exceeds XMESH_MAX_MESSAGE_BYTES (else: peer dead, closed, timed out)
};

struct Target {
  std::string addr;   // the proc's node address
  std::string actor;  // actor name on that proc
};

struct NodeStats {
  uint64_t sent = 0, received = 0, rejected = 0, malformed = 0, gaps = 0, duplicates = 0;
  uint64_t peers = 0;    // inbound connections known now (authenticated or not)
  uint64_t evicted = 0;  // unauthenticated identities dropped to bound memory
};

class Node {
 public:
  // role: "controller", "proc", "hostd" (diagnostics and ids). bind_addr: "ipc://path" or
  // "tcp://host:port". accept_cookie: the credential peers must present in Hello.
  Node(std::string role, std::string bind_addr, std::string accept_cookie);
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const std::string& id() const { return id_; }
  const std::string& addr() const { return addr_; }
  const std::string& role() const { return role_; }
  uint64_t incarnation() const { return incarnation_; }
  zmq::context_t& context() { return ctx_; }

  // A handler for one kind of message, run on the I/O thread (it must not block). The node
  // registers its own (replies, actor messages, supervision, DumpStacks, heartbeats); a kind
  // with no handler goes to the control inbox. Register before start().
  using Handler = std::function<void(Message&)>;
  void on(Kind kind, Handler handler);

  void start();
  // Stops the I/O thread, closes every socket (bounded linger) and every inbox.
  void stop();
  bool running() const { return running_; }

  // The cookie to present when connecting to addr (default: the one given to set_default_cookie).
  void set_peer_cookie(const std::string& addr, const std::string& cookie);
  void set_default_cookie(const std::string& cookie);
  void add_accepted_cookie(const std::string& cookie);

  // Sends one message to the node at addr. Fills sender, incarnation and seq. Throws SendError
  // when the message exceeds the maximum size or the peer is known dead.
  void send(const std::string& addr, Header h, std::vector<zmq::message_t> frames);
  // Sends a call to every target (a cast is N point-to-point sends of one shared payload; this
  // is the one place a multicast tree would go). With expect_reply, registers and returns the
  // Call that replies are filed into; targets already dead fail at once.
  std::shared_ptr<Call> call(const std::vector<Target>& targets, Header tmpl, std::vector<zmq::message_t> frames,
                             bool expect_reply);
  // Registers a Call whose targets will answer without being sent anything (for example
  // procs announcing they are ready); supervision fails it like any other.
  std::shared_ptr<Call> expect(const std::vector<std::string>& addrs);
  // Answers a Call message (sends Reply to the caller's address, same corr and index).
  void reply(const Message& call_msg, bool ok, json body, std::vector<zmq::message_t> frames);
  // Drops the Call registration (cancelled or abandoned futures).
  void forget_call(uint64_t id);

  Inbox& control() { return control_; }
  Inbox& logs() { return logs_; }
  Inbox& actor_events() { return actor_events_; }
  std::shared_ptr<Inbox> actor_inbox(const std::string& name);
  void remove_actor(const std::string& name);

  // Calls (and spawns) arriving from addr are answered with this error instead of being run:
  // a proc of a named allocation that another controller took over refuses its old owner.
  void refuse_calls_from(const std::string& addr, const json& error);

  // Supervision: fail every pending and later call to addr with this error.
  void mark_dead(const std::string& addr, const json& error);
  bool is_dead(const std::string& addr, json* error = nullptr) const;
  // A new process now listens at addr (a host agent restarted): talk to it again.
  void revive(const std::string& addr);
  // Procs whose death must be relayed (PeerDead) to every listed address.
  void add_supervision_subscriber(const std::string& addr);
  void remove_supervision_subscriber(const std::string& addr);
  // Liveness of a host agent: heartbeats every XMESH_HEARTBEAT_MS; when acks stop for
  // XMESH_HOSTD_TIMEOUT_MS the host and every dependent proc address are marked dead.
  void watch_host(const std::string& hostd_addr);
  void unwatch_host(const std::string& hostd_addr);
  void add_dependent(const std::string& hostd_addr, const std::string& proc_addr);
  // The host agent is known gone (its pid ended) before its heartbeats time out: fail it and
  // its dependent procs now, as the heartbeat timeout would (once; text names the cause).
  void lose_host(const std::string& hostd_addr, const std::string& text);

  // The address of the node whose identity sent a message (learned from its Hello).
  std::string peer_addr(const std::string& identity) const;
  // The peer at addr is gone for good (its process ended, it said goodbye): forget what its
  // inbound connections authenticated, so that memory stays bounded by the live peers. Only
  // gone peers are forgotten: a peer says Hello once per connection, so a live one that was
  // forgotten would be muted. A ProcExited or PeerDead notice forgets that address too.
  void forget_peer(const std::string& addr);
  NodeStats stats() const;

  // Answers DumpStacks from the I/O thread itself, without waiting for anything the rest of
  // the process holds (a proc's GIL): the debugger's `where` must see a rank stuck in a C call
  // or a deadlock. The Python module installs a dumper that reads every thread's frames.
  using StackDumper = std::function<json()>;  // the reply body
  void set_stack_dumper(StackDumper dumper);
  size_t max_message_bytes() const { return max_message_bytes_; }

 private:
  struct OutPeer {
    std::mutex mu;
    std::unique_ptr<zmq::socket_t> sock;
    uint64_t seq = 0;
    bool hello_sent = false;
    std::string cookie;
  };
  struct InPeer {
    bool authed = false;
    bool refused = false;
    std::string node_id, addr;
    SeqTracker seq;
  };
  struct WatchedHost {
    int64_t last_ack_ms = 0;
    int64_t last_sent_ms = 0;
    bool dead = false;
    std::set<std::string> dependents;
  };

  std::shared_ptr<OutPeer> out_peer(const std::string& addr);
  void send_locked(OutPeer& p, const std::string& addr, Header& h, std::vector<zmq::message_t>& frames);
  void send_hello_locked(OutPeer& p);
  void send_refusal(const std::string& to_addr, const std::string& reason);
  void io_loop();
  void handle_frames(std::vector<zmq::message_t>& parts);
  void handle_hello(InPeer& in, const std::string& identity, const Message& m);
  void dispatch(InPeer& in, Message m);
  void register_builtin_handlers();
  void on_reply(Message& m);
  void on_actor_message(Message& m);  // Call, StopActor: the actor's inbox (held until its spawn)
  void on_spawn_actor(Message& m);
  void on_proc_exited(Message& m);    // supervision: mark dead, relay PeerDead, then control
  void on_peer_dead(Message& m);
  void on_dump_stacks(Message& m);
  // Reads m's typed body (bodies.hpp); a malformed one is counted, logged and false.
  template <class Body>
  bool typed_body(const Message& m, Body& out);
  bool refused_caller(const Message& m);  // answers and drops it if its sender is refused
  void tick_heartbeats();
  void expire_waiting_for_actor();
  void fail_calls_to(const std::string& addr, const json& error);
  void check_size(const std::vector<zmq::message_t>& frames) const;  // throws SendError (too_large)
  InPeer& in_peer(const std::string& identity);  // I/O thread only
  void forget_gone_peers();                       // I/O thread only
  void fail_host(const std::string& hostd_addr, const std::set<std::string>& dependents, const std::string& text);

  std::string role_, addr_, id_;
  uint64_t incarnation_;
  size_t max_message_bytes_;
  int64_t heartbeat_ms_, hostd_timeout_ms_, actor_wait_ms_;  // from the environment, read once
  zmq::context_t ctx_;
  std::unique_ptr<zmq::socket_t> router_;
  std::thread io_;
  std::atomic<bool> running_{false};
  std::atomic<bool> stopping_{false};

  mutable std::mutex mu_;  // guards everything below
  std::unordered_map<std::string, std::shared_ptr<OutPeer>> out_;
  // By ZeroMQ routing id. Inserted and erased by the I/O thread only (other threads read it
  // under mu_), so the I/O thread may hold a reference across a message. Unauthenticated
  // entries are capped (XMESH_MAX_PENDING_PEERS): an identity flood evicts only them.
  std::unordered_map<std::string, InPeer> in_;
  size_t pending_peers_ = 0, max_pending_peers_ = 0;
  std::vector<std::string> gone_addrs_;  // forget_peer() requests, applied by the I/O thread
  std::set<std::string> accepted_cookies_;
  std::map<std::string, std::string> peer_cookies_;
  std::string default_cookie_;
  std::unordered_map<uint64_t, std::weak_ptr<Call>> calls_;
  std::unordered_map<std::string, std::set<uint64_t>> calls_by_addr_;
  std::unordered_map<std::string, json> dead_;
  std::unordered_map<std::string, std::shared_ptr<Inbox>> actors_;
  // Messages for an actor whose spawn has not arrived yet: another sender's SpawnActor may be
  // in flight (there is no order across senders). Held until the spawn or a deadline.
  struct Waiting {
    int64_t deadline_ms = 0;
    std::vector<Message> msgs;
  };
  std::unordered_map<std::string, Waiting> waiting_for_actor_;
  std::set<std::string> removed_actors_;
  std::unordered_map<std::string, json> refused_callers_;
  std::atomic<bool> any_refused_{false};
  std::set<std::string> subscribers_;
  std::map<std::string, WatchedHost> hosts_;
  std::atomic<uint64_t> next_corr_{1};
  NodeStats stats_;
  StackDumper stack_dumper_;
  std::unordered_map<int, Handler> handlers_;  // by kind; filled before start(), never erased

  Inbox control_, logs_, actor_events_;
};

}  // namespace xmesh
