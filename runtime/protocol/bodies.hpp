// The typed bodies of protocol messages: one definition of each body, written by its sender
// and read by its receivers on both sides, C++ here and Python through pybind11 (xmesh._core:
// `_core.StopProcsBody(alloc=...)`, `msg.proc_exited()`, `_core.AttachReply.from_dict(d)`),
// instead of JSON objects built in one language and read by string keys in the other.
//
// Each body lists its fields once, in `fields(f)`: f(wire name, member pointer, Need). That one
// list gives the JSON writer and reader (write_body / read_body below), the Python class's
// attributes and its keyword constructor (python/src/core_module.cpp, bind_body). Reading
// validates: a missing required field, a field of the wrong type or a value a body's check()
// refuses throws std::invalid_argument naming the body and the field. Unknown fields are
// ignored on the wire (a newer peer may add some), refused when Python builds a body.
// docs/ARCHITECTURE.md has the table of kinds and their bodies.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <limits>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace xmesh {

enum class Need { Required, Optional };

namespace body_detail {
template <class V>
struct is_optional : std::false_type {};
template <class V>
struct is_optional<std::optional<V>> : std::true_type {};
template <class T, class = void>
struct has_check : std::false_type {};
template <class T>
struct has_check<T, std::void_t<decltype(std::declval<T&>().check())>> : std::true_type {};
template <class V>
struct is_sequence : std::false_type {};
template <class E>
struct is_sequence<std::vector<E>> : std::true_type {};
template <class E, size_t N>
struct is_sequence<std::array<E, N>> : std::true_type {};

// Whether a JSON number fits the integer type V: the library's conversion of a float that does
// not (NaN, infinite, out of range, negative into unsigned) is undefined behaviour, and of an
// integer that does not a silent wrap. Found by fuzz_wire.
template <class V>
bool fits_integer(const nlohmann::json& j) {
  using L = std::numeric_limits<V>;
  if (j.is_number_float()) {
    double d = j.get<double>();
    return d >= static_cast<double>(L::min()) && d < static_cast<double>(L::max()) + 1.0;  // false for NaN
  }
  if (j.is_number_unsigned()) return j.get<uint64_t>() <= static_cast<uint64_t>(L::max());
  if (j.is_number_integer()) return std::is_signed_v<V> ? true : j.get<int64_t>() >= 0;
  return true;  // not a number: the conversion itself refuses it
}

// Every number in j that becomes an integer of V (or of its elements) fits it.
template <class V>
bool numbers_fit(const nlohmann::json& j) {
  if constexpr (std::is_integral_v<V> && !std::is_same_v<V, bool>) {
    return fits_integer<V>(j);
  } else if constexpr (is_optional<V>::value) {
    return numbers_fit<typename V::value_type>(j);
  } else if constexpr (is_sequence<V>::value) {
    if (!j.is_array()) return true;
    for (const auto& e : j)
      if (!numbers_fit<typename V::value_type>(e)) return false;
    return true;
  } else {
    return true;  // strings, maps of strings, json, nested bodies (read_body checks their fields)
  }
}
}  // namespace body_detail

template <class T>
void write_body(nlohmann::json& j, const T& b) {
  j = nlohmann::json::object();
  T::fields([&](const char* name, auto member, Need) {
    const auto& v = b.*member;
    using V = std::decay_t<decltype(v)>;
    if constexpr (body_detail::is_optional<V>::value) {
      if (v) j[name] = *v;
    } else {
      j[name] = v;
    }
  });
}

template <class T>
void read_body(const nlohmann::json& j, T& b) {
  if (!j.is_object()) throw std::invalid_argument(std::string(T::what) + " body is not an object");
  T::fields([&](const char* name, auto member, Need need) {
    auto& v = b.*member;
    using V = std::decay_t<decltype(v)>;
    auto it = j.find(name);
    if (it == j.end() || (it->is_null() && need == Need::Optional)) {
      if (need == Need::Required) throw std::invalid_argument(std::string(T::what) + " body without '" + name + "'");
      return;  // the default stays
    }
    if (!body_detail::numbers_fit<V>(*it))
      throw std::invalid_argument(std::string(T::what) + " body: '" + name + "' is out of range");
    try {
      if constexpr (body_detail::is_optional<V>::value)
        v = it->template get<typename V::value_type>();
      else
        v = it->template get<V>();
    } catch (const nlohmann::json::exception&) {
      throw std::invalid_argument(std::string(T::what) + " body: '" + name + "' has the wrong type");
    } catch (const std::invalid_argument& e) {  // a nested body's own error
      throw std::invalid_argument(std::string(T::what) + " body: '" + name + "': " + e.what());
    }
  });
  if constexpr (body_detail::has_check<T>::value) b.check();
}

// The one way a receiver reads a body: the body, or nullopt with *why naming the body and the
// field that did not read (read_body's message).
template <class T>
std::optional<T> read_as(const nlohmann::json& j, std::string* why = nullptr) {
  try {
    T out;
    read_body(j, out);
    return out;
  } catch (const std::invalid_argument& e) {
    if (why) *why = e.what();
    return std::nullopt;
  }
}

// Gives a body type its nlohmann to_json / from_json (found by argument-dependent lookup).
#define XMESH_BODY_JSON(T)                                                              \
  inline void to_json(nlohmann::json& j, const T& b) { write_body(j, b); }             \
  inline void from_json(const nlohmann::json& j, T& b) { read_body(j, b); }

using StringMap = std::map<std::string, std::string>;

// Hello (any -> any, first on every connection). Read by the node only.
struct HelloBody {
  static constexpr const char* what = "Hello";
  int proto = -1;                 // the protocol version (kinds.def, bodies)
  std::string version, build;     // the sender's xmesh version and build id
  std::string reply_cookie;       // the credential to present when connecting back
  std::string cookie;             // the credential it presents: checked here on key (TCP) links
  std::string addr, role, host;   // where it listens, "controller" / "proc" / "hostd", its hostname
  int64_t pid = 0;
  uint64_t max_message_bytes = 0;  // the largest message it sends or accepts
  // A link that resends (TCP): the sender keeps each message until the receiver acknowledges it
  // (an Ack back on the same connection) and, on a connection made again, says Hello and sends
  // again what was not acknowledged. `resume` is the number of the first message after this
  // Hello; `fresh` the first never sent before; `peer_incarnation` the receiver's incarnation as
  // its acks told (0: none came), so that a receiver that is another process (restarted at the
  // address) skips what was meant for its predecessor.
  bool acks = false;
  uint64_t resume = 1, fresh = 1, peer_incarnation = 0;
  // The sender's unix-socket address when `addr` is its TCP one (a controller using hosts over
  // TCP): handles made where it runs name it, and the receiver sends what is meant for it to addr.
  std::string also;
  template <class F>
  static void fields(F&& f) {
    f("proto", &HelloBody::proto, Need::Required);
    f("version", &HelloBody::version, Need::Optional);
    f("build", &HelloBody::build, Need::Optional);
    f("reply_cookie", &HelloBody::reply_cookie, Need::Optional);
    f("cookie", &HelloBody::cookie, Need::Optional);
    f("addr", &HelloBody::addr, Need::Optional);
    f("role", &HelloBody::role, Need::Optional);
    f("host", &HelloBody::host, Need::Optional);
    f("pid", &HelloBody::pid, Need::Optional);
    f("max_message_bytes", &HelloBody::max_message_bytes, Need::Optional);
    f("acks", &HelloBody::acks, Need::Optional);
    f("resume", &HelloBody::resume, Need::Optional);
    f("fresh", &HelloBody::fresh, Need::Optional);
    f("peer_incarnation", &HelloBody::peer_incarnation, Need::Optional);
    f("also", &HelloBody::also, Need::Optional);
  }
};
XMESH_BODY_JSON(HelloBody)

