// Transport: one node's sockets. A ROUTER bound at the node's address receives (the I/O thread
// alone reads it and never takes the GIL); one DEALER per destination sends, from any thread,
// under that peer's own mutex, which gives per-(sender, receiver) FIFO order without a thread
// hop. A connection is authenticated in its ZMTP handshake (handshake.hpp: the cookie as PLAIN
// password, this user's uid on unix sockets), so a process without the cookie never gets a
// frame in. Then every connection starts with Hello (protocol version, build, the sender's
// address and the cookie to present when connecting back); nothing from an identity that has
// not passed Hello goes further. Sequence numbers per connection count gaps and drop
// duplicates.
//
// Locks: each OutPeer's `mu` (its socket, its link upgrades and their writers, unacknowledged
// messages); `lanes_mu_` (the lane listener and the lanes being read: the I/O thread's, and
// stats and disconnect); `mu_` (the peer tables, aliases, inbound peers); `dialer_mu_` (the relay
// dialer, made once); the Cookies' own lock (cookies.hpp), innermost of all, nothing taken under
// it. `mu_` may be taken while a peer's `mu` or `lanes_mu_` is held (a Hello reads the tables; a
// lane's message looks up its inbound peer), never the other way round. A peer's `mu` and `lanes_mu_` are never held together, nor two peers' at once;
// `dialer_mu_` is held only to make or read the dialer; `back_mu_` (the back dialer and pool,
// transport_back.cpp) and `gateway_mu_` are taken under mu_ or a peer's `mu`, nothing under them
// but the dialer's or pool's own lock. The I/O thread never waits for a
// peer's `mu` (try_lock: a peer busy in a send is left to its sender).
//
// A TCP link can lose its connection (a cut link, a reset, ZMTP heartbeats timing out) and
// ZeroMQ drops what was in flight on it. So over TCP the sender keeps every message until the
// receiver acknowledges it (Ack, sent back on the same connection by the receiving ROUTER, about
// every XMESH_ACK_EVERY messages and every I/O tick), and when the DEALER connects again it says
// Hello and sends again, in order, whatever is unacknowledged; the receiver takes messages in
// order only and drops what it already has: nothing lost, nothing twice, as Monarch's channels.
#pragma once
#include <poll.h>

#include <array>
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "back_links.hpp"
#include "bodies.hpp"
#include "link_bodies.hpp"
#include "handshake.hpp"
#include "cookies.hpp"
#include "keys.hpp"
#include "link.hpp"
#include "relay_dialer.hpp"
#include "role.hpp"
#include "ring_links.hpp"
#include "seq.hpp"
#include "tcp_lane.hpp"
#include "wire.hpp"

