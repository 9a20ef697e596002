// The bodies of the links' own messages (transport/): Hello and Refuse on every connection, the ring and
// lane upgrades' proposals and answers (link.hpp).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bodies.hpp"
#include "wire.hpp"

namespace xmesh {

// Hello (any -> any, first on every connection). Read by the node only.
struct HelloBody {
  static constexpr const char* what = "Hello";
  static constexpr Kind kind = Kind::Hello;  // the message it is the body of
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
  // A controller the receiver cannot connect to (back_links.hpp): its back token (hex), which the
  // connections it opens for the receiver present; the receiver then reaches `addr` only through
  // those. Empty: the receiver dials addr.
  std::string back;
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
    f("back", &HelloBody::back, Need::Optional);
  }
};
XMESH_BODY_JSON(HelloBody)

// Refuse (any -> any): why a connection is refused (version, credentials).
struct RefuseBody {
  static constexpr const char* what = "Refuse";
  static constexpr Kind kind = Kind::Refuse;  // the message it is the body of
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

// RingOffer (a node -> a node of its host): a shared-memory ring for the sender's messages to
// the receiver (runtime/transport/ring_links.hpp), to be opened at /proc/<pid>/fd/<fd> and recognised by
// its token.
struct RingOfferBody {
  static constexpr const char* what = "RingOffer";
  static constexpr Kind kind = Kind::RingOffer;  // the message it is the body of
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

// RingAccept (the receiver of an offer -> its sender): the ring (its token) is mapped, and the
// receiver's doorbell is at /proc/<pid>/fd/<bell_fd>; or, ok false, why it is not used.
struct RingAcceptBody {
  static constexpr const char* what = "RingAccept";
  static constexpr Kind kind = Kind::RingAccept;  // the message it is the body of
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
  static constexpr Kind kind = Kind::LaneOffer;  // the message it is the body of
  bool ok = false;
  std::string reason;
  std::string host;
  int64_t port = 0, via = 0;
  std::string key, token;
  // The receiver cannot be connected to (back_links.hpp): the writer writes the lane over one of
  // the connections it opened for the writer (host and port are then empty).
  bool back = false;
  template <class F>
  static void fields(F&& f) {
    f("ok", &LaneOfferBody::ok, Need::Required);
    f("back", &LaneOfferBody::back, Need::Optional);
    f("via", &LaneOfferBody::via, Need::Optional);
    f("reason", &LaneOfferBody::reason, Need::Optional);
    f("host", &LaneOfferBody::host, Need::Optional);
    f("port", &LaneOfferBody::port, Need::Optional);
    f("key", &LaneOfferBody::key, Need::Optional);
    f("token", &LaneOfferBody::token, Need::Optional);
  }
};
XMESH_BODY_JSON(LaneOfferBody)

}  // namespace xmesh
