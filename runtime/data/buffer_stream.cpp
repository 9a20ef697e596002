#include "buffer_stream.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tcp_endpoint.hpp"
#include "unique_fd.hpp"
#include "tcp_lane.hpp"
#include "util.hpp"

namespace xmesh {

namespace {
constexpr int kSliceMs = 200;  // waits look at keep_going (or at the server stopping) this often

// How long a stream may make no progress before the server gives it up (a reader that vanished
// without closing): XMESH_DATA_STALL_MS, default 30 s.
int stall_ms() { return static_cast<int>(env_int("XMESH_DATA_STALL_MS", 30000)); }
// How long a connection kept between streams waits for its next hello (the reader keeps it
// for less: kPoolIdleMs), XMESH_DATA_IDLE_MS, default 30 s.
int idle_ms() { return static_cast<int>(env_int("XMESH_DATA_IDLE_MS", 30000)); }

void put_u32(char* p, uint32_t v) { for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i)); }
void put_u64(char* p, uint64_t v) { for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i)); }
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// Moves exactly n bytes over a non-blocking socket, waiting in slices; between slices `go()`
// may stop it, and no progress for stall_ms ends it. "" when done, else why not.
template <class Move>
std::string move_all(int fd, size_t n, bool sending, const std::function<bool()>& go, int stall, Move move) {
  size_t done = 0;
  int idle_ms = 0;
  while (done < n) {
    ssize_t got = move(done, n - done);
    if (got > 0) {
      done += static_cast<size_t>(got);
      idle_ms = 0;
      continue;
    }
    if (got == 0) return "the peer closed the stream";
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return std::strerror(errno);
    if (!go()) return "stopped";
    if (idle_ms >= stall) return "no progress for " + std::to_string(stall / 1000) + " s";
    pollfd p{fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0};
    if (::poll(&p, 1, kSliceMs) == 0) idle_ms += kSliceMs;
  }
  return "";
}

std::string send_all(int fd, const char* data, size_t n, const std::function<bool()>& go, int stall) {
  return move_all(fd, n, true, go, stall,
                  [&](size_t at, size_t left) { return ::send(fd, data + at, left, MSG_NOSIGNAL); });
}
std::string recv_all(int fd, char* data, size_t n, const std::function<bool()>& go, int stall) {
  return move_all(fd, n, false, go, stall, [&](size_t at, size_t left) { return ::recv(fd, data + at, left, 0); });
}

size_t records_in(uint64_t length) { return static_cast<size_t>((length + kStreamRecord - 1) / kStreamRecord); }

void large_socket_buffers(int fd) {
  int bytes = 4 << 20;  // the kernel caps it at its own limit
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}
}  // namespace

// ---- the owner's side -------------------------------------------------------------------------
BufferStreamServer::BufferStreamServer(BufferRegistry& registry, const std::string& bind_host,
                                       const std::string& reach_host)
    : registry_(registry) {
  TcpEndpoint at;
  at.host = bind_host;
  int port = 0;
  listen_fd_.reset(listening_socket(at, &port));
  at.host = reach_host;
  at.port = port;
  address_ = at.str();
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("a pipe for the stream listener: ") + std::strerror(errno));
  wake_read_.reset(wake[0]);
  wake_write_.reset(wake[1]);
  acceptor_ = runtime_thread([this] {
    pthread_setname_np(pthread_self(), "xmesh-streams");
    accept_loop();
  });
}

BufferStreamServer::BufferStreamServer(BufferRegistry& registry) : registry_(registry) {}

BufferStreamServer::~BufferStreamServer() {
  {
    std::unique_lock<std::mutex> g(mu_);
    stopping_ = true;
    for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
  }
  if (acceptor_.joinable()) {
    char c = 'x';
    (void)!::write(wake_write_.get(), &c, 1);
    acceptor_.join();
  }
  std::unique_lock<std::mutex> g(mu_);
  cv_.wait(g, [&] { return open_.empty(); });
}