namespace xmesh {

struct SendError : std::runtime_error {
  explicit SendError(const std::string& what, bool too_large = false, bool would_block = false,
                     bool maybe_sent = false)
      : std::runtime_error(what), too_large(too_large), would_block(would_block), maybe_sent(maybe_sent) {}
  bool too_large;    // the message exceeds XMESH_MAX_MESSAGE_BYTES (else: peer dead, closed, timed out)
  bool would_block;  // a send that does not wait found the link full: it may go later
  // Part of the message may have left (a payload frame refused after its header went): its
  // receiver may still see it. Otherwise nothing of it left (its order number may be reused).
  bool maybe_sent;
};

struct NodeStats {
  uint64_t sent = 0, received = 0, malformed = 0, gaps = 0, duplicates = 0;
  uint64_t rejected = 0;  // messages dropped before Hello, Hellos refused, connections refused
  uint64_t peers = 0;    // inbound connections known now (authenticated or not)
  uint64_t evicted = 0;  // unauthenticated identities dropped to bound memory
  uint64_t too_large = 0;  // messages over XMESH_MAX_MESSAGE_BYTES (answered or logged, not dispatched)
  uint64_t resent = 0;      // messages sent again over a TCP connection made again
  uint64_t reconnects = 0;  // TCP connections made again (a link that dropped and came back)
  uint64_t unacked = 0;     // messages kept now until their TCP receivers acknowledge them
  uint64_t ring_sent = 0, ring_received = 0;  // messages over shared-memory links (counted in sent/received too)
  uint64_t rings_out = 0;  // links up now to peers this node writes to
  uint64_t rings_in = 0;   // links being read now
  // Cast trees (filled by the node): messages this node relayed; actor messages waiting now for
  // an earlier one from their origin; taken after their wait expired; dropped as given up on.
  uint64_t relayed = 0, order_held = 0, order_late = 0, order_dropped = 0;
  uint64_t deferred = 0;  // sends left to the xmesh-relay thread (a link full at once; CastLost notices)
  // TCP lanes (tcp_lane.hpp): messages over them (counted in sent/received too), lanes up now
  // to peers this node writes to and lanes being read, lanes that broke (writer side: the link
  // went back to ZeroMQ and sent again what was unacknowledged).
  uint64_t lane_sent = 0, lane_received = 0, lanes_out = 0, lanes_in = 0, lane_breaks = 0;
};

// Who a node is on its links, fixed when its transport is made.
struct NodeIdentity {
  std::string id;    // "<role>-<host>-<pid>-<incarnation>": unique per process start
  std::string addr;  // where peers reach it (the advertised address when there is one)
  // A node known by a TCP address that also listens on a unix socket (a proc of a TCP host: its
  // host's procs reach it there, and over shared memory): that socket's address; else "".
  std::string unix_addr;
  std::string role;
  Role kind = Role::controller;
  uint64_t incarnation = 0;      // random per process start, never 0
  size_t max_message_bytes = 0;  // XMESH_MAX_MESSAGE_BYTES: the largest message it takes
};

class Transport {
 public:
  // bind_addr: "ipc://path" or "tcp://host:port"; accept_cookie: what peers must present.
  // key_file (runtime/transport/keys.hpp; "" for none): TCP links, listening and dialling, authenticate and
  // encrypt with its CURVE pair, the cookie then checked at Hello. Without one, only a loopback
  // TCP address may be listened on.
  // advertise: the address peers reach this one at, when it is not the bound one (NAT, port
  // forwarding, a wildcard host): "tcp://host:port".
  Transport(std::string role, const std::string& bind_addr, const std::string& accept_cookie,
            const std::string& key_file = "", const std::string& advertise = "");
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  const NodeIdentity& self() const { return self_; }
  Cookies& cookies() { return cookies_; }
  // A second listening address on TCP (CURVE, with the cluster's key file) for a node whose
  // address is a unix socket: a controller that starts using hosts over TCP, a host agent
  // serving remote controllers. Peers dialled over TCP learn this address in Hello, so their
  // answers come back over TCP; unix-socket peers keep the first. Returns the address (the
  // advertised one if given). Throws KeyFileError (the key file), std::runtime_error (the bind,
  // a second call, a key other than the one this node already uses).
  std::string listen_tcp(const std::string& bind_addr, const std::string& key_file, const std::string& advertise = "");
  std::string cluster_cookie() const;  // of the key in use (keys.hpp); "" without one
  std::string tcp_addr() const;  // "" until listen_tcp (or the node's own address when it is TCP)
  std::string tcp_bound_addr() const;  // where listen_tcp bound (the address before any advertising)
  zmq::context_t& context() { return ctx_; }

  // The node at addr should listen already (a host agent): connecting to it failing again and
  // again before its first handshake is a refusal naming that (HandshakeWatch). Before the
  // first send to it.
  void expect_listening(const std::string& addr);

  // Sends one message (fills sender, incarnation, seq; says Hello first on a new connection).
  // blocking=false (the I/O thread's own sends, heartbeats): a peer that cannot take it now
  // (a TCP link down, its queue full) gets SendError at once instead of stalling the caller.
  // Over TCP the message is kept until acknowledged; past XMESH_RESEND_BUFFER_BYTES kept for one
  // peer, a blocking send waits (up to the send timeout) for acknowledgements.
  void send(const std::string& addr, Header& h, std::vector<zmq::message_t>& frames, bool blocking = true);
  void check_size(const std::vector<zmq::message_t>& frames) const;  // throws SendError (too_large)
  // Nothing more goes to addr on the current connection (a dead peer): its queue is dropped.
  void disconnect(const std::string& addr);
  // addr is ending on purpose (its proc is being stopped): no new link is proposed to it, and
  // its links' breaks are not said (they are its end, not a fault). Until its connection goes.
  void expect_gone(const std::string& addr);

  // I/O thread only. One authenticated message (its split frames joined), or a Refuse from a
  // peer that refused us (then `refusal` holds its body, read once here, and sender_addr is
  // the refuser), or one too large for this node (`too_large`); nullopt when
  // nothing came within the receive timeout or what came was handled here (Hello, garbage,
  // strangers, duplicates).
  struct Received {
    Message msg;
    std::optional<RefuseBody> refusal;
    // The payload exceeded this node's XMESH_MAX_MESSAGE_BYTES: msg has its header only, and
    // its sender's own limit (from its Hello; 0 when unknown) is here to be named.
    bool too_large = false;
    uint64_t payload_bytes = 0, sender_limit = 0;
  };
  std::optional<Received> receive(int timeout_ms);
  // I/O thread: another message waits to be received now (what came is handled as a batch).
  bool input_pending();