// The body of a failed Reply, of a call failed by supervision, and of a Fault (a broadcast's
// endpoint raised, nobody waits for it: proc -> controller): its kind (errors.def), the text to
// show, and the fields some kinds add.
struct ErrorBody {
  static constexpr const char* what = "error";
  std::string kind, text;
  // actor: where the endpoint raised (and the cell that made the call, for a Fault).
  std::optional<std::string> type, traceback, method, actor, host, cell;
  std::optional<int64_t> pid, rank;
  std::optional<nlohmann::json> coords;
  std::optional<nlohmann::json> shape;    // name-taken: the live allocation's shape
  std::optional<std::string> request;     // hostd: the kind of the request it failed
  std::optional<nlohmann::json> info;     // supervision: the ProcExited notice
  template <class F>
  static void fields(F&& f) {
    f("kind", &ErrorBody::kind, Need::Required);
    f("text", &ErrorBody::text, Need::Required);
    f("type", &ErrorBody::type, Need::Optional);
    f("traceback", &ErrorBody::traceback, Need::Optional);
    f("method", &ErrorBody::method, Need::Optional);
    f("actor", &ErrorBody::actor, Need::Optional);
    f("host", &ErrorBody::host, Need::Optional);
    f("cell", &ErrorBody::cell, Need::Optional);
    f("pid", &ErrorBody::pid, Need::Optional);
    f("rank", &ErrorBody::rank, Need::Optional);
    f("coords", &ErrorBody::coords, Need::Optional);
    f("shape", &ErrorBody::shape, Need::Optional);
    f("request", &ErrorBody::request, Need::Optional);
    f("info", &ErrorBody::info, Need::Optional);
  }
};
XMESH_BODY_JSON(ErrorBody)

// ProcExited (agent -> controller): a proc ended, after its pipes were drained.
struct ProcExitedBody {
  static constexpr const char* what = "ProcExited";
  std::string alloc;                  // the allocation's id
  int64_t rank = 0;
  int64_t pid = 0;
  std::string addr;                   // the proc's node address (now dead)
  std::string host;                   // the agent's hostname
  nlohmann::json coords = nlohmann::json::object();
  bool stopping = false;              // it was asked to stop (not a failure)
  std::string text;                   // "proc rank 3 (pid 123 on host) killed by SIGKILL; its last output: ..."
  std::optional<std::string> signal;  // "SIGKILL" when a signal ended it
  std::optional<int> exit_code;       // when it exited
  void check();
  template <class F>
  static void fields(F&& f) {
    f("alloc", &ProcExitedBody::alloc, Need::Required);
    f("rank", &ProcExitedBody::rank, Need::Required);
    f("pid", &ProcExitedBody::pid, Need::Optional);
    f("addr", &ProcExitedBody::addr, Need::Required);
    f("host", &ProcExitedBody::host, Need::Optional);
    f("coords", &ProcExitedBody::coords, Need::Optional);
    f("stopping", &ProcExitedBody::stopping, Need::Optional);
    f("text", &ProcExitedBody::text, Need::Required);
    f("signal", &ProcExitedBody::signal, Need::Optional);
    f("exit_code", &ProcExitedBody::exit_code, Need::Optional);
  }
};
XMESH_BODY_JSON(ProcExitedBody)

// Log (agent -> controller): complete lines of one proc stream; the text is the payload frame.
struct LogBody {
  static constexpr const char* what = "Log";
  std::string alloc;
  int64_t rank = 0;
  int64_t pid = 0;
  std::string stream = "stdout";  // "stdout" or "stderr"
  double time = 0;                // when the agent read them (seconds since the epoch)
  std::string cell, actor;        // the context of the last output marker (the call's cell)
  uint64_t mark = 0;              // the last output marker passed on this stream
  bool eof = false;               // the stream ended (the proc closed it or exited)
  void check() const;
  template <class F>
  static void fields(F&& f) {
    f("alloc", &LogBody::alloc, Need::Required);
    f("rank", &LogBody::rank, Need::Required);
    f("pid", &LogBody::pid, Need::Optional);
    f("stream", &LogBody::stream, Need::Required);
    f("time", &LogBody::time, Need::Optional);
    f("cell", &LogBody::cell, Need::Optional);
    f("actor", &LogBody::actor, Need::Optional);
    f("mark", &LogBody::mark, Need::Optional);
    f("eof", &LogBody::eof, Need::Optional);
  }
};
XMESH_BODY_JSON(LogBody)

// Cancel (controller -> proc): cancel one target of a call.
struct CancelBody {
  static constexpr const char* what = "Cancel";
  uint64_t corr = 0;  // the call's correlation id
  int64_t index = 0;  // which of its targets
  template <class F>
  static void fields(F&& f) {
    f("corr", &CancelBody::corr, Need::Required);
    f("index", &CancelBody::index, Need::Required);
  }
};
XMESH_BODY_JSON(CancelBody)

// Call (caller -> actor): absent on the fast path (the whole actor mesh called, the reply to the
// caller). Present when the message's point is not the actor's own (a slice, a renamed or
// reshaped mesh, choose), when the reply goes to a port (send(..., port=)), or when a plain
// method is called as an endpoint (as_endpoint()).
struct CallBody {
  static constexpr const char* what = "Call";
  std::optional<std::vector<std::string>> labels;  // the called mesh's extent: its dimensions
  std::optional<std::vector<int64_t>> sizes;       //   and their sizes (both or neither)
  std::optional<int64_t> rank;        // the message's rank in that extent (default: its target index)
  std::optional<std::string> reply_addr;  // the reply goes to this port instead of the caller
  std::optional<uint64_t> reply_corr;     //   (owner's address and the port's id; both or neither)
  std::optional<bool> as_endpoint;    // the method is a plain one, called as an endpoint (as_endpoint())
  std::optional<bool> explicit_port;  //   taking a Port first (as_endpoint(..., explicit_response_port=True))
  template <class F>
  static void fields(F&& f) {
    f("labels", &CallBody::labels, Need::Optional);
    f("as_endpoint", &CallBody::as_endpoint, Need::Optional);
    f("explicit_port", &CallBody::explicit_port, Need::Optional);
    f("sizes", &CallBody::sizes, Need::Optional);
    f("rank", &CallBody::rank, Need::Optional);
    f("reply_addr", &CallBody::reply_addr, Need::Optional);
    f("reply_corr", &CallBody::reply_corr, Need::Optional);
  }
  void check() const;
};
XMESH_BODY_JSON(CallBody)

