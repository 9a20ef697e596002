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

// Message kinds. The numbers of Hello and Refuse never change, so that peers of any
// protocol version can tell each other why they refuse to talk.
enum class Kind : int {
  Hello = 1,        // first message on every connection: version, build, credentials, address
  Refuse = 3,       // refusal with a human-readable reason (version, credentials)
  Call = 10,        // invoke an endpoint of an actor; payload = pickled (args, kwargs)
  Reply = 11,       // result of one Call target; body.ok says value or error
  SpawnActor = 12,  // create an actor on a proc; payload = pickled (class, args, kwargs)
  StopActor = 13,
  ProcReady = 14,   // a proc announces its address to its controller
  PeerDead = 15,    // supervision notice relayed to procs: a peer address died
  Fault = 16,       // an exception nobody waits for (broadcast), for the controller's fault hook
  Cancel = 17,      // cancel one target of a call (body: corr, index), to the proc's control inbox
  Adopt = 18,       // controller -> proc of a named allocation it attached: it is the owner now
  ProcInfo = 19,    // controller -> proc: its pid and live actors (answered with a Reply)
  SpawnProcs = 20,  // controller -> hostd; answered with a Reply
  ProcExited = 22,  // hostd -> controller, after the proc's pipes reached end of file
  Log = 23,         // hostd -> controller: complete lines of one proc stream
  StopProcs = 24,
  Heartbeat = 25,
  HeartbeatAck = 26,
  Goodbye = 27,     // controller exits cleanly: stop its unnamed allocations now
  Status = 28,      // ask hostd for its allocations; answered with a Reply
  Attach = 29,      // controller -> hostd: take over a live named allocation; answered with a Reply
  Shutdown = 30,    // ask hostd to exit (stops everything it owns)
  FlushOutput = 31, // controller -> proc: write an output marker now; answered with its seq (body.m)
  Configure = 32,   // controller -> proc: settings such as the Python logging level
  DebugEvent = 33,  // proc -> controller: a debug session stopped, answered a command, or ended
  DebugCommand = 34,  // controller -> proc: a pdb command (or continue) for one stopped session
  DumpStacks = 35,  // controller -> proc: every thread's Python stack, answered by the I/O thread
  Sync = 36,        // controller -> hostd: one step of a workspace sync (body.op); answered with a Reply
  Reload = 37,      // controller -> proc: reload the modules of these synced files; answered with a Reply
};
const char* kind_name(Kind k);
bool kind_known(int k);

struct Header {
  Kind kind = Kind::Call;
  std::string sender;        // node id of the sender (unique per process incarnation)
  uint64_t incarnation = 0;  // random per process start
  uint64_t seq = 0;          // per (sender, receiver) sequence, assigned before fan-out
  uint64_t corr = 0;         // correlation id tying replies to calls
  int64_t index = -1;        // which target of a call this message is for / answers
  bool ok = false;           // Reply: a value (true) or an error described in body (false)
  std::string actor;         // destination actor name
  std::string method;        // endpoint name
  json ctx;                  // causal context (cell, call); null when none
  json body;                 // small kind-specific fields; null when none
};

// Headers are CBOR maps with one-letter keys. The encoder and the decoder's fast path handle
// the fixed fields by hand (the hot path of every call allocates almost nothing); ctx and body
// go through nlohmann::json, and anything the fast path does not expect is decoded by the
// general decoder, so both accept exactly the same headers.
std::vector<uint8_t> encode_header(const Header& h);
// Decodes and validates a header. Never throws: on failure returns nullopt and sets error.
std::optional<Header> decode_header(const void* data, size_t size, std::string& error);
// The general decoder alone (for tests comparing it with the fast path).
std::optional<Header> decode_header_general(const void* data, size_t size, std::string& error);

// A decoded message as it arrived at a node.
struct Message {
  Header header;
  std::vector<zmq::message_t> frames;  // payload frames, untouched
  std::string peer_identity;           // ZeroMQ routing id of the connection it came on
  std::string sender_addr;             // the sender's node address (from its Hello)
  size_t payload_bytes() const;
};

}  // namespace xmesh