  // Where to send what is addressed to addr: a peer's unix-socket address that it named in its
  // Hello beside its TCP one (it runs on another machine) goes to the TCP one; else addr itself.
  // `storage` holds the answer when it is not addr.
  const std::string& route(const std::string& addr, std::string& storage) const;
  // The unix-socket address a peer at this TCP address named beside it in its Hello ("" if
  // none): where a node of its host reaches it over shared memory (a cast tree's relay).
  std::string unix_alias(const std::string& tcp_addr) const;
  // The peer behind an inbound connection, from its Hello ({} when unknown).
  struct PeerInfo {
    std::string addr;
    int64_t pid = 0;
  };
  PeerInfo peer(const std::string& identity) const;
  // The peer at addr is gone for good: what its inbound connections authenticated is forgotten
  // (applied by the I/O thread). Only gone peers: a peer says Hello once per connection.
  void forget_peer(const std::string& addr);
  // I/O thread, every tick: applies forget_peer() requests also when no message comes, sends the
  // acknowledgements due, reads those that came, makes a TCP peer whose connection was made again
  // hear Hello and what it has not acknowledged, and returns the peers that refused this node in
  // a handshake since the last call (each once). Never waits for a peer.
  std::vector<RefuseBody> tidy();
  // I/O thread, after each receive: the addresses where another process said Hello than the one
  // that held them before (a controller that took a freed port). Its predecessor's link and
  // learned cookie are gone already; the node revives the address (a refusal of the old link
  // may have marked it dead). Empty almost always: one atomic load.
  std::vector<std::string> take_successors();
  void count_malformed(const std::string& what);  // a message whose body did not read
  void count_too_large() { ++counts_.too_large; }  // one over the limit that came another way (a ring)
  NodeStats stats() const;
  // What became of this node's link to addr, in words, for a message about a peer that does not
  // answer: none opened, no TCP connection made, a connection without a finished handshake,
  // messages waiting for its acknowledgement.
  std::string link_report(const std::string& addr) const;
  // What link_report says of a TCP link whose every message the peer acknowledged: it received
  // them, so an answer that did not come could not come back (its way to this node is closed).
  static constexpr const char* kAllAcknowledged = "every message sent to it was acknowledged";
  // Closes every socket (bounded linger) and removes an ipc socket file.
  void close();

  // Shared-memory rings to nodes of this host (ring_links.hpp): controllers and procs take
  // offers and make them, on their first Call or Reply to a peer at a unix-socket address
  // (XMESH_RING_BYTES per link; XMESH_RINGS=0: none); enabled() says whether this node does.
  RingReaders& ring_readers() { return rings_; }
  // The link protocol's messages (link.hpp: a proposal, its answer, the switch; for rings and
  // lanes), which the node dispatches here in order (whichever thread dispatches): a proposal is
  // answered, an answer arms the link (its next message switches), a switch starts reading it.
  // False for a message of another kind.
  bool on_link_message(const Message& m);
  std::vector<Kind> link_message_kinds() const;  // the link kinds' own, from their specs
  // A link that does not number its messages (a shared-memory ring) broke under a send: this
  // node found it closed while writing (its reader gave it up) or its positions not adding up;
  // whatever it held unread is lost.
  struct LinkBreak {
    std::string peer;
    uint64_t token = 0;  // the link's (a ring's random token)
    std::string why;
    // Closed by its reader (it may be stopping, or found garbage and says so in RingBroken):
    // not a break this side can judge; else its shared positions do not add up.
    bool closed = false;
  };
  // Who handles a break found while sending (the node, injected before start): called without
  // any lock held, with the message being sent (not yet on the broken link, so it is not lost).
  // True when the link is dropped and the message may go over ZeroMQ; false: the send fails.
  using LinkBreakHandler = std::function<bool(const LinkBreak&, const Header& sending)>;
  void set_link_break_handler(LinkBreakHandler handler) { link_break_handler_ = std::move(handler); }
  // Drops the link with `token` to or from peer, whichever way it went (the reader's ring is
  // forgotten unread). writer: it was this node's ring to peer; through_oseq: the highest order
  // number written on it (0: none). Nothing found: the break was handled already.
  // relayed: the messages this node relayed for another origin (cast trees) that were on the
  // ring and not taken by its reader: lost with it (the node fails them as a relay, naming why).
  struct RingDropped {
    bool writer = false, reader = false;
    uint64_t through_oseq = 0;
    std::vector<Header> relayed;
  };
  RingDropped drop_broken_ring(const std::string& peer, uint64_t token);
  // This node's ring to peer was found closed by its reader: dropped, its token and highest order
  // number kept a while, for a RingBroken from the reader naming it (drop_broken_ring finds it).
  void set_closed_ring_aside(const std::string& peer, uint64_t token);

  // Where peers reach the lane listener ("tcp://host:port", "tcp://agent:port/N" through the
  // agent's PortMux; "" when there is none): data-plane streams come there too.
  std::string lane_endpoint() const;
  // Who takes the data-plane streams that arrive at the lane listener (tcp_lane.hpp).
  void set_stream_adopter(LaneListener::StreamAdopter adopter);
  // Closes every lane this node reads (their writers go back to ZeroMQ and send again what was
  // not acknowledged; they may ask for new lanes): for a fault injected on purpose (the tests).
  void close_lanes();