bool BufferStreamServer::stopping() const {
  std::lock_guard<std::mutex> g(mu_);
  return stopping_;
}

BufferStreamServer::Stats BufferStreamServer::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

void BufferStreamServer::accept_loop() {
  while (true) {
    pollfd p[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_read_.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[1].revents) return;
    unique_fd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd) adopt(std::move(fd), "");
  }
}

void BufferStreamServer::adopt(unique_fd conn, std::string early) {
  const int fd = conn.get();
  {
    std::lock_guard<std::mutex> g(mu_);
    // A thread per stream, so a bound: a flood of connections (each may wait 10 s for its hello)
    // is refused beyond it rather than taking every thread the process may have.
    if (stopping_ || open_.size() >= kMaxStreams) {
      if (!stopping_) ++stats_.refused;
      return;  // closed with conn
    }
    open_.insert(fd);
    ++stats_.connections;
  }
  // Non-blocking, whatever handed it over made it (the waits below poll).
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  large_socket_buffers(fd);
  runtime_thread([this, conn = std::move(conn), early = std::move(early)]() mutable {
    pthread_setname_np(pthread_self(), "xmesh-stream");
    serve(conn.get(), early);
    std::lock_guard<std::mutex> g(mu_);
    open_.erase(conn.get());
    conn.reset();
    cv_.notify_all();
  }).detach();
}

void BufferStreamServer::serve(int fd, const std::string& early) {
  // A connection serves one stream after another (readers keep theirs per owner), until a
  // stream fails or is refused, or no next hello comes within the idle time.
  if (!serve_one(fd, early, false)) return;
  while (serve_one(fd, "", true)) {
  }
}

bool BufferStreamServer::serve_one(int fd, const std::string& early, bool kept) {
  auto go = [this] { return !stopping(); };
  char hello[kStreamHelloBytes + 1];  // and the go byte
  // The writer waits for the answer before any record: nothing may follow its go byte yet.
  std::string why = early.size() > sizeof hello ? "bytes after the hello before its answer" : "";
  std::memcpy(hello, early.data(), std::min(early.size(), sizeof hello));
  if (why.empty() && early.size() < sizeof hello)
    why = recv_all(fd, hello + early.size(), sizeof hello - early.size(), go, kept ? idle_ms() : 10000);
  // A kept connection that its reader closed, or that stayed idle, ends without a word.
  if (kept && !why.empty() &&
      (why.find("peer closed") != std::string::npos || why.find("no progress") != std::string::npos || why == "stopped"))
    return false;
  if (why.empty() && std::memcmp(hello, kStreamMagic, sizeof kStreamMagic) != 0) why = "not a data-plane stream";
  if (why.empty() && hello[kStreamHelloBytes] != '!') why = "no go byte after the hello";
  BufferRegistry::Pin pin;
  uint32_t stream = 0;
  if (why.empty()) {
    stream = get_u32(hello + 20);
    pin = registry_.pin_stream(std::string(hello + 4, 16), stream, get_u64(hello + 24), get_u64(hello + 32), &why);
  }
  if (!pin.id) {
    {
      std::lock_guard<std::mutex> g(mu_);  // counted before the answer: whoever reads it has it counted
      ++stats_.refused;
    }
    if (why.find("peer closed") == std::string::npos) {
      std::string answer = "N";
      const uint16_t n = static_cast<uint16_t>(std::min<size_t>(why.size(), 1000));
      answer += static_cast<char>(n & 0xff);
      answer += static_cast<char>(n >> 8);
      answer += why.substr(0, n);
      (void)send_all(fd, answer.data(), answer.size(), go, 1000);
    }
    return false;
  }
  const char yes = 'Y';
  bool ok = send_all(fd, &yes, 1, go, stall_ms()).empty();
  if (ok) ok = pin.write ? receive_records(fd, pin, stream, &why) : send_records(fd, pin, stream, &why);
  registry_.unpin(pin.id);
  std::lock_guard<std::mutex> g(mu_);
  ++stats_.streams;
  if (ok)
    stats_.bytes += pin.size;
  else
    ++stats_.broken;
  return ok;
}