// Configure (controller -> proc): settings; only those present change.
struct ConfigureBody {
  static constexpr const char* what = "Configure";
  std::optional<int> log_level;     // the procs' Python logging level
  std::optional<bool> post_mortem;  // stop in pdb where an endpoint raises
  template <class F>
  static void fields(F&& f) {
    f("log_level", &ConfigureBody::log_level, Need::Optional);
    f("post_mortem", &ConfigureBody::post_mortem, Need::Optional);
  }
};
XMESH_BODY_JSON(ConfigureBody)

// Adopt (controller -> proc of a named allocation it attached, or sharing a cookie).
struct AdoptBody {
  static constexpr const char* what = "Adopt";
  std::vector<std::string> cookies;  // to accept from now on
  std::vector<std::string> refuse;   // controllers whose calls are refused from now on
  std::string refuse_text;           // what they are told
  template <class F>
  static void fields(F&& f) {
    f("cookies", &AdoptBody::cookies, Need::Optional);
    f("refuse", &AdoptBody::refuse, Need::Optional);
    f("refuse_text", &AdoptBody::refuse_text, Need::Optional);
  }
};
XMESH_BODY_JSON(AdoptBody)

// PeerDead: a peer address died (relayed to procs; a host loss goes to the node's own control
// inbox with host_lost).
struct PeerDeadBody {
  static constexpr const char* what = "PeerDead";
  std::string addr;
  nlohmann::json error = nlohmann::json::object();  // the error body calls to it fail with
  bool host_lost = false;
  void check();
  template <class F>
  static void fields(F&& f) {
    f("addr", &PeerDeadBody::addr, Need::Required);
    f("error", &PeerDeadBody::error, Need::Optional);
    f("host_lost", &PeerDeadBody::host_lost, Need::Optional);
  }
};
XMESH_BODY_JSON(PeerDeadBody)

// RingOffer (a node -> a node of its host): a shared-memory ring for the sender's messages to
// the receiver (runtime/transport/ring_links.hpp), to be opened at /proc/<pid>/fd/<fd> and recognised by
// its token.
struct RingOfferBody {
  static constexpr const char* what = "RingOffer";
  int64_t pid = 0;
  int64_t fd = -1;
  uint64_t token = 0;
  uint64_t max_message_bytes = 0;  // the writer's own limit (named when a message is over the reader's)
  template <class F>
  static void fields(F&& f) {
    f("pid", &RingOfferBody::pid, Need::Required);
    f("fd", &RingOfferBody::fd, Need::Required);
    f("token", &RingOfferBody::token, Need::Required);
    f("max_message_bytes", &RingOfferBody::max_message_bytes, Need::Optional);
  }
};
XMESH_BODY_JSON(RingOfferBody)

// BufferLease (-> an RDMA buffer's owner; the data plane, buffer_registry.hpp): a lease on
// [offset, offset + size) of buffer `buffer`, for reading it or (write) writing into it.
// Answered with a BufferLeaseReply, or a Buffer error saying why not.
// The reader says its host (util.hpp host_key): another host's (or stream: the reader asks for
// it) gets a stream grant (buffer_stream.hpp), a reader of the owner's host the pid and address.
// Small ranges (at most kInlineBytes) from another host travel in the messages themselves:
// a read's answer carries the bytes (inline: the reader takes them so), a write's request
// carries them in its one frame (inline), and no lease outlives the exchange.
// (Well under a shared-memory ring's size: the owner answers on its reading thread, which
// never waits for room, and a message larger than the ring never fits it.)
constexpr uint64_t kInlineBytes = 64 << 10;
struct BufferLeaseBody {
  static constexpr const char* what = "BufferLease";
  uint64_t buffer = 0, offset = 0, size = 0;
  bool write = false;
  std::string host;
  bool stream = false;
  bool inline_ = false;
  std::string rdma;  // the reader's RDMA address for its link to this owner (rdma_nic.hpp), or ""
  template <class F>
  static void fields(F&& f) {
    f("buffer", &BufferLeaseBody::buffer, Need::Required);
    f("offset", &BufferLeaseBody::offset, Need::Optional);
    f("size", &BufferLeaseBody::size, Need::Required);
    f("write", &BufferLeaseBody::write, Need::Optional);
    f("host", &BufferLeaseBody::host, Need::Optional);
    f("stream", &BufferLeaseBody::stream, Need::Optional);
    f("inline", &BufferLeaseBody::inline_, Need::Optional);
    f("rdma", &BufferLeaseBody::rdma, Need::Optional);
  }
};
XMESH_BODY_JSON(BufferLeaseBody)

// Where a leased range is: the owner's host (util.hpp host_key: a reader with the same key
// copies by pid), pid and the range's address there, and the lease's number (for BufferRelease);
// for a stream, the owner's stream listener ("tcp://host:port"), the grant's token and key (hex)
// and the cipher its records are sealed with. A reader that offered an RDMA address gets the
// owner's link's address and the buffer's rkey (addr is then where the range starts for RDMA),
// or why not (rdma_why: the reader streams).
struct BufferLeaseReply {
  static constexpr const char* what = "BufferLease reply";
  int64_t pid = 0;
  uint64_t addr = 0, lease = 0, rkey = 0;
  std::string host, stream, token, key, cipher, rdma, rdma_why;
  bool inline_ = false;  // the bytes are done: read, in the answer's frame; written, in place
  // The buffer is device memory, the range staged in host memory: a write's release must say
  // it is complete and wait for its answer (the bytes reach the device then).
  bool device = false;
  // The range is device memory the owner's NIC reaches itself (dma-buf): RDMA only, no stream
  // grant (a reader whose RDMA fails ends the lease and asks again without offering RDMA).
  bool direct = false;
  template <class F>
  static void fields(F&& f) {
    f("pid", &BufferLeaseReply::pid, Need::Required);
    f("addr", &BufferLeaseReply::addr, Need::Required);
    f("lease", &BufferLeaseReply::lease, Need::Required);
    f("host", &BufferLeaseReply::host, Need::Optional);
    f("stream", &BufferLeaseReply::stream, Need::Optional);
    f("token", &BufferLeaseReply::token, Need::Optional);
    f("key", &BufferLeaseReply::key, Need::Optional);
    f("cipher", &BufferLeaseReply::cipher, Need::Optional);
    f("inline", &BufferLeaseReply::inline_, Need::Optional);
    f("rdma", &BufferLeaseReply::rdma, Need::Optional);
    f("rkey", &BufferLeaseReply::rkey, Need::Optional);
    f("rdma_why", &BufferLeaseReply::rdma_why, Need::Optional);
    f("device", &BufferLeaseReply::device, Need::Optional);
    f("direct", &BufferLeaseReply::direct, Need::Optional);
  }
};
XMESH_BODY_JSON(BufferLeaseReply)

