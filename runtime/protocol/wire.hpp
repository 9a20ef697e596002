// The wire format: every ZeroMQ message is [header, payload...]. The header is a CBOR map
// (nlohmann::json) with short keys; payload frames are opaque bytes (pickles, out-of-band
// buffers, log text) that the C++ side never interprets.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

namespace xmesh {

using json = nlohmann::json;

int protocol_version();
const std::string& version_string();  // release, e.g. "0.1.0"
const std::string& build_id();        // changes with every build

// Message kinds: generated from the one list, kinds.def (numbers, names, what each is).
enum class Kind : int {
#define XMESH_KIND(name, number, wire_name) name = number,
#include "kinds.def"
#undef XMESH_KIND
};
const char* kind_name(Kind k);  // "spawn-actor"; "unknown" for a number not in the list
bool kind_known(int k);

// Error kinds (the "kind" of an error body): generated from errors.def.
enum class ErrorKind {
#define XMESH_ERROR(name, wire_name) name,
#include "errors.def"
#undef XMESH_ERROR
};
const char* error_kind_name(ErrorKind k);  // its wire name, "no_actor"
// The kind of an error body; nullopt when it has none or one not in the list.
std::optional<ErrorKind> error_kind_of(const json& body);
// An error body: {"kind": ..., "text": ...}.
json error_body(ErrorKind k, const std::string& text);

struct Header {
  Kind kind = Kind::Call;
  std::string sender;        // node id of the sender (unique per process incarnation)
  uint64_t incarnation = 0;  // random per process start
  uint64_t seq = 0;          // per (sender, receiver) sequence, assigned before fan-out
  // Actor messages (Call, StopActor, SpawnActor): per (origin, destination) order, assigned by
  // the node that made the message, whichever way it travels (directly or through a cast tree's
  // relays); the destination takes them in this order (runtime/node/order.hpp). 0: unordered.
  uint64_t oseq = 0;
  uint64_t corr = 0;         // correlation id tying replies to calls
  int64_t index = -1;        // which target of a call this message is for / answers
  bool ok = false;           // Reply: a value (true) or an error described in body (false)
  std::string actor;         // destination actor name
  std::string method;        // endpoint name
  json ctx;                  // causal context (cell, call); null when none
  json body;                 // small kind-specific fields; null when none
  // When a payload frame was larger than the wire frame limit: how many wire frames each
  // payload frame was sent as (the transport splits and joins them); empty otherwise.
  std::vector<uint64_t> pieces;
};

// Headers are CBOR maps with one-letter keys. The encoder and the decoder's fast path handle
// the fixed fields by hand (the hot path of every call allocates almost nothing; the decoder
// reads a ctx that is a string, a call's cell, by hand too); other ctx values and bodies go
// through nlohmann::json, and anything the fast path does not expect is decoded by the
// general decoder, so both accept exactly the same headers.
std::vector<uint8_t> encode_header(const Header& h);
// The largest header frame a node decodes; a sender refuses to send a larger one (SendError),
// so a body that grows with its data (paths, pieces) fails where it is made, naming its size.
constexpr size_t kMaxHeaderBytes = size_t(1) << 20;
// Decodes and validates a header. Never throws: on failure returns nullopt and sets error.
std::optional<Header> decode_header(const void* data, size_t size, std::string& error);
// The general decoder alone (for tests comparing it with the fast path).
std::optional<Header> decode_header_general(const void* data, size_t size, std::string& error);

// The largest frame on the wire: larger payload frames travel as pieces (Header::pieces), so
// that libzmq never reserves more than this (plus a header) for any connection, whatever size a
// peer declares, an unauthenticated one included.
constexpr size_t kWireFrameBytes = size_t(64) << 20;

// A decoded message as it arrived at a node.
struct Message {
  Header header;
  std::vector<zmq::message_t> frames;  // payload frames, untouched
  std::string peer_identity;           // ZeroMQ routing id of the connection it came on
  std::string sender_addr;             // the sender's node address (from its Hello)
  // It came through a cast tree (runtime/cast/): sender_addr and header.sender name its origin,
  // and its answer joins those gathered at this node, going up the tree (Node::reply).
  bool gathered = false;
  size_t payload_bytes() const;
};

// Payload frames for a second send: small ones copied, large ones sharing their buffer
// (ZeroMQ's reference count), so a message can go to many destinations without copies.
std::vector<zmq::message_t> copy_frames(const std::vector<zmq::message_t>& frames);

}  // namespace xmesh
