// TCP lanes: a direct, encrypted stream of messages from one node to a node on another host
// (issue 23's cross-host path; the design in docs/architecture/03-transport-and-links.md, "TCP lanes between hosts").
//
// Why: a message over a ZeroMQ TCP link passes through four threads that are not the sender or
// the receiver (ZeroMQ's I/O thread and the node's `xmesh-io` on each side); on two cores each
// hand-over is a context switch, and a round trip measured 2.4x a bare ZeroMQ REQ/REP ping-pong.
// A lane is a plain TCP connection that the sending thread writes itself and the receiving
// node's reading thread reads itself.
//
// A lane carries one direction, as a shared-memory ring does. Its secret (a random AEAD key and
// a random token naming it) is made by the receiver and sent to the writer over the ZeroMQ link,
// which CURVE already encrypts and the cluster cookie authenticates; the writer connects to the
// receiver's lane listener, sends the token, then records. A record is a 4-byte length and
// ChaCha20-Poly1305 (IETF) ciphertext of at most kLaneChunk bytes of messages laid out as in
// message_layout.hpp, its nonce the record's number on the lane: a record changed, dropped,
// replayed or reordered on the way does not open, and the lane is then closed. A record holds
// bytes of one message only; a message takes as many records as it needs.
//
// These classes are the lane itself (sealing, opening, the sockets); the transport decides when
// a lane is offered, used and given up (transport_lanes.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <zmq.hpp>

#include "socks_route.hpp"
#include "unique_fd.hpp"
#include "wire.hpp"

namespace xmesh {

constexpr size_t kLaneKeyBytes = 32;
constexpr size_t kLaneTokenBytes = 16;
constexpr size_t kLaneChunk = 64 << 10;   // plaintext bytes per record, at most
constexpr size_t kLaneRecordTag = 16;     // what sealing adds to a record (Poly1305's tag)

struct LaneSecret {
  std::string key;    // kLaneKeyBytes random bytes
  std::string token;  // kLaneTokenBytes random bytes
};
LaneSecret make_lane_secret();  // throws when the system's random source fails
// host's address as digits (a name resolved now; throws naming why not): what a listener tells
// its writers, so that they connect without a name lookup on their I/O thread.
std::string numeric_host(const std::string& host);

// The writer's side of the encryption: messages into records. Not thread-safe.
class LaneSealer {
 public:
  explicit LaneSealer(std::string key);
  // Appends the records of one message (its encoded header and frames) to `out`.
  void seal(const std::vector<uint8_t>& header, const std::vector<zmq::message_t>& frames, std::string& out);
  // One record holding `plain` as it is (at most kLaneChunk bytes): for tests and the fuzzer,
  // which need records a writer would never make.
  void seal_bytes(std::string_view plain, std::string& out);

 private:
  void seal_record(const std::vector<std::string_view>& pieces, std::string& out);
  std::string key_;
  uint64_t counter_ = 0;
  std::string scratch_;
};

// The reader's side: records back into messages, fed bytes as they come. Not thread-safe.
class LaneOpener {
 public:
  LaneOpener(std::string key, size_t max_message_bytes);
  enum class Got { nothing, message, too_large, broken };
  void feed(const char* data, size_t n);
  // What the bytes fed so far hold next: a whole message (*out); one whose frames exceed
  // max_message_bytes (*out its header when that came whole, else an empty header; *payload the
  // frames' size; its bytes are skipped); nothing whole yet; or broken (*error says why: the
  // lane cannot be read further).
  Got next(Message* out, std::string* error, uint64_t* payload);

 private:
  enum class Record { none, opened, bad };
  Record open_record(std::string* error);
  Got take_record(Message* out, std::string* error, uint64_t* payload);
  Got start_message(Message* out, std::string* error, uint64_t* payload);
  Got broken(std::string* error, std::string why);