// BufferRelease (-> the owner): the lease ended; complete: a write's bytes all arrived (a
// device buffer's staged bytes are then copied in, answered when asked with a reply).
// BufferDrop (-> the owner): lend the buffer no more (lease 0), answered with the leases that
// still hold it.
struct BufferReleaseBody {
  static constexpr const char* what = "BufferRelease";
  uint64_t buffer = 0, lease = 0;
  bool complete = false;
  template <class F>
  static void fields(F&& f) {
    f("buffer", &BufferReleaseBody::buffer, Need::Required);
    f("lease", &BufferReleaseBody::lease, Need::Optional);
    f("complete", &BufferReleaseBody::complete, Need::Optional);
  }
};
XMESH_BODY_JSON(BufferReleaseBody)

// RingAccept (the receiver of an offer -> its sender): the ring (its token) is mapped, and the
// receiver's doorbell is at /proc/<pid>/fd/<bell_fd>; or, ok false, why it is not used.
struct RingAcceptBody {
  static constexpr const char* what = "RingAccept";
  uint64_t token = 0;  // the offered ring's
  bool ok = false;
  std::string reason;
  int64_t pid = 0;
  int64_t bell_fd = -1;
  uint64_t bell_token = 0;
  template <class F>
  static void fields(F&& f) {
    f("token", &RingAcceptBody::token, Need::Required);
    f("ok", &RingAcceptBody::ok, Need::Required);
    f("reason", &RingAcceptBody::reason, Need::Optional);
    f("pid", &RingAcceptBody::pid, Need::Optional);
    f("bell_fd", &RingAcceptBody::bell_fd, Need::Optional);
    f("bell_token", &RingAcceptBody::bell_token, Need::Optional);
  }
};
XMESH_BODY_JSON(RingAcceptBody)

// LaneOffer (the receiver of a LaneAsk -> the asker): connect to host:port (via: through the host
// agent listening there, a SOCKS5 CONNECT to that loopback port of the receiver's), present the
// token and seal with the key (runtime/transport/tcp_lane.hpp; both hex, sent over the CURVE-encrypted
// link); or, ok false, why there is no lane (the link stays on ZeroMQ).
struct LaneOfferBody {
  static constexpr const char* what = "LaneOffer";
  bool ok = false;
  std::string reason;
  std::string host;
  int64_t port = 0, via = 0;
  std::string key, token;
  template <class F>
  static void fields(F&& f) {
    f("ok", &LaneOfferBody::ok, Need::Required);
    f("via", &LaneOfferBody::via, Need::Optional);
    f("reason", &LaneOfferBody::reason, Need::Optional);
    f("host", &LaneOfferBody::host, Need::Optional);
    f("port", &LaneOfferBody::port, Need::Optional);
    f("key", &LaneOfferBody::key, Need::Optional);
    f("token", &LaneOfferBody::token, Need::Optional);
  }
};
XMESH_BODY_JSON(LaneOfferBody)

// Cast trees (runtime/cast/cast_tree.hpp). One target behind a relay, as its message lists it.
struct CastTarget {
  static constexpr const char* what = "CastTarget";
  std::string addr;    // its proc's node address
  std::string actor;   // its actor's name there
  int64_t index = 0;   // its index in the origin's call (answers carry it)
  uint64_t oseq = 0;   // its order number from the origin (Header::oseq)
  std::string local;   // its unix socket, when known: a relay on its host sends there ("": none)
  void check() const {
    if (addr.empty()) throw std::invalid_argument("CastTarget: 'addr' is empty");
    if (index < 0) throw std::invalid_argument("CastTarget: 'index' is negative");
  }
  template <class F>
  static void fields(F&& f) {
    f("a", &CastTarget::addr, Need::Required);
    f("n", &CastTarget::actor, Need::Required);
    f("i", &CastTarget::index, Need::Required);
    f("u", &CastTarget::oseq, Need::Required);
    f("l", &CastTarget::local, Need::Optional);
  }
};
XMESH_BODY_JSON(CastTarget)

// The "cast" part of an actor message's body in a cast tree: who made it (absent in the
// origin's own messages, whose sender is the origin) and the targets the receiver relays it to.
struct CastBody {
  static constexpr const char* what = "Cast";
  std::optional<std::string> origin;       // the origin's address (as the first relay knew it)
  std::optional<std::string> origin_id;    // the origin's node id (its messages' order is per id)
  int64_t fanout = 16;                     // how many messages a relay sends at most
  std::vector<CastTarget> behind;          // the receiver's slice of the targets, itself excluded
  void check() const {
    if (fanout < 2 || fanout > 4096) throw std::invalid_argument("Cast: 'fanout' is not within 2..4096");
  }
  template <class F>
  static void fields(F&& f) {
    f("o", &CastBody::origin, Need::Optional);
    f("s", &CastBody::origin_id, Need::Optional);
    f("f", &CastBody::fanout, Need::Optional);
    f("t", &CastBody::behind, Need::Optional);
  }
};
XMESH_BODY_JSON(CastBody)

// One answer in a Replies message: the payload frames of the answers follow in order, `frames`
// of them for this one.
struct ReplyEntry {
  static constexpr const char* what = "ReplyEntry";
  int64_t index = 0;
  bool ok = false;
  nlohmann::json body;   // the error, when not ok
  int64_t frames = 0;
  void check() const {
    if (index < 0) throw std::invalid_argument("ReplyEntry: 'index' is negative");
    if (frames < 0) throw std::invalid_argument("ReplyEntry: 'frames' is negative");
  }
  template <class F>
  static void fields(F&& f) {
    f("i", &ReplyEntry::index, Need::Required);
    f("k", &ReplyEntry::ok, Need::Required);
    f("b", &ReplyEntry::body, Need::Optional);
    f("f", &ReplyEntry::frames, Need::Required);
  }
};
XMESH_BODY_JSON(ReplyEntry)

// Replies (a relay or a target behind one -> the next node up a cast tree): answers to the
// origin's call (Header::corr) of targets behind the sender.
struct RepliesBody {
  static constexpr const char* what = "Replies";
  std::string origin;               // the call's origin address
  std::vector<ReplyEntry> replies;  // at least one
  void check() const {
    if (replies.empty()) throw std::invalid_argument("Replies: 'replies' is empty");
  }
  template <class F>
  static void fields(F&& f) {
    f("o", &RepliesBody::origin, Need::Required);
    f("r", &RepliesBody::replies, Need::Required);
  }
};
XMESH_BODY_JSON(RepliesBody)