  // A controller the nodes cannot connect to (back_links.hpp; docs/architecture/03-transport-and-links.md,
  // "A controller reached back"). On: every TCP peer this node dials from now on hears its back
  // token in Hello and reaches it only through the connections it keeps open to that peer (its
  // host agent's port). Off: peers dialled from now on dial it. Peers dialled before keep what
  // they heard (disconnect one to make it hear again). Throws std::runtime_error without a TCP
  // address (listen_tcp first: the back connections end at that socket).
  void set_reach_back(bool on);
  bool reaches_back() const { return reach_back_.load(); }
  // Back connections to addr opened now, not at the first send (a proc whose first message is
  // to this node). Nothing when not reaching back. Throws std::invalid_argument naming an address
  // that cannot be reached back.
  void reach_back_to(const std::string& addr);
  // A node's side: the controller at addr is reached only through the connections it opens,
  // which present token_hex (from its Hello, or from its agent at a proc's start).
  void learn_back(const std::string& addr, const std::string& token_hex);
  std::string back_token_for(const std::string& addr) const;  // hex; "" when addr is dialled
  // A back connection that arrived another way (a host agent's PortMux), with what was read of it.
  void adopt_back_connection(unique_fd fd, std::string early);
  // A controller outside the cluster that reaches its agents' ports through one of them
  // ("host:port", a gateway: socks_route.hpp; "" none): every TCP connection it opens from now on
  // (its DEALERs, lanes, back connections) goes through that agent's PortMux, except to the
  // gateway itself. Throws std::invalid_argument for an address that does not parse.
  void set_gateway(const std::string& host_port);
  std::string gateway() const;
  // The gateway for a connection to addr: "" when addr is not TCP or is the gateway itself.
  std::string gateway_for(const std::string& addr) const;
  struct BackStats {
    BackDialer::Stats dialer;
    BackPool::Stats pool;
  };
  BackStats back_stats() const;

 private:
  // The header as it goes on any link; SendError (too_large) past kMaxHeaderBytes, which the
  // receiver would drop as malformed, leaving its caller to time out.
  static std::vector<uint8_t> header_for_wire(const Header& h);
  // The link kinds, in the order a message tries them (link.hpp): a ring (kRing), a lane (kLane).
  static constexpr size_t kRing = 0, kLane = 1, kLinkKinds = 2;
  // A message kept until its receiver acknowledges it (TCP links).
  struct Unacked {
    uint64_t seq = 0;
    std::vector<uint8_t> header;  // encoded
    std::vector<zmq::message_t> frames;  // copies sharing the sent frames' memory
    size_t bytes = 0;
  };
  struct OutPeer {
    std::mutex mu;
    std::string addr;
    std::unique_ptr<zmq::socket_t> sock;
    std::unique_ptr<HandshakeWatch> watch;  // until the first handshake ends (TCP: for good); reset before sock
    uint64_t seq = 0;
    bool hello_due = true;  // a new connection: Hello (and, over TCP, what is unacknowledged) first
    bool handshaken = false;  // its first handshake ended (then a TCP one is watched for reconnects)
    std::string cookie;
    bool resends = false;  // a TCP link: keeps what it sends until acknowledged
    std::atomic<bool> going{false};  // expect_gone: ending on purpose
    std::deque<Unacked> unacked;
    std::atomic<size_t> unacked_count{0};  // its size, for stats() without the mutex
    size_t unacked_bytes = 0;
    uint64_t peer_incarnation = 0;  // the receiver's, from its acknowledgements
    std::string routing_id;         // this connection's, which a refusal of it names
    // Its upgrades to faster links (link.hpp), one per kind in kinds_' order: a ring, a lane.
    std::array<LinkUpgrade, kLinkKinds> links;
    explicit OutPeer(const std::array<std::unique_ptr<LinkKind>, kLinkKinds>& kinds)
        : links{LinkUpgrade(kinds[0]->spec()), LinkUpgrade(kinds[1]->spec())} {}
    struct RingAside {
      uint64_t token = 0, ring_oseq = 0;
      std::vector<Header> relayed;  // not taken when it was closed
    };
    std::deque<RingAside> rings_set_aside;  // rings closed by the reader, for its RingBroken
    bool via_back = false;  // its DEALER goes through the back pool (back_links.hpp)
    std::atomic<bool> reroute_due{false};  // its peer turned out to be reached back: a new DEALER
    // Senders holding mu in a send that may wait (for room, a full ring or lane, ZeroMQ's high-water
    // mark): a thread that must not wait gives up on the peer instead of waiting for mu
    // (lock_unless_held_waiting). A count: such sections nest.
    std::atomic<int> holders_waiting{0};
    std::atomic<bool> dropped{false};  // closed or forgotten: a sender waiting for room stops
  };
  // Marks p's holder as in a send that may wait, for its scope (OutPeer::holders_waiting).
  class MayWait {
   public:
    MayWait(OutPeer& p, bool blocking) : p_(blocking ? &p : nullptr) {
      if (p_) p_->holders_waiting.fetch_add(1, std::memory_order_relaxed);
    }
    ~MayWait() {
      if (p_) p_->holders_waiting.fetch_sub(1, std::memory_order_relaxed);
    }
    MayWait(const MayWait&) = delete;
    MayWait& operator=(const MayWait&) = delete;

