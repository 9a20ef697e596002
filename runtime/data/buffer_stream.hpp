// The data plane between hosts (issue 24; docs/architecture/06-data-plane.md): a lease's
// bytes over TCP streams, sealed in records (record_cipher.hpp) under the key its grant carries.
//
// The owner's process runs one BufferStreamServer (started by its node at the first lease a
// stream needs), listening beside the node's TCP address. A reader opens one or more streams
// for a lease (parts of its range, in parallel); each stream says, in the clear:
//   "XMDS" | token (16 bytes) | stream number (u32) | offset in the lease (u64) | length (u64)
// (little-endian), then one byte '!' (go). The token is a capability for that lease only and
// names no memory; the bytes that follow are sealed under the lease's key, which only the
// control link (CURVE) carried, so an observer of the stream learns nothing and a forger moves
// nothing. The server answers one byte: 'Y', or 'N' with a u16 length and why, then closes.
// Through a host agent's PortMux the reader sends the go byte only once it read the agent's
// SOCKS5 answer: the server, handed the connection before the agent answers, then cannot
// answer first and have its byte land among the agent's. For a read it then sends
// the part's records; for a write it reads them into a scratch buffer, opens each into the
// buffer (so bytes that do not open never land there), and after the last sends a sealed empty
// record (the acknowledgement: the writer's Future resolves only once the bytes are in place).
// Record i of stream s: min(kStreamRecord, what is left) bytes, then the tag; nonce (s, i).
#pragma once
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "buffer_registry.hpp"
#include "unique_fd.hpp"
#include "record_cipher.hpp"

namespace xmesh {

constexpr size_t kStreamRecord = 256 << 10;  // plaintext bytes per record
constexpr size_t kStreamHelloBytes = 4 + 16 + 4 + 8 + 8;
constexpr size_t kMaxStreams = 256;  // streams one process serves at once

class BufferStreamServer {
 public:
  // Listens at bind_host (an IP address) on a port the kernel picks, reached at reach_host (the
  // same, unless the node is reached through NAT); throws naming why it cannot.
  BufferStreamServer(BufferRegistry& registry, const std::string& bind_host, const std::string& reach_host);
  // No listener of its own: it serves the streams adopt() gives it (a node's lane listener
  // passes on the connections that open as streams, tcp_lane.hpp kStreamMagic).
  explicit BufferStreamServer(BufferRegistry& registry);
  // Serves the stream on fd (its own now), `early` the bytes already read from it.
  void adopt(unique_fd fd, std::string early);
  ~BufferStreamServer();  // stops listening, ends the streams under way, waits for them
  BufferStreamServer(const BufferStreamServer&) = delete;
  BufferStreamServer& operator=(const BufferStreamServer&) = delete;
  const std::string& address() const { return address_; }  // "tcp://host:port" ("": adopting only)
  struct Stats {
    uint64_t connections = 0, streams = 0, refused = 0, broken = 0, bytes = 0;
  };
  Stats stats() const;

 private:
  void accept_loop();
  bool stopping() const;  // the waits of its streams end when it is
  void serve(int fd, const std::string& early);
  // One stream on fd: its hello (kept: the connection served one before, and may stay idle
  // for XMESH_DATA_IDLE_MS waiting for it), the answer, the records. false: the connection is
  // done (refused, broken, idle, closed).
  bool serve_one(int fd, const std::string& early, bool kept);
  // The stream's records, once its hello was accepted: false when it broke (*why).
  bool send_records(int fd, const BufferRegistry::Pin& pin, uint32_t stream, std::string* why);
  bool receive_records(int fd, const BufferRegistry::Pin& pin, uint32_t stream, std::string* why);
  BufferRegistry& registry_;
  unique_fd listen_fd_;
  unique_fd wake_read_, wake_write_;  // a pipe: the destructor wakes the accept loop
  std::string address_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::set<int> open_;  // connections being served
  bool stopping_ = false;
  Stats stats_;
  std::thread acceptor_;
};

// What a reader needs to reach a lease's bytes over streams (from the owner's lease answer).
struct StreamGrant {
  std::string address;  // "host:port"
  std::string token, key;
  RecordCipherKind cipher = RecordCipherKind::aes256gcm;
};

struct StreamOutcome {
  enum class Status { ok, refused, broken, stopped };
  Status status = Status::ok;
  std::string why;  // for anything but ok
  explicit operator bool() const { return status == Status::ok; }
};

// Moves the leased range's `size` bytes into `local` (write: from it) over `streams` parallel
// streams (at most one per record). keep_going is asked between records and while waiting:
// false stops the transfer (a deadline, another op's failure): stopped. refused: the server
// said no (why); broken: a connection failed, or a record did not open. pause_ms (tests: act
// while a transfer is under way): a pause before each 16 MiB of a stream after its first.
// How this process's streams reach an owner when it does not simply connect: the gateway its
// connections go through (socks_route.hpp), and, for an owner reached back (a stream address
// "back:ADDR": a controller nobody can connect to, back_links.hpp), one of the connections it
// opened for this node (the tag written; invalid when none came in time).
struct StreamWays {
  std::string gateway;
  std::function<unique_fd(const std::string& owner_addr)> take_back;
};
constexpr const char* kBackStreamPrefix = "back:";

StreamOutcome stream_transfer(const StreamGrant& grant, char* local, uint64_t size, bool write, int streams,
                              const std::function<bool()>& keep_going, int pause_ms = 0, const StreamWays& ways = {});

}  // namespace xmesh