// CastLost (origin -> a target behind a relay that died): the messages with these order
// numbers will not come; the target stops waiting for them (and drops them if they still do).
// Also (a shared-memory link that broke) every number up to `t` that has not come.
struct CastLostBody {
  static constexpr const char* what = "CastLost";
  std::vector<uint64_t> oseqs;
  std::optional<std::string> origin_id;  // whose numbers (default: the sender's)
  uint64_t through = 0;
  template <class F>
  static void fields(F&& f) {
    f("u", &CastLostBody::oseqs, Need::Required);
    f("s", &CastLostBody::origin_id, Need::Optional);
    f("t", &CastLostBody::through, Need::Optional);
  }
};
XMESH_BODY_JSON(CastLostBody)

// RingBroken (a node -> the other end of a shared-memory link): the link with this token broke
// (its records or positions do not read, or its reader closed it): what was on it is lost. The
// receiver forgets the link too and fails the calls in flight between the two.
struct RingBrokenBody {
  static constexpr const char* what = "RingBroken";
  uint64_t token = 0;
  std::string why;
  template <class F>
  static void fields(F&& f) {
    f("token", &RingBrokenBody::token, Need::Required);
    f("why", &RingBrokenBody::why, Need::Optional);
  }
};
XMESH_BODY_JSON(RingBrokenBody)

// Reload (controller -> actor host): reload the modules of these synced files.
struct ReloadBody {
  static constexpr const char* what = "Reload";
  std::vector<std::string> files;  // absolute paths on the proc's host
  template <class F>
  static void fields(F&& f) {
    f("files", &ReloadBody::files, Need::Required);
  }
};
XMESH_BODY_JSON(ReloadBody)

// SpawnProcs (controller -> agent): start the procs of one allocation on this host.
struct SpawnRank {
  static constexpr const char* what = "SpawnProcs rank";
  int64_t rank = 0;
  nlohmann::json coords = nlohmann::json::object();
  std::string addr;  // its node address; empty: the agent's default (runtime/base/layout.hpp)
  StringMap env;     // added to the allocation's environment for this rank
  template <class F>
  static void fields(F&& f) {
    f("rank", &SpawnRank::rank, Need::Required);
    f("coords", &SpawnRank::coords, Need::Optional);
    f("addr", &SpawnRank::addr, Need::Optional);
    f("env", &SpawnRank::env, Need::Optional);
  }
};
XMESH_BODY_JSON(SpawnRank)

struct SpawnProcsBody {
  static constexpr const char* what = "SpawnProcs";
  std::string alloc;                 // the allocation's id: 1-16 lowercase hex digits
  std::string name;                 // its name ("" unless named)
  std::vector<std::string> argv;     // what each proc runs
  StringMap env;                     // the environment of every proc
  std::string cwd;
  std::vector<SpawnRank> ranks;      // at least one
  nlohmann::json shape = nlohmann::json::object();  // the whole mesh's (runtime/base/shape.hpp JSON)
  int64_t controller_pid = 0;
  void check() const;
  template <class F>
  static void fields(F&& f) {
    f("alloc", &SpawnProcsBody::alloc, Need::Required);
    f("name", &SpawnProcsBody::name, Need::Optional);
    f("argv", &SpawnProcsBody::argv, Need::Required);
    f("env", &SpawnProcsBody::env, Need::Required);
    f("cwd", &SpawnProcsBody::cwd, Need::Optional);
    f("ranks", &SpawnProcsBody::ranks, Need::Required);
    f("shape", &SpawnProcsBody::shape, Need::Optional);
    f("controller_pid", &SpawnProcsBody::controller_pid, Need::Optional);
  }
};
XMESH_BODY_JSON(SpawnProcsBody)

// A proc the agent started (SpawnProcs reply), or found (Attach reply, Status).
struct ProcEntry {
  static constexpr const char* what = "proc";
  int64_t rank = 0;
  int64_t pid = 0;
  std::string addr;
  bool alive = true;
  nlohmann::json coords = nlohmann::json::object();
  std::string state;  // "stopped", "in the kernel" when not running normally ("" when it is)
  uint64_t log_lost_bytes = 0;  // bytes its log file could not keep (a full disk), and why
  std::string log_error;
  template <class F>
  static void fields(F&& f) {
    f("rank", &ProcEntry::rank, Need::Required);
    f("pid", &ProcEntry::pid, Need::Required);
    f("addr", &ProcEntry::addr, Need::Optional);
    f("alive", &ProcEntry::alive, Need::Optional);
    f("state", &ProcEntry::state, Need::Optional);
    f("log_lost_bytes", &ProcEntry::log_lost_bytes, Need::Optional);
    f("log_error", &ProcEntry::log_error, Need::Optional);
    f("coords", &ProcEntry::coords, Need::Optional);
  }
};
XMESH_BODY_JSON(ProcEntry)

struct SpawnProcsReply {
  static constexpr const char* what = "SpawnProcs reply";
  std::string alloc, host;
  std::vector<ProcEntry> procs;
  std::string logdir;  // where the agent writes their log records
  template <class F>
  static void fields(F&& f) {
    f("alloc", &SpawnProcsReply::alloc, Need::Required);
    f("host", &SpawnProcsReply::host, Need::Optional);
    f("procs", &SpawnProcsReply::procs, Need::Required);
    f("logdir", &SpawnProcsReply::logdir, Need::Optional);
  }
};
XMESH_BODY_JSON(SpawnProcsReply)

// StopProcs (controller -> agent): stop an allocation, by id or (a live named one) by name.
struct StopProcsBody {
  static constexpr const char* what = "StopProcs";
  std::string alloc, name;
  bool immediately = false;  // SIGKILL now, not SIGTERM and a grace period
  void check() const;
  template <class F>
  static void fields(F&& f) {
    f("alloc", &StopProcsBody::alloc, Need::Optional);
    f("name", &StopProcsBody::name, Need::Optional);
    f("immediately", &StopProcsBody::immediately, Need::Optional);
  }
};
XMESH_BODY_JSON(StopProcsBody)

struct StopProcsReply {
  static constexpr const char* what = "StopProcs reply";
  std::string alloc, name;
  template <class F>
  static void fields(F&& f) {
    f("alloc", &StopProcsReply::alloc, Need::Required);
    f("name", &StopProcsReply::name, Need::Optional);
  }
};
XMESH_BODY_JSON(StopProcsReply)

// Attach (controller -> agent): take over a live named allocation, or only look (observe).
struct AttachBody {
  static constexpr const char* what = "Attach";
  std::string name;
  int64_t controller_pid = 0;
  bool observe = false;  // `xmesh sync --reload`: reach the procs without owning them
  template <class F>
  static void fields(F&& f) {
    f("name", &AttachBody::name, Need::Required);
    f("controller_pid", &AttachBody::controller_pid, Need::Optional);
    f("observe", &AttachBody::observe, Need::Optional);
  }
};
XMESH_BODY_JSON(AttachBody)

// The controller that owned an allocation before an Attach.
struct PreviousOwner {
  static constexpr const char* what = "previous owner";
  std::string addr, id;
  int64_t pid = 0;
  bool attached = false;  // it was still connected (it is now refused)
  template <class F>
  static void fields(F&& f) {
    f("addr", &PreviousOwner::addr, Need::Optional);
    f("id", &PreviousOwner::id, Need::Optional);
    f("pid", &PreviousOwner::pid, Need::Optional);
    f("attached", &PreviousOwner::attached, Need::Optional);
  }
};
XMESH_BODY_JSON(PreviousOwner)