   private:
    OutPeer* p_;
  };
  // p's mutex for a thread that must not wait in a send (the I/O thread, a pump): taken once it
  // is free, or false when its holder is still in a send that may wait after a short grace (a
  // quick send, marked as one that may wait, is waited for).
  static bool lock_unless_held_waiting(OutPeer& p, std::unique_lock<std::mutex>& g);
  // p is closed or forgotten: a sender waiting for room in it (holding its mutex) gives up now.
  static void stop_waiting_senders(OutPeer& p);
  struct InPeer {
    bool authed = false;
    bool refused = false;
    uint64_t max_message_bytes = 0;  // its own limit, from its Hello
    int64_t pid = 0;                 // its process, from its Hello
    std::string node_id, addr;
    SeqTracker seq;
    zmq::socket_t* router = nullptr;  // the ROUTER its connection reached (acknowledgements go back there)
    bool acks = false;                // its sender resends: take in order only, acknowledge
    bool ack_due = false;             // listed in ack_due_
    uint64_t acked = 0;               // the last number acknowledged
  };

  void use_receive_timeout(int ms);
  // A ROUTER listening at bind_addr (CURVE on TCP with a key, else PLAIN); *endpoint: where.
  std::unique_ptr<zmq::socket_t> make_router(const std::string& bind_addr, std::string* endpoint);
  void use_key_file(const std::string& key_file);
  std::shared_ptr<const CurveKeys> keys() const { return std::atomic_load(&keys_); }
  // The address a peer at dest_addr should answer to: the TCP one for a TCP peer.
  std::string own_addr_for(const std::string& dest_addr) const;
  // Reads one multipart message from whichever router has one (polling both once there are two);
  // the router it came from, or nullptr.
  zmq::socket_t* receive_parts(std::vector<zmq::message_t>& parts);
  std::shared_ptr<OutPeer> out_peer(const std::string& addr, bool* created = nullptr);
  // p's DEALER made, set up and dialled (a new peer, or one rerouted); throws SendError.
  void open_socket_locked(OutPeer& p, bool listening_expected);
  // The peer at addr turned out to be reached back: its DEALER is made again through the back
  // pool, Hello and what is unacknowledged following (now, or by its sender or the I/O thread).
  void reroute_to_back(const std::string& addr);
  void reroute_locked(const std::shared_ptr<OutPeer>& p);
  void tend_reroutes();  // I/O thread: reroutes left to it
  BackPool& back_pool();  // made on first use
  BackDialer* back_dialer() const;  // null when not reaching back
  // Lanes over back connections (transport_lanes.cpp): one of from's for a lane to it.
 public:
  // One of the connections the controller at `from` opened for this node (back_links.hpp), its
  // tag 'L' written, for a lane or a data-plane stream to it: waiting up to wait_ms for one to be
  // free; invalid when none came.
  unique_fd take_back_connection(const std::string& from, int wait_ms = 0);