  std::string key_;
  size_t max_message_bytes_;
  uint64_t counter_ = 0;
  std::string in_;      // sealed bytes not opened yet, from in_at_
  size_t in_at_ = 0;
  std::string record_;  // the plaintext of the record just opened
  std::string message_; // the message being put together
  uint64_t expected_ = 0;  // its total size (0: the next record starts a message)
  uint64_t skipping_ = 0;  // bytes of a message over the limit still to skip
  std::string broken_;     // why, once broken
};

// The first bytes of a data-plane stream (buffer_stream.hpp): a lane listener that reads them
// instead of a lane token hands the connection to its stream adopter. Lane tokens never start so.
constexpr char kStreamMagic[4] = {'X', 'M', 'D', 'S'};

// The writer's socket. Connects without waiting; the token goes first. Thread-safety: one
// thread at a time (the transport holds its peer's lock).
class LaneWriter {
 public:
  // route: where the connection goes and the PortMuxes asked with SOCKS5 on the way (a gateway's,
  // the proc's agent's for its loopback lane port) before the token; the lane is up once they
  // all said yes. Throws naming why when no socket can be made for its host.
  LaneWriter(const SocksRoute& route, const LaneSecret& secret);
  // host:port directly; via (not 0): host:port is a host agent's PortMux, asked for its proc's
  // loopback port `via`.
  LaneWriter(const std::string& host, int port, const LaneSecret& secret, int via = 0)
      : LaneWriter(socks_route("", TcpEndpoint{host, port, via}), secret) {}
  // Over a connection made already (a back connection a controller opened, back_links.hpp): up at
  // once, the token first. peer: the reader's name, for errors.
  LaneWriter(unique_fd connected, const std::string& peer, const LaneSecret& secret);
  ~LaneWriter();
  LaneWriter(const LaneWriter&) = delete;
  LaneWriter& operator=(const LaneWriter&) = delete;

  enum class State { connecting, socks, up, broken };
  State state();  // looks at a pending connect's outcome, never waits
  enum class Result { ok, would_block, timed_out, broken };
  // One message, when state() is up (else would_block, nothing sealed). blocking=false: when
  // earlier bytes still wait to leave, would_block and nothing is sealed; else the message is
  // sealed and what the socket does not take now stays pending (flush() or the next write sends
  // it). blocking: waits up to timeout_ms for all of it to leave (timed_out: the message is
  // committed and leaves once the reader reads; the lane is no longer usable for a waiting
  // sender's deadline, the caller decides).
  Result write(const std::vector<uint8_t>& header, const std::vector<zmq::message_t>& frames, bool blocking,
               int timeout_ms);
  Result flush(int timeout_ms);  // pending bytes out; 0: what the socket takes now
  bool pending() const { return out_at_ < out_.size(); }
  int fd() const { return fd_.get(); }
  const std::string& error() const { return error_; }  // why broken
  void close();

 private:
  bool send_some();  // false when the connection broke
  void read_socks_reply();  // state socks: the agent's answers, read as they come
  Result wait_out(int timeout_ms);
  void fail(const std::string& why);

  unique_fd fd_;
  std::string peer_;
  LaneSealer sealer_;
  std::string out_;
  size_t out_at_ = 0;
  SocksRoute route_;
  std::string socks_reply_;  // what the PortMuxes answered so far (12 bytes each: greeting and CONNECT)
  State state_ = State::connecting;
  std::string error_;
};

// A connection handed over to a LaneListener (below): one datagram of kHandoverTag and the bytes
// read from it so far, the connection attached.
constexpr char kHandoverTag = 'L';
constexpr size_t kHandoverMaxBytes = 1024;
// Sends conn_fd (a TCP connection that asked for the listener at handover_path) over via_sock
// (an unbound unix datagram socket), never waiting. False with errno: not there (ENOENT,
// ECONNREFUSED: its proc is gone), its queue full (EAGAIN), too many bytes read (EMSGSIZE).
bool hand_over_lane(int via_sock, int conn_fd, const std::string& read_so_far, const std::string& handover_path);

// The receiver's listening socket and the connections still presenting their token.
//
// A proc behind its host agent's one port also takes connections handed over (hand-over socket
// not empty): the agent's PortMux, asked by a writer for this listener's port, passes it the
// accepted TCP connection (SCM_RIGHTS, with the bytes it read after the SOCKS5 request) on a
// unix datagram socket bound there, instead of relaying every byte through its own thread. The
// connection then presents its token like any other.
class LaneListener {
 public:
  // Listens on host (numeric or a name of this machine) at port (0: any), and for connections
  // handed over at the unix path `handover` (empty: none). Throws naming why.
  LaneListener(const std::string& host, int port, const std::string& handover = "");
  ~LaneListener();
  LaneListener(const LaneListener&) = delete;
  LaneListener& operator=(const LaneListener&) = delete;
  int port() const { return port_; }
  int fd() const { return fd_.get(); }
  const std::string& handover_path() const { return handover_path_; }