struct AttachReply {
  static constexpr const char* what = "Attach reply";
  std::string alloc, name;
  nlohmann::json shape = nlohmann::json::object();
  double created = 0;      // seconds since the epoch
  std::string host;
  std::string job_cookie;  // what the procs accept
  std::vector<ProcEntry> procs;
  PreviousOwner previous;
  template <class F>
  static void fields(F&& f) {
    f("alloc", &AttachReply::alloc, Need::Required);
    f("name", &AttachReply::name, Need::Required);
    f("shape", &AttachReply::shape, Need::Optional);
    f("created", &AttachReply::created, Need::Optional);
    f("host", &AttachReply::host, Need::Optional);
    f("job_cookie", &AttachReply::job_cookie, Need::Optional);
    f("procs", &AttachReply::procs, Need::Required);
    f("previous", &AttachReply::previous, Need::Optional);
  }
};
XMESH_BODY_JSON(AttachReply)

// Status (-> agent) is answered with what the agent runs.
struct AllocationStatus {
  static constexpr const char* what = "allocation status";
  std::string alloc, name;
  std::string controller;  // the owning controller's node id
  int64_t controller_pid = 0;
  bool attached = false;   // its controller is connected
  nlohmann::json shape = nlohmann::json::object();
  double created = 0;
  bool stopping = false;
  std::vector<ProcEntry> procs;
  template <class F>
  static void fields(F&& f) {
    f("alloc", &AllocationStatus::alloc, Need::Required);
    f("name", &AllocationStatus::name, Need::Optional);
    f("controller", &AllocationStatus::controller, Need::Optional);
    f("controller_pid", &AllocationStatus::controller_pid, Need::Optional);
    f("attached", &AllocationStatus::attached, Need::Optional);
    f("shape", &AllocationStatus::shape, Need::Optional);
    f("created", &AllocationStatus::created, Need::Optional);
    f("stopping", &AllocationStatus::stopping, Need::Optional);
    f("procs", &AllocationStatus::procs, Need::Optional);
  }
};
XMESH_BODY_JSON(AllocationStatus)

// What an agent's one TCP port (PortMux) did so far: connections taken, spliced to the agent or
// to a proc, lanes handed over to their proc, refused, closed before authenticating to make room
// for newer ones (a flood of half-open connections).
struct PortCounts {
  static constexpr const char* what = "port counts";
  uint64_t accepted = 0, relayed_to_agent = 0, relayed_to_procs = 0, lanes_handed_over = 0, refused = 0;
  uint64_t evicted = 0;
  template <class F>
  static void fields(F&& f) {
    f("accepted", &PortCounts::accepted, Need::Optional);
    f("relayed_to_agent", &PortCounts::relayed_to_agent, Need::Optional);
    f("relayed_to_procs", &PortCounts::relayed_to_procs, Need::Optional);
    f("lanes_handed_over", &PortCounts::lanes_handed_over, Need::Optional);
    f("refused", &PortCounts::refused, Need::Optional);
    f("evicted", &PortCounts::evicted, Need::Optional);
  }
};
XMESH_BODY_JSON(PortCounts)

struct StatusReply {
  static constexpr const char* what = "Status reply";
  int64_t pid = 0;
  std::string host, version, build;
  int protocol = 0;
  std::string runtime_dir, workspace;  // the agent's runtime directory and workspace root
  uint64_t sync_bytes_received = 0;
  std::vector<AllocationStatus> allocations;
  PortCounts port;  // all 0 for an agent without a TCP port
  template <class F>
  static void fields(F&& f) {
    f("pid", &StatusReply::pid, Need::Required);
    f("host", &StatusReply::host, Need::Optional);
    f("version", &StatusReply::version, Need::Optional);
    f("build", &StatusReply::build, Need::Optional);
    f("protocol", &StatusReply::protocol, Need::Optional);
    f("runtime_dir", &StatusReply::runtime_dir, Need::Optional);
    f("workspace", &StatusReply::workspace, Need::Optional);
    f("sync_bytes_received", &StatusReply::sync_bytes_received, Need::Optional);
    f("allocations", &StatusReply::allocations, Need::Required);
    f("port", &StatusReply::port, Need::Optional);
  }
};
XMESH_BODY_JSON(StatusReply)

// SpawnActor (controller or proc -> proc): create one actor of a mesh; the payload is the pickled
// (class, args, kwargs). Answered with {pid, host} or the error __init__ raised.
struct SpawnActorBody {
  static constexpr const char* what = "SpawnActor";
  std::string name;                // the actor mesh's name
  std::string class_name;          // the class's qualified name (for messages)
  std::string shape;               // the actor mesh's shape (runtime/base/shape.hpp JSON text)
  std::vector<int64_t> proc_ranks;  // the procs it spans, by rank in their allocation
  template <class F>
  static void fields(F&& f) {
    f("name", &SpawnActorBody::name, Need::Required);
    f("class_name", &SpawnActorBody::class_name, Need::Optional);
    f("shape", &SpawnActorBody::shape, Need::Required);
    f("proc_ranks", &SpawnActorBody::proc_ranks, Need::Optional);
  }
};
XMESH_BODY_JSON(SpawnActorBody)

// A live actor as its proc describes it (ProcInfo reply): what a controller that attaches later
// needs to call it without its class.
struct ActorRecord {
  static constexpr const char* what = "actor record";
  std::string actor_id, name, class_name;
  std::vector<std::string> endpoints;
  std::string shape;  // the actor mesh's shape (JSON text)
  std::vector<int64_t> proc_ranks;
  double spawned = 0;  // seconds since the epoch
  // By endpoint, as endpoints: its signature without self ("(n: int) -> int"), and the first
  // line of its docstring (completion and inspection in a kernel without the class).
  std::vector<std::string> signatures, summaries;
  template <class F>
  static void fields(F&& f) {
    f("actor_id", &ActorRecord::actor_id, Need::Required);
    f("name", &ActorRecord::name, Need::Required);
    f("class_name", &ActorRecord::class_name, Need::Optional);
    f("endpoints", &ActorRecord::endpoints, Need::Optional);
    f("shape", &ActorRecord::shape, Need::Required);
    f("proc_ranks", &ActorRecord::proc_ranks, Need::Optional);
    f("spawned", &ActorRecord::spawned, Need::Optional);
    f("signatures", &ActorRecord::signatures, Need::Optional);
    f("summaries", &ActorRecord::summaries, Need::Optional);
  }
};
XMESH_BODY_JSON(ActorRecord)