 private:
  void send_hello_locked(OutPeer& p, zmq::send_flags flags);
  // Sends a message's first frame. A blocking send waits in short slices: between them it polls
  // the handshake's watch while the first handshake has not ended (a refused DEALER has no pipe:
  // a plain blocking send would wait out the send timeout holding the peer's lock, and the
  // refusal would be said as a timeout), and stops once the link is closed or forgotten.
  // Throws SendError naming a refusal or the closing.
  bool send_first_frame_locked(OutPeer& p, zmq::message_t& m, zmq::send_flags flags);
  // Throws SendError naming why if p's watch says the peer refused this node (then p is closed
  // and the refusal queued for the node, as the I/O thread's handshake_verdicts would have).
  void throw_if_refused_locked(OutPeer& p);
  // Hello, then (TCP) every unacknowledged message again, in order. Throws SendError when the
  // peer cannot take them now (hello_due stays set: the next send or tick tries again).
  void resume_locked(OutPeer& p, zmq::send_flags flags);
  void send_frames_locked(OutPeer& p, const std::vector<uint8_t>& header, std::vector<zmq::message_t>& frames,
                          zmq::send_flags flags, bool blocking);
  // One message over p's ZeroMQ connection (numbered; kept until acknowledged on TCP).
  void send_zmq_locked(OutPeer& p, Header& h, std::vector<zmq::message_t>& frames, bool blocking);
  // A link's own message over ZeroMQ (a proposal, an answer to one, a switch): kind and body
  // only, from this node. Throws SendError as send_zmq_locked.
  void send_link_message_locked(OutPeer& p, Kind kind, json body, bool blocking);
  // The out peer at addr if there is one (a handler answering what this node sent it), or null.
  std::shared_ptr<OutPeer> existing_out_peer(const std::string& addr) const;
  void send_once(const std::shared_ptr<OutPeer>& p, Header& h, std::vector<zmq::message_t>& frames, bool blocking,
                 LinkBreak* broke);
  // The link upgrades (transport_links.cpp, link.hpp). One message over the first of p's links
  // that is up (true), after its switch if that is due; a link that does not number its
  // messages found broken under it is described in *broke, nothing of the message written.
  bool links_send_locked(OutPeer& p, Header& h, std::vector<zmq::message_t>& frames, bool blocking, LinkBreak* broke);
  bool link_send_locked(OutPeer& p, size_t kind, Header& h, std::vector<zmq::message_t>& frames, bool blocking,
                        LinkBreak* broke);
  // Armed: the switch goes when the link is ready (true once it went).
  bool switch_when_ready_locked(OutPeer& p, size_t kind, bool blocking);
  bool numbered_link_send_locked(OutPeer& p, size_t kind, Header& h, std::vector<zmq::message_t>& frames,
                                 bool blocking);
  bool plain_link_send_locked(OutPeer& p, size_t kind, Header& h, std::vector<zmq::message_t>& frames, bool blocking,
                              LinkBreak* broke);
  // After a message of kind `sent` went over ZeroMQ: each link due proposed to p.
  void propose_links_locked(OutPeer& p, Kind sent, bool blocking);
  void answer_proposal(size_t kind, const Message& m);
  void take_answer(size_t kind, const Message& m);
  // A step of an upgrade a receiving thread could not take now, its peer held by a sender
  // waiting for room (lock_unless_held_waiting): an answer to send, or one to take. Dropping it
  // would leave the proposer's upgrade waiting for good; the I/O thread does it at its next
  // receive (a message, or its poll's timeout), once the peer is free.
  struct DeferredLinkStep {
    size_t kind = 0;
    bool send = false;  // an answer this node owes (else: one it was given)
    std::string addr;   // the proposer it goes to, or the reader it came from
    json body;
  };
  // Each does the step: false when it must wait (the peer still held), true once done or moot.
  bool send_answer(const DeferredLinkStep& step);
  bool take_answer_now(const DeferredLinkStep& step);
  void defer_link_step(DeferredLinkStep step);
  void retry_deferred_link_steps();
  // A link that broke or was closed, given up: a numbered one's messages go again over ZeroMQ
  // (Hello due); said in the log unless quiet.
  void link_gone_locked(OutPeer& p, size_t kind, const std::string& why, bool quiet = false);
  void tend_links_locked(OutPeer& p);  // the I/O thread's tick: pending bytes out, breaks noticed
  // A message to keep until its receiver acknowledges it: made before it is sent (a send
  // consumes the frames; the copy shares their memory), kept once it went.
  static Unacked copy_for_resend(uint64_t seq, const std::vector<uint8_t>& header,
                                 std::vector<zmq::message_t>& frames);
  static void keep_unacked_locked(OutPeer& p, Unacked kept);
  static size_t payload_bytes(const std::vector<zmq::message_t>& frames);
  // The ring kind's own bookkeeping (transport_rings.cpp). A ring that broke or was closed
  // under a send, given up: its highest order number, and into *relayed the relayed messages
  // on it its reader had not taken.
  uint64_t give_up_ring_locked(OutPeer& p, std::vector<Header>* relayed);
  class RingKind;
  class LaneKind;
  std::unique_ptr<LinkKind> make_ring_kind();
  std::unique_ptr<LinkKind> make_lane_kind();
  // Acknowledgements that came back on p's connection: what they cover is dropped.
  void read_acks_locked(OutPeer& p);
  // Room for `bytes` more unacknowledged: reads acks; a blocking sender waits for them.
  void make_room_locked(OutPeer& p, size_t bytes, bool blocking);
  void notice_reconnect_locked(OutPeer& p);
  // I/O thread: acknowledges what `in` (at identity) delivered since the last acknowledgement.
  void send_ack(const std::string& identity, InPeer& in);
  // force: acknowledge even with nothing new (what came was sent again: its sender still keeps it).
  void note_delivered(const std::string& identity, InPeer& in, bool force);
  void send_due_acks();
  void send_refusal(const std::string& to_addr, const std::string& cookie, const std::string& reason,
                    const std::string& connection);
  std::vector<RefuseBody> handshake_verdicts();
  // Each TCP out peer not busy in a send: its acks read; connected anew, it hears Hello and what
  // it has not acknowledged.
  void tend_tcp_links();
  static void close_peer_locked(OutPeer& p);
  // TCP lanes to this node (transport_lanes.cpp) (tcp_lane.hpp; docs/architecture/03-transport-and-links.md, "TCP lanes between hosts"): a listener on
  // listen_host:port (0: any), named to askers as advertise_host and its port. Throws naming why.
  // Without one this node still writes lanes to nodes that listen.
  // agent_port (not 0): this node is a proc behind its host agent's one port; askers connect to
  // the agent there and ask its PortMux for the listener's (loopback) port; handover (not
  // empty): the unix socket where the PortMux hands this node those connections.
  void enable_lanes(const std::string& listen_host, int port, const std::string& advertise_host, int agent_port = 0,
                    const std::string& handover = "");
  // At a TCP address (bound, and as peers reach it): a lane listener beside it where lanes are
  // due (controllers and procs reached at their own port; XMESH_LANES=0 turns lanes off); what
  // fails is logged and ZeroMQ goes on alone.
  void listen_for_lanes(const std::string& bound, const std::string& advertised);
  // The reading side of lanes: answering an ask, taking a switch.
  LaneOfferBody lane_answer(const std::string& from);
  void lane_switched(const std::string& from, const std::string& identity);
  // The I/O thread's receive when lanes are on: polls the routers, the lane listener and the lanes
  // being read; what the lanes held goes to lane_ready_. The router with a message, or nullptr.
  zmq::socket_t* receive_parts_with_lanes(std::vector<zmq::message_t>& parts);
  unsigned routers_holding(zmq::socket_t* tcp);
  void accept_lanes();
  struct LaneRead;
  void read_lane(const std::string& writer, LaneRead& lane);
  std::optional<Received> take_lane_ready();
  // The numbered part of admitting a message (after Hello and authentication): its sequence
  // number checked (duplicates dropped, acknowledgements noted).
  std::optional<Received> accept_numbered(const std::string& identity, InPeer& in, Message m);
  std::string connection_id();  // "<node id>.<n>": the routing id of one outbound connection
  void split_large_frames(Header& h, std::vector<zmq::message_t>& frames) const;
  bool join_pieces(Message& m);
  std::optional<Received> admit(const std::string& identity, Message m, bool by_key, zmq::socket_t* router);
  void handle_hello(const std::string& identity, InPeer& in, const Message& m, bool by_key);
  // Under mu_: the Hello of node `sender` from addr, accepted. A node other than the one that
  // held addr before takes over: the link to its predecessor (returned, to be closed) and the
  // cookie learned from it go; addr joins successors_.
  std::shared_ptr<OutPeer> note_owner_locked(const std::string& addr, const std::string& sender,
                                             const std::string& reply_cookie);
  bool refuses_a_closed_connection(const RefuseBody& refusal);
  // Connects s to addr; a proc behind its host agent's one port (tcp://host:port/N) through the
  // process's RelayDialer (made on first use). Throws std::invalid_argument / std::runtime_error
  // for a malformed or unresolvable relayed address.
  void dial(zmq::socket_t& s, const std::string& addr);
  // How a DEALER to addr proves who it is: CURVE with the key file on TCP, else the cookie.
  void present_to(zmq::socket_t& dealer, const std::string& addr, const std::string& cookie);
  InPeer& in_peer(const std::string& identity);  // I/O thread only
  void forget_gone_peers();                       // under mu_