bool BufferStreamServer::send_records(int fd, const BufferRegistry::Pin& pin, uint32_t stream, std::string* why) {
  auto go = [this] { return !stopping(); };
  RecordCipher cipher(preferred_record_cipher(), pin.key);
  std::vector<char> sealed(kStreamRecord + kRecordTagBytes);
  const int stall = stall_ms();
  for (size_t i = 0, n = records_in(pin.size); i < n; ++i) {
    const size_t at = i * kStreamRecord, len = std::min(kStreamRecord, pin.size - at);
    cipher.seal(stream, i, pin.addr + at, len, sealed.data());
    *why = send_all(fd, sealed.data(), len + kRecordTagBytes, go, stall);
    if (!why->empty()) return false;
  }
  return true;
}

bool BufferStreamServer::receive_records(int fd, const BufferRegistry::Pin& pin, uint32_t stream, std::string* why) {
  auto go = [this] { return !stopping(); };
  RecordCipher cipher(preferred_record_cipher(), pin.key);
  std::vector<char> sealed(kStreamRecord + kRecordTagBytes);
  const int stall = stall_ms();
  const size_t n = records_in(pin.size);
  for (size_t i = 0; i < n; ++i) {
    const size_t at = i * kStreamRecord, len = std::min(kStreamRecord, pin.size - at);
    *why = recv_all(fd, sealed.data(), len + kRecordTagBytes, go, stall);
    if (!why->empty()) return false;
    // Opened in the scratch buffer and copied once whole: a decryption writes its output
    // before the tag is checked, and bytes that do not open must never reach the buffer.
    if (!cipher.open(stream, i, sealed.data(), len, sealed.data())) {
      *why = "a record did not open (changed on the way, or not sealed with the lease's key)";
      return false;
    }
    std::memcpy(pin.addr + at, sealed.data(), len);
  }
  cipher.seal(stream, n, nullptr, 0, sealed.data());  // the acknowledgement: an empty record
  *why = send_all(fd, sealed.data(), kRecordTagBytes, go, stall);
  return why->empty();
}