// Refuse (any -> any): why a connection is refused (version, credentials).
struct RefuseBody {
  static constexpr const char* what = "Refuse";
  std::string reason, addr;  // the text, and the address of the refusing node
  std::string connection;    // the refused connection's routing id (none: a handshake verdict, an older peer)
  template <class F>
  static void fields(F&& f) {
    f("reason", &RefuseBody::reason, Need::Optional);
    f("addr", &RefuseBody::addr, Need::Optional);
    f("connection", &RefuseBody::connection, Need::Optional);
  }
};
XMESH_BODY_JSON(RefuseBody)

// What a Reload did in one process.
struct ReloadReply {
  static constexpr const char* what = "Reload reply";
  std::vector<std::string> reloaded;                  // module names
  std::vector<std::vector<std::string>> failed;       // [module, error text]
  int64_t classes = 0;                                // classes whose live instances now use the new code
  template <class F>
  static void fields(F&& f) {
    f("reloaded", &ReloadReply::reloaded, Need::Optional);
    f("failed", &ReloadReply::failed, Need::Optional);
    f("classes", &ReloadReply::classes, Need::Optional);
  }
};
XMESH_BODY_JSON(ReloadReply)

// ReadLog (controller -> agent): the per-rank log files stay on each host and are read through
// its agent. `dir` is a log directory's name under the agent's logs root ("<name>-<alloc>");
// with no `file` the reply lists its files, else it carries up to max_bytes of `file` from
// `offset` as its payload. With neither, the reply lists the log directories (size 0).
struct ReadLogBody {
  static constexpr const char* what = "ReadLog";
  std::string dir;
  std::string file;       // "procs.json" or a rank's log file ("" lists the directory)
  int64_t offset = 0;
  int64_t max_bytes = 8 << 20;
  template <class F>
  static void fields(F&& f) {
    f("dir", &ReadLogBody::dir, Need::Required);
    f("file", &ReadLogBody::file, Need::Optional);
    f("offset", &ReadLogBody::offset, Need::Optional);
    f("max_bytes", &ReadLogBody::max_bytes, Need::Optional);
  }
  void check() const;
};
XMESH_BODY_JSON(ReadLogBody)

struct LogFileEntry {
  static constexpr const char* what = "log file entry";
  std::string name;
  int64_t size = 0;
  template <class F>
  static void fields(F&& f) {
    f("name", &LogFileEntry::name, Need::Required);
    f("size", &LogFileEntry::size, Need::Required);
  }
};
XMESH_BODY_JSON(LogFileEntry)

// The answer to ReadLog: the directory's files (a listing), or the size of the file read (its
// bytes from the offset are the payload).
struct ReadLogReply {
  static constexpr const char* what = "ReadLog reply";
  std::vector<LogFileEntry> files;
  int64_t size = 0;
  template <class F>
  static void fields(F&& f) {
    f("files", &ReadLogReply::files, Need::Optional);
    f("size", &ReadLogReply::size, Need::Optional);
  }
};
XMESH_BODY_JSON(ReadLogReply)

// ProcInfo (controller -> proc): its pid and live actors (and, for `where`, what async
// endpoints await).
struct ProcInfoBody {
  static constexpr const char* what = "ProcInfo";
  bool async_stacks = false;
  template <class F>
  static void fields(F&& f) {
    f("async_stacks", &ProcInfoBody::async_stacks, Need::Optional);
  }
};
XMESH_BODY_JSON(ProcInfoBody)

struct ProcInfoReply {
  static constexpr const char* what = "ProcInfo reply";
  int64_t pid = 0;
  std::vector<ActorRecord> actors;
  std::optional<nlohmann::json> async_stacks;       // asked for: {thread label: [frames]}
  template <class F>
  static void fields(F&& f) {
    f("pid", &ProcInfoReply::pid, Need::Required);
    f("actors", &ProcInfoReply::actors, Need::Optional);
    f("async_stacks", &ProcInfoReply::async_stacks, Need::Optional);
  }
};
XMESH_BODY_JSON(ProcInfoReply)

// DumpStacks (controller -> proc) is answered from the I/O thread (the dump taken with the GIL by
// a helper thread, or without it when the GIL stays held: python/src/debugger_bindings.cpp), with every
// thread's Python stack as CPython's fault handler writes it and what runs on each thread.
struct DumpStacksReply {
  static constexpr const char* what = "DumpStacks reply";
  std::string stacks;                         // _Py_DumpTracebackThreads' text
  std::map<std::string, std::string> labels;  // thread ident -> "mesh\trank" of the actor it runs
  int64_t pid = 0;
  std::optional<std::string> error;           // what kept part of the dump from being taken
  template <class F>
  static void fields(F&& f) {
    f("stacks", &DumpStacksReply::stacks, Need::Required);
    f("labels", &DumpStacksReply::labels, Need::Optional);
    f("pid", &DumpStacksReply::pid, Need::Optional);
    f("error", &DumpStacksReply::error, Need::Optional);
  }
};
XMESH_BODY_JSON(DumpStacksReply)

// FlushOutput (controller -> actor host) is answered with the output marker it wrote.
struct FlushOutputReply {
  static constexpr const char* what = "FlushOutput reply";
  uint64_t m = 0;
  template <class F>
  static void fields(F&& f) {
    f("m", &FlushOutputReply::m, Need::Required);
  }
};
XMESH_BODY_JSON(FlushOutputReply)

// DebugEvent (proc -> controller): a pdb session stopped (prompt), runs, ended, or needs the
// source of files the proc does not have (sources).
struct DebugEventBody {
  static constexpr const char* what = "DebugEvent";
  std::string ev;             // "prompt", "running", "ended", "sources", "pause" (reason: "pausing",
                              // "idle"; for each actor rank a pause reached)
  std::string sid;            // the session, unique in its proc
  std::string out;            // pdb's output since the last event
  bool stop = false;          // prompt: a new stop (not the answer to a command)
  bool gone = false;          // ended: the controller asked about a session that had ended
  nlohmann::json stack = nlohmann::json::array();  // prompt+stop: [[file, line, function], ...]
  std::vector<std::string> files;                  // sources: the files it asks for
  // prompt: where it stopped.
  std::optional<std::string> actor, host, cell, reason, function, file;
  std::optional<int64_t> rank, pid, line;
  std::optional<nlohmann::json> coords, sizes;
  void check() const;
  template <class F>
  static void fields(F&& f) {
    f("ev", &DebugEventBody::ev, Need::Required);
    f("sid", &DebugEventBody::sid, Need::Required);
    f("out", &DebugEventBody::out, Need::Optional);
    f("stop", &DebugEventBody::stop, Need::Optional);
    f("gone", &DebugEventBody::gone, Need::Optional);
    f("stack", &DebugEventBody::stack, Need::Optional);
    f("files", &DebugEventBody::files, Need::Optional);
    f("actor", &DebugEventBody::actor, Need::Optional);
    f("host", &DebugEventBody::host, Need::Optional);
    f("cell", &DebugEventBody::cell, Need::Optional);
    f("reason", &DebugEventBody::reason, Need::Optional);
    f("function", &DebugEventBody::function, Need::Optional);
    f("file", &DebugEventBody::file, Need::Optional);
    f("rank", &DebugEventBody::rank, Need::Optional);
    f("pid", &DebugEventBody::pid, Need::Optional);
    f("line", &DebugEventBody::line, Need::Optional);
    f("coords", &DebugEventBody::coords, Need::Optional);
    f("sizes", &DebugEventBody::sizes, Need::Optional);
  }
};
XMESH_BODY_JSON(DebugEventBody)