  NodeIdentity self_;

  int64_t send_timeout_ms_;
  size_t resend_buffer_bytes_;  // XMESH_RESEND_BUFFER_BYTES: unacknowledged bytes kept per TCP peer
  uint64_t ack_every_;          // XMESH_ACK_EVERY: a receiver acknowledges at least this often
  std::shared_ptr<const CurveKeys> keys_;  // the cluster's key file, for TCP links (atomic access)
  std::string key_file_;                   // its path (under mu_)
  zmq::context_t ctx_;
  std::mutex dialer_mu_;
  std::unique_ptr<RelayDialer> dialer_;  // declared after ctx_: closed before it
  std::unique_ptr<Gatekeeper> gatekeeper_;  // judges every connection to router_
  std::unique_ptr<zmq::socket_t> router_;
  // The second ROUTER (listen_tcp): made by the caller's thread, then read by the I/O thread
  // alone, which takes it up through tcp_ready_ (release/acquire: the hand-over's barrier).
  std::unique_ptr<zmq::socket_t> tcp_router_;
  std::atomic<zmq::socket_t*> tcp_ready_{nullptr};
  std::string tcp_addr_, tcp_bound_;  // under mu_
  int receive_timeout_ms_ = -1;  // as ZeroMQ's default: until a message comes
  bool poll_tcp_first_ = false;  // alternates which router is read first (fairness)
  std::atomic<bool> closed_{false};
  std::atomic<uint64_t> connections_{0};