// ---- the reader's side -------------------------------------------------------------------------
namespace {
StreamOutcome outcome(StreamOutcome::Status s, std::string why) { return StreamOutcome{s, std::move(why)}; }

// Connections to owners' stream listeners kept once a stream over them succeeded (the owner
// serves the next hello on them): a transfer takes one instead of connecting (a connect, and
// through a host agent its SOCKS5 exchange, saved: most of a 1 MiB transfer's time between
// hosts). Kept for kIdleMs (less than the owner's XMESH_DATA_IDLE_MS), kPerAddress per owner,
// kMax in all; one that the owner closed meanwhile is seen as readable and dropped.
class KeptConnections {
 public:
  unique_fd take(const std::string& address) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = idle_.find(address);
    while (it != idle_.end() && !it->second.empty()) {
      auto kept = std::move(it->second.back());
      it->second.pop_back();
      --count_;
      pollfd p{kept.fd.get(), POLLIN, 0};
      if (Clock::now() - kept.since < std::chrono::milliseconds(kIdleMs) && ::poll(&p, 1, 0) == 0)
        return std::move(kept.fd);
    }  // one too old, or that its owner closed, is closed as it goes
    return unique_fd();
  }
  void put(const std::string& address, unique_fd fd) {
    std::lock_guard<std::mutex> g(mu_);
    auto& idle = idle_[address];
    if (count_ >= kMax || idle.size() >= kPerAddress) return;  // closed as it goes
    idle.push_back({std::move(fd), Clock::now()});
    ++count_;
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Kept {
    unique_fd fd;
    Clock::time_point since;
  };
  static constexpr int kIdleMs = 10000;
  static constexpr size_t kPerAddress = 8, kMax = 64;
  std::mutex mu_;
  std::unordered_map<std::string, std::vector<Kept>> idle_;
  size_t count_ = 0;
};

KeptConnections& kept_connections() {
  static KeptConnections* kept = new KeptConnections;  // never destroyed: threads may use it at exit
  return *kept;
}

// The owner's words after a refusal ('N', a length, the text), or "refused".
std::string refusal(int fd, char answer, const std::function<bool()>& go) {
  char len[2] = {0, 0};
  std::string text = "refused";
  if (answer == 'N' && recv_all(fd, len, 2, go, 1000).empty()) {
    text.assign(static_cast<unsigned char>(len[0]) | (static_cast<unsigned char>(len[1]) << 8), '\0');
    if (!recv_all(fd, text.data(), text.size(), go, 1000).empty()) text = "refused";
  }
  return text;
}

// The stream's records, sealed, from (write) or into `at`, then a write's acknowledgement:
// "" when every byte moved, else why not.
std::string move_records(int fd, const StreamGrant& grant, uint32_t stream, char* at, uint64_t length, bool write,
                         const std::function<bool()>& go, int pause_ms, int stall) {
  RecordCipher cipher(grant.cipher, grant.key);
  std::vector<char> sealed(kStreamRecord + kRecordTagBytes);
  const size_t n = records_in(length);
  constexpr size_t kRecordsPerPause = (size_t(16) << 20) / kStreamRecord;
  std::string why;
  for (size_t i = 0; i < n && why.empty(); ++i) {
    if (pause_ms > 0 && i > 0 && i % kRecordsPerPause == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    char* record = at + i * kStreamRecord;
    const size_t len = std::min<uint64_t>(kStreamRecord, length - i * kStreamRecord);
    if (write) {
      cipher.seal(stream, i, record, len, sealed.data());
      why = send_all(fd, sealed.data(), len + kRecordTagBytes, go, stall);
    } else {
      why = recv_all(fd, sealed.data(), len + kRecordTagBytes, go, stall);
      if (why.empty() && !cipher.open(stream, i, sealed.data(), len, record))
        why = "a record did not open (changed on the way)";
    }
  }
  if (why.empty() && write) {  // the owner's acknowledgement: the bytes are in place
    why = recv_all(fd, sealed.data(), kRecordTagBytes, go, stall);
    if (why.empty() && !cipher.open(stream, n, sealed.data(), 0, sealed.data())) why = "the acknowledgement did not open";
  }
  return why;
}

// One stream: bytes [offset, offset + length) of the lease to or from local + offset, over a
// kept connection to the owner if there is one (fresh: a new one), kept after if it succeeded.
StreamOutcome run_stream(const StreamGrant& grant, const TcpEndpoint& to, const StreamWays& ways, uint32_t stream,
                         char* local, uint64_t offset, uint64_t length, bool write, const std::function<bool()>& go,
                         int pause_ms, bool fresh = false) {
  unique_fd owned = fresh ? unique_fd() : kept_connections().take(grant.address);
  const bool kept = bool(owned);
  const bool back = grant.address.rfind(kBackStreamPrefix, 0) == 0;
  // Through the owner's host agent (a proc behind its one port) and/or this process's gateway:
  // SOCKS5 on the way, and the go byte once they all answered (directly, or over a kept or back
  // connection: at once).
  const SocksRoute route = back ? SocksRoute{} : socks_route(ways.gateway, to);
  if (!kept && back) {
    owned = ways.take_back ? ways.take_back(grant.address.substr(std::strlen(kBackStreamPrefix))) : unique_fd();
    if (!owned)
      return outcome(StreamOutcome::Status::broken, "no connection the owner at " + grant.address.substr(5) +
                                                        " opened for this node came in time");
  } else if (!kept) {
    try {
      owned.reset(connecting_socket(TcpEndpoint{numeric_host(route.host), route.port, 0}));
    } catch (const std::exception& e) {
      return outcome(StreamOutcome::Status::broken, e.what());
    }
    large_socket_buffers(owned.get());
    int one = 1;
    setsockopt(owned.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  const int fd = owned.get();  // closed on every way out but success, where it is kept
  const std::string where = "the stream to " + (back ? grant.address : to.proxy());
  char hello[kStreamHelloBytes];
  std::memcpy(hello, kStreamMagic, sizeof kStreamMagic);
  std::memcpy(hello + 4, grant.token.data(), 16);
  put_u32(hello + 20, stream);
  put_u64(hello + 24, offset);
  put_u64(hello + 32, length);
  const int stall = stall_ms();
  auto failed = [&](const std::string& why) {
    return outcome(why == "stopped" ? StreamOutcome::Status::stopped : StreamOutcome::Status::broken,
                   where + ": " + why);
  };
  const bool through_agent = !route.hops.empty() && !kept;
  std::string first = (through_agent ? route.requests() : "") + std::string(hello, sizeof hello);
  if (!through_agent) first += '!';
  std::string why = send_all(fd, first.data(), first.size(), go, stall);  // waits out the connect too
  if (why.empty() && through_agent) {
    std::string reply(route.reply_bytes(), '\0');
    why = recv_all(fd, reply.data(), reply.size(), go, stall);
    if (why.empty() && !(why = route.reply_problem(reply)).empty())
      return outcome(StreamOutcome::Status::refused, where + ": " + why);
    if (why.empty()) why = send_all(fd, "!", 1, go, stall);
  }
  char answer = 0;
  if (why.empty()) why = recv_all(fd, &answer, 1, go, stall);
  // A kept connection the owner closed as we took it (its idle time ran out): a new one.
  if (!why.empty() && kept && why != "stopped")
    return run_stream(grant, to, ways, stream, local, offset, length, write, go, pause_ms, true);
  if (!why.empty()) return failed(why);
  if (answer != 'Y') return outcome(StreamOutcome::Status::refused, "the owner refused " + where + ": " + refusal(fd, answer, go));
  why = move_records(fd, grant, stream, local + offset, length, write, go, pause_ms, stall);
  if (!why.empty()) return failed(why);
  kept_connections().put(grant.address, std::move(owned));
  return {};
}
}  // namespace

StreamOutcome stream_transfer(const StreamGrant& grant, char* local, uint64_t size, bool write, int streams,
                              const std::function<bool()>& keep_going, int pause_ms, const StreamWays& ways) {
  TcpEndpoint to;
  try {
    if (grant.address.rfind(kBackStreamPrefix, 0) != 0) to = TcpEndpoint::parse(grant.address);
  } catch (const std::exception& e) {
    return outcome(StreamOutcome::Status::broken, std::string("the owner's stream address: ") + e.what());
  }
  const size_t records = records_in(size);
  const size_t parts = std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(std::max(1, streams)), records));
  const size_t per_part = (records + parts - 1) / parts * kStreamRecord;  // whole records each
  std::vector<StreamOutcome> results(parts);
  std::atomic<bool> failed{false};
  auto go = [&] { return !failed.load() && keep_going(); };
  auto part = [&](size_t k) {
    const uint64_t offset = k * per_part;
    if (offset >= size) return;
    results[k] = run_stream(grant, to, ways, static_cast<uint32_t>(k), local, offset,
                            std::min<uint64_t>(per_part, size - offset), write, go, pause_ms);
    if (!results[k]) failed = true;  // the other parts stop at their next look
  };
  std::vector<std::thread> helpers;
  for (size_t k = 1; k < parts; ++k) helpers.emplace_back(part, k);
  part(0);
  for (auto& t : helpers) t.join();
  // The first real failure, not a part that stopped because of it.
  for (auto& r : results)
    if (!r && r.status != StreamOutcome::Status::stopped) return r;
  for (auto& r : results)
    if (!r) return r;
  return {};
}

}  // namespace xmesh