// DebugCommand (controller -> proc): a pdb command, continue, or requested sources, for one
// session ("*": every session of the proc).
struct DebugCommandBody {
  static constexpr const char* what = "DebugCommand";
  std::string sid;
  std::optional<std::string> cmd;
  bool resume = false;                    // clear breakpoints and continue
  std::optional<nlohmann::json> sources;  // {file: text or null}
  // Attach to running actors (sid unused): stop the ranks pause_ranks of the actor mesh named
  // pause_actor where they run (unpause: withdraw a pause that has not stopped them yet;
  // pause_idle: an idle one stops at the start of its next call, else it is only reported).
  std::optional<std::string> pause_actor;
  std::vector<int64_t> pause_ranks;
  bool unpause = false;
  bool pause_idle = false;
  template <class F>
  static void fields(F&& f) {
    f("sid", &DebugCommandBody::sid, Need::Required);
    f("cmd", &DebugCommandBody::cmd, Need::Optional);
    f("resume", &DebugCommandBody::resume, Need::Optional);
    f("sources", &DebugCommandBody::sources, Need::Optional);
    f("pause_actor", &DebugCommandBody::pause_actor, Need::Optional);
    f("pause_ranks", &DebugCommandBody::pause_ranks, Need::Optional);
    f("unpause", &DebugCommandBody::unpause, Need::Optional);
    f("pause_idle", &DebugCommandBody::pause_idle, Need::Optional);
  }
};
XMESH_BODY_JSON(DebugCommandBody)

// Sync (controller -> agent): one step of a workspace sync (workspace_sync/README.md): begin,
// plan, data, commit or abort of the session sid.
struct SyncStepBody {
  static constexpr const char* what = "Sync";
  std::string op;      // "begin", "plan", "data", "commit", "abort"
  std::string sid;     // the session: 1-32 lowercase hex digits
  std::string dest;    // begin: where under the workspace (relative; "" the space itself)
  std::string digest;  // begin, delta plan: the digest of the controller's manifest
  std::string for_alloc;  // begin: a named allocation's workspace ("" the sender's own)
  std::string space;      // set by the agent (never taken from the wire): the space begin uses
  std::optional<std::string> base;  // plan: the host manifest the delta is against
  // plan: the manifest comes in parts in path order, numbered from 0, the last one saying so;
  // data: the plan part whose objects its pieces fill.
  uint64_t part = 0;
  bool last = true;
  // data: [object index within its part's need list, offset, raw length, stored length, zstd (1)
  // or raw (0)] per piece, their bytes back to back in the payload frame.
  std::vector<std::array<uint64_t, 5>> pieces;
  void check() const;
  template <class F>
  static void fields(F&& f) {
    f("op", &SyncStepBody::op, Need::Required);
    f("sid", &SyncStepBody::sid, Need::Required);
    f("dest", &SyncStepBody::dest, Need::Optional);
    f("digest", &SyncStepBody::digest, Need::Optional);
    f("for", &SyncStepBody::for_alloc, Need::Optional);
    f("base", &SyncStepBody::base, Need::Optional);
    f("part", &SyncStepBody::part, Need::Optional);
    f("last", &SyncStepBody::last, Need::Optional);
    f("pieces", &SyncStepBody::pieces, Need::Optional);
  }
};
XMESH_BODY_JSON(SyncStepBody)

// What a host answers to a Sync step (only the fields of that step are set).
struct SyncReply {
  static constexpr const char* what = "Sync reply";
  std::optional<bool> same;          // begin: the host's copy already has this digest
  std::optional<std::string> dir;    // begin, commit: the directory on the host
  std::optional<std::string> have;   // begin: the digest of the host's manifest
  std::optional<uint64_t> entries;   // begin (same): entries of the host's copy
  std::optional<bool> full;          // plan: send the whole manifest (the delta did not fit)
  std::optional<uint64_t> need;      // plan: objects asked for (their hashes: the reply frame)
  std::optional<uint64_t> received;  // data: bytes of this session so far
  std::optional<bool> aborted;
  // commit: what changed on the host (counts of files and links; the paths travel as frames).
  std::optional<uint64_t> added, changed, deleted, unchanged, bytes_received;
  std::optional<std::vector<std::string>> kept;  // old directories that could not be removed
  template <class F>
  static void fields(F&& f) {
    f("same", &SyncReply::same, Need::Optional);
    f("dir", &SyncReply::dir, Need::Optional);
    f("have", &SyncReply::have, Need::Optional);
    f("entries", &SyncReply::entries, Need::Optional);
    f("full", &SyncReply::full, Need::Optional);
    f("need", &SyncReply::need, Need::Optional);
    f("received", &SyncReply::received, Need::Optional);
    f("aborted", &SyncReply::aborted, Need::Optional);
    f("added", &SyncReply::added, Need::Optional);
    f("changed", &SyncReply::changed, Need::Optional);
    f("deleted", &SyncReply::deleted, Need::Optional);
    f("unchanged", &SyncReply::unchanged, Need::Optional);
    f("bytes_received", &SyncReply::bytes_received, Need::Optional);
    f("kept", &SyncReply::kept, Need::Optional);
  }
};
XMESH_BODY_JSON(SyncReply)

// Not a message: procs.json in an allocation's log directory (layout.hpp), written by the agent
// when it starts the procs, read by `mesh.logs()` and `xmesh logs` also after they ended.
struct RankMeta {
  static constexpr const char* what = "procs.json rank";
  int64_t pid = 0;
  nlohmann::json coords = nlohmann::json::object();
  template <class F>
  static void fields(F&& f) {
    f("pid", &RankMeta::pid, Need::Optional);
    f("coords", &RankMeta::coords, Need::Optional);
  }
};
XMESH_BODY_JSON(RankMeta)

struct AllocationMeta {
  static constexpr const char* what = "procs.json";
  std::string alloc, name, host;
  nlohmann::json shape = nlohmann::json::object();
  double created = 0;                     // seconds since the epoch
  std::map<std::string, RankMeta> ranks;  // by rank, as a decimal string
  template <class F>
  static void fields(F&& f) {
    f("alloc", &AllocationMeta::alloc, Need::Required);
    f("name", &AllocationMeta::name, Need::Optional);
    f("host", &AllocationMeta::host, Need::Optional);
    f("shape", &AllocationMeta::shape, Need::Optional);
    f("created", &AllocationMeta::created, Need::Optional);
    f("ranks", &AllocationMeta::ranks, Need::Optional);
  }
};
XMESH_BODY_JSON(AllocationMeta)

}  // namespace xmesh