  mutable std::mutex mu_;  // guards the tables below (innermost: see the lock rules above)
  std::unordered_map<std::string, std::shared_ptr<OutPeer>> out_;
  std::vector<std::weak_ptr<OutPeer>> handshaking_;  // out peers whose first handshake is pending
  std::vector<RefuseBody> refusals_;  // refusals a sender found (throw_if_refused_locked), for tidy()
  std::vector<std::weak_ptr<OutPeer>> reconnecting_;  // TCP out peers watched for new connections
  std::deque<DeferredLinkStep> deferred_link_steps_;  // see DeferredLinkStep
  std::atomic<bool> link_steps_deferred_{false};      // it is not empty (read without mu_)
  // By ZeroMQ routing id. Inserted and erased by the I/O thread only (other threads read it
  // under mu_), so the I/O thread may hold a reference across a message. Unauthenticated
  // entries are capped (XMESH_MAX_PENDING_PEERS): an identity flood evicts only them.
  std::unordered_map<std::string, InPeer> in_;
  size_t pending_peers_ = 0, max_pending_peers_ = 0;
  std::vector<std::string> ack_due_;  // identities owed an acknowledgement (I/O thread only)
  std::vector<std::string> gone_addrs_;
  std::map<std::string, std::string> addr_owners_;  // address -> the node id that said Hello from it
  std::vector<std::string> successors_;             // see take_successors()
  std::atomic<bool> has_successors_{false};
  std::set<std::string> expected_listening_;
  std::map<std::string, std::string> aliases_;  // a peer's unix-socket address -> its TCP one
  std::unordered_map<std::string, std::string> unix_of_;  // and back
  std::atomic<bool> has_aliases_{false};
  Cookies cookies_;
  LogBudget refusal_log_{3, 60000};
  LogBudget link_log_{3, 60000};
  // A link's break, said only if its peer is still there a moment later (kLinkNoteGraceMs): a
  // proc that ends (stopped, by its mesh or its agent) breaks its links before its exit is
  // known here, and that is its end, not a fault.
  struct LinkNote {
    std::string addr, text;
    int64_t due_ms;
  };
  static constexpr int64_t kLinkNoteGraceMs = 1500;
  std::mutex link_notes_mu_;
  std::vector<LinkNote> link_notes_;
  void say_due_link_notes();
  RingReaders rings_;
  size_t ring_bytes_ = 0;
  LinkBreakHandler link_break_handler_;
  std::array<std::unique_ptr<LinkKind>, kLinkKinds> kinds_;
  // Lanes being read, by their writer's address: accepted (in) and/or switched to (the writer's
  // LaneSwitch dispatched: read from then on, its messages admitted as from `identity`).
  struct LaneRead {
    std::unique_ptr<LaneIn> in;
    std::string identity;
    bool switched = false;
  };
  std::atomic<bool> lanes_on_{false};     // a lane listener is up
  bool lanes_write_ = true;               // XMESH_LANES (0: no lanes at all)
  mutable std::mutex lanes_mu_;           // guards the lane table (the I/O thread's, and stats/disconnect)
  std::unique_ptr<LaneListener> lane_listener_;
  std::string lane_host_;                 // the listener's host as askers reach it
  int lane_agent_port_ = 0;               // where askers reach it through its agent (0: directly)
  LaneListener::StreamAdopter stream_adopter_;  // given to the listener, now or once made
  std::map<std::string, LaneRead> lanes_in_;
  std::deque<Received> lane_ready_;       // messages read from lanes, for receive() (I/O thread)
  std::vector<pollfd> poll_fds_;  // receive_parts_with_lanes' (I/O thread)
  std::vector<std::string> poll_readers_;
  std::vector<int> listener_fds_;
  // Whether the routers' ZMQ_EVENTS must be read again before a sleep: set after any receive or
  // send on them (which may take the commands their ZMQ_FD signalled); routers_holding_ is what
  // the last read said (bit 0: router_, bit 1: the TCP router).
  std::atomic<bool> routers_stale_{true};
  unsigned routers_holding_ = 0;
  // Reached back (back_links.hpp). back_mu_ guards making the dialer and the pool (held only for
  // that and for reading the pointers); each has its own lock, innermost.
  std::atomic<bool> reach_back_{false};
  std::string back_token_;  // this node's, made with the dialer
  mutable std::mutex back_mu_;
  std::unique_ptr<BackDialer> back_dialer_;
  std::unique_ptr<BackPool> back_pool_;
  std::atomic<bool> has_back_pool_{false};
  std::vector<std::weak_ptr<OutPeer>> reroutes_;  // under mu_: left to the I/O thread
  // Its own lock (innermost): read while dialling, under mu_ or a peer's mu.
  mutable std::mutex gateway_mu_;
  std::string gateway_;
  // Counted without the lock (the send path takes only its peer's mutex).
  struct Counters {
    std::atomic<uint64_t> sent{0}, received{0}, rejected{0}, malformed{0}, gaps{0}, duplicates{0}, evicted{0},
        too_large{0}, resent{0}, reconnects{0}, lane_received{0};
    std::array<std::atomic<uint64_t>, kLinkKinds> link_sent{}, link_breaks{};
  } counts_;
};

}  // namespace xmesh