  // A lane to accept: the connection presenting secret.token is writer_addr's, until ttl_ms.
  void expect(const LaneSecret& secret, const std::string& writer_addr, int64_t now_ms, int64_t ttl_ms);
  // Who takes data-plane streams that arrive here (the connection and what was read of it);
  // none: they are refused like unknown tokens.
  using StreamAdopter = std::function<void(unique_fd fd, std::string early)>;
  void set_stream_adopter(StreamAdopter adopter) { stream_adopter_ = std::move(adopter); }
  // Who takes a controller's back connections handed over here (back_links.hpp; they start with
  // kBackMagic): the node's back pool. None: refused like unknown tokens.
  void set_back_adopter(StreamAdopter adopter) { back_adopter_ = std::move(adopter); }
  // A connection this node opened that is to present a token here as if accepted (a lane written
  // over a back connection, back_links.hpp), with what was read of it. Any thread: the reading
  // thread's poll wakes for it.
  void adopt(unique_fd fd, std::string early);
  struct Accepted {
    unique_fd fd;
    std::string writer_addr;
    std::string key;
    std::string early;  // bytes that came after the token (records already)
  };
  // Never waits: accepts connections, reads tokens; a token expected comes back (each once);
  // a connection with another token, or none within the ttl, is closed and said in *refused.
  std::vector<Accepted> poll(int64_t now_ms, std::vector<std::string>* refused);
  // What is worth waiting on for input: the listener, the hand-over socket and connections still
  // owing their token.
  void fds(std::vector<int>& out) const;
  size_t expected() const { return expected_.size(); }

 private:
  struct Expected {
    std::string writer_addr, key;
    int64_t deadline;
  };
  struct Presenting {
    unique_fd fd;
    std::string got, peer;
    int64_t deadline;
  };
  void accept_all(int64_t now_ms);
  void take_handed_over(int64_t now_ms);
  void take_adopted(int64_t now_ms);
  void add_presenting(unique_fd fd, std::string got, int64_t now_ms);
  bool read_token(Presenting& c, std::vector<Accepted>& out, std::vector<std::string>* refused);

  unique_fd fd_;
  int port_ = 0;
  unique_fd handover_fd_;
  std::string handover_path_;
  int64_t ttl_ms_ = 10000;
  StreamAdopter stream_adopter_, back_adopter_;
  unique_fd adopt_wake_;  // an eventfd: adopt() was called
  std::mutex adopted_mu_;
  std::vector<std::pair<unique_fd, std::string>> adopted_;
  std::vector<std::pair<std::string, Expected>> expected_;  // by token
  std::vector<Presenting> presenting_;
};

// One lane being read (the receiver's reading thread).
class LaneIn {
 public:
  LaneIn(LaneListener::Accepted accepted, size_t max_message_bytes);
  ~LaneIn();
  LaneIn(const LaneIn&) = delete;
  LaneIn& operator=(const LaneIn&) = delete;
  int fd() const { return fd_.get(); }
  const std::string& writer_addr() const { return writer_addr_; }

  struct TooLarge {
    Message msg;
    uint64_t payload_bytes;
  };
  enum class Status { open, closed, broken };
  // Reads what the socket holds now (never waits; about `budget` bytes at most; call it once
  // right after the lane is accepted too: records may have come with the token): whole messages
  // to `out` (sender_addr set), those over the limit to `too_large`. closed: the writer's end
  // closed (what came before is in out); broken: bytes that do not open (*error says why).
  Status read(std::vector<Message>& out, std::vector<TooLarge>& too_large, std::string* error,
              size_t budget = 1 << 20);

 private:
  Status drain(std::vector<Message>& out, std::vector<TooLarge>& too_large, std::string* error);
  unique_fd fd_;
  std::string writer_addr_;
  LaneOpener opener_;
};

}  // namespace xmesh
