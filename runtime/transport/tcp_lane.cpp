#include "tcp_lane.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "back_links.hpp"
#include "fd_passing.hpp"
#include "message_layout.hpp"
#include "util.hpp"

namespace xmesh {

namespace {
constexpr size_t kLengthBytes = 4;
constexpr size_t kMaxPresenting = 64;  // connections owing their token at once (older ones go)

void need_sodium() {
  if (sodium_init() < 0) throw std::runtime_error("libsodium could not be initialised");
}

void nonce_for(uint64_t counter, unsigned char* nonce) {
  std::memset(nonce, 0, crypto_aead_chacha20poly1305_IETF_NPUBBYTES);
  std::memcpy(nonce, &counter, sizeof counter);
}

std::string errno_text(int e) { return std::strerror(e); }

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "an unknown peer";
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, port, sizeof port,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown peer";
  return std::string(host) + ":" + port;
}

// The first address host:port resolves to (a numeric one resolves at once).
addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  std::string bare = host.size() > 1 && host.front() == '[' && host.back() == ']' ? host.substr(1, host.size() - 2) : host;
  int rc = getaddrinfo(bare.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res)
    throw std::runtime_error("cannot resolve " + host + ":" + std::to_string(port) + ": " + gai_strerror(rc));
  return res;
}
}  // namespace

std::string numeric_host(const std::string& host) {
  addrinfo* res = resolve(host, 1, false);
  char text[NI_MAXHOST];
  int rc = getnameinfo(res->ai_addr, res->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST);
  freeaddrinfo(res);
  if (rc != 0) throw std::runtime_error("cannot write the address of " + host + ": " + gai_strerror(rc));
  return text;
}

LaneSecret make_lane_secret() {
  need_sodium();
  std::string token;
  do token = random_bytes(kLaneTokenBytes);
  while (token.compare(0, sizeof kStreamMagic, kStreamMagic, sizeof kStreamMagic) == 0 ||
         token.compare(0, sizeof kBackMagic, kBackMagic, sizeof kBackMagic) == 0);  // (one in 2^31)
  return LaneSecret{random_bytes(kLaneKeyBytes), token};
}

// ---- sealing --------------------------------------------------------------------------------
LaneSealer::LaneSealer(std::string key) : key_(std::move(key)) {
  need_sodium();
  if (key_.size() != kLaneKeyBytes) throw std::invalid_argument("a lane key is 32 bytes");
}

void LaneSealer::seal(const std::vector<uint8_t>& header, const std::vector<zmq::message_t>& frames, std::string& out) {
  LaidOut laid(header, frames);
  std::vector<std::string_view> pieces;
  for (size_t at = 0; at < laid.total; at += kLaneChunk) {
    slice_parts(laid.parts, at, std::min(kLaneChunk, laid.total - at), pieces);
    seal_record(pieces, out);
  }
}

void LaneSealer::seal_bytes(std::string_view plain, std::string& out) {
  if (plain.size() > kLaneChunk) throw std::invalid_argument("a lane record holds at most kLaneChunk bytes");
  seal_record({plain}, out);
}

void LaneSealer::seal_record(const std::vector<std::string_view>& pieces, std::string& out) {
  scratch_.clear();
  for (auto& p : pieces) scratch_.append(p);
  const uint32_t sealed = static_cast<uint32_t>(scratch_.size() + kLaneRecordTag);
  out.append(reinterpret_cast<const char*>(&sealed), kLengthBytes);
  const size_t at = out.size();
  out.resize(at + sealed);
  unsigned char nonce[crypto_aead_chacha20poly1305_IETF_NPUBBYTES];
  nonce_for(counter_++, nonce);
  unsigned long long written = 0;
  crypto_aead_chacha20poly1305_ietf_encrypt(reinterpret_cast<unsigned char*>(&out[at]), &written,
                                            reinterpret_cast<const unsigned char*>(scratch_.data()), scratch_.size(),
                                            nullptr, 0, nullptr, nonce,
                                            reinterpret_cast<const unsigned char*>(key_.data()));
}

// ---- opening --------------------------------------------------------------------------------
LaneOpener::LaneOpener(std::string key, size_t max_message_bytes)
    : key_(std::move(key)), max_message_bytes_(max_message_bytes) {
  need_sodium();
  if (key_.size() != kLaneKeyBytes) throw std::invalid_argument("a lane key is 32 bytes");
}

void LaneOpener::feed(const char* data, size_t n) {
  if (in_at_ > 0 && in_at_ >= in_.size() / 2) {  // keeps the buffer from growing with the stream
    in_.erase(0, in_at_);
    in_at_ = 0;
  }
  in_.append(data, n);
}

LaneOpener::Got LaneOpener::broken(std::string* error, std::string why) {
  broken_ = std::move(why);
  *error = broken_;
  return Got::broken;
}

LaneOpener::Record LaneOpener::open_record(std::string* error) {
  const size_t have = in_.size() - in_at_;
  if (have < kLengthBytes) return Record::none;
  uint32_t sealed;
  std::memcpy(&sealed, in_.data() + in_at_, kLengthBytes);
  if (sealed <= kLaneRecordTag || sealed > kLaneChunk + kLaneRecordTag) {
    *error = "a record of " + std::to_string(sealed) + " bytes (a lane's records hold 1 to " +
             std::to_string(kLaneChunk) + " bytes)";
    return Record::bad;
  }
  if (have < kLengthBytes + sealed) return Record::none;
  record_.resize(sealed - kLaneRecordTag);
  unsigned char nonce[crypto_aead_chacha20poly1305_IETF_NPUBBYTES];
  nonce_for(counter_++, nonce);
  unsigned long long opened = 0;
  const auto* cipher = reinterpret_cast<const unsigned char*>(in_.data() + in_at_ + kLengthBytes);
  if (crypto_aead_chacha20poly1305_ietf_decrypt(reinterpret_cast<unsigned char*>(record_.data()), &opened, nullptr,
                                                cipher, sealed, nullptr, 0, nonce,
                                                reinterpret_cast<const unsigned char*>(key_.data())) != 0) {
    *error = "a record that does not authenticate (another key, or bytes changed, lost or replayed on the way)";
    return Record::bad;
  }
  in_at_ += kLengthBytes + sealed;
  return Record::opened;
}

LaneOpener::Got LaneOpener::next(Message* out, std::string* error, uint64_t* payload) {
  if (!broken_.empty()) return *error = broken_, Got::broken;
  while (true) {
    std::string why;
    switch (open_record(&why)) {
      case Record::none:
        return Got::nothing;
      case Record::bad:
        return broken(error, why);
      case Record::opened:
        break;
    }
    Got got = take_record(out, error, payload);
    if (got != Got::nothing) return got;
  }
}

LaneOpener::Got LaneOpener::take_record(Message* out, std::string* error, uint64_t* payload) {
  if (skipping_) {
    if (record_.size() > skipping_) return broken(error, "a record past the end of a message");
    skipping_ -= record_.size();
    return Got::nothing;
  }
  if (expected_ == 0) return start_message(out, error, payload);
  if (record_.size() > expected_ - message_.size()) return broken(error, "a record past the end of a message");
  message_.append(record_);
  if (message_.size() < expected_) return Got::nothing;
  expected_ = 0;
  bool ok = decode_laid_out(message_, out, error);
  message_.clear();
  message_.shrink_to_fit();
  return ok ? Got::message : broken(error, *error);
}

LaneOpener::Got LaneOpener::start_message(Message* out, std::string* error, uint64_t* payload) {
  LayoutPrefix prefix;
  if (!read_layout_prefix(record_.data(), record_.size(), &prefix) || record_.size() > prefix.total)
    return broken(error, "a record that does not start a message");
  if (prefix.overhead() > kMaxLayoutOverhead)
    return broken(error, "a message whose header and frame list take " + std::to_string(prefix.overhead()) +
                             " bytes (at most " + std::to_string(kMaxLayoutOverhead) + ")");
  if (prefix.payload() > max_message_bytes_) {
    *payload = prefix.payload();
    skipping_ = prefix.total - record_.size();
    if (!decode_laid_out_header(record_, out)) out->header = Header{};
    out->frames.clear();
    return Got::too_large;
  }
  if (record_.size() == prefix.total) {
    bool ok = decode_laid_out(record_, out, error);
    return ok ? Got::message : broken(error, *error);
  }
  expected_ = prefix.total;
  message_ = std::move(record_);
  record_.clear();
  return Got::nothing;
}

// ---- the writer's socket -----------------------------------------------------------------------
LaneWriter::LaneWriter(const SocksRoute& route, const LaneSecret& secret)
    : peer_(route.describe()), sealer_(secret.key), route_(route) {
  if (secret.token.size() != kLaneTokenBytes) throw std::invalid_argument("a lane token is 16 bytes");
  addrinfo* res = resolve(route.host, route.port, false);
  fd_.reset(socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd_) {
    int e = errno;
    freeaddrinfo(res);
    throw std::runtime_error("no socket for a lane to " + peer_ + ": " + errno_text(e));
  }
  set_nodelay(fd_.get());
  int rc = ::connect(fd_.get(), res->ai_addr, res->ai_addrlen);
  int e = errno;
  freeaddrinfo(res);
  if (rc != 0 && e != EINPROGRESS) fail("connecting to " + peer_ + ": " + errno_text(e));
  out_ = route_.requests();  // the token follows
  out_ += secret.token;  // first on the connection (after a SOCKS request), before any record
}

LaneWriter::LaneWriter(unique_fd connected, const std::string& peer, const LaneSecret& secret)
    : fd_(std::move(connected)), peer_(peer), sealer_(secret.key) {
  if (secret.token.size() != kLaneTokenBytes) throw std::invalid_argument("a lane token is 16 bytes");
  set_nodelay(fd_.get());
  out_ = secret.token;
  state_ = State::up;
  send_some();
}

LaneWriter::~LaneWriter() { close(); }

void LaneWriter::close() {
  fd_.reset();
  if (state_ != State::broken) {
    state_ = State::broken;
    if (error_.empty()) error_ = "the lane was closed";
  }
}

void LaneWriter::fail(const std::string& why) {
  if (error_.empty()) error_ = "the lane to " + peer_ + " broke: " + why;
  state_ = State::broken;
}

LaneWriter::State LaneWriter::state() {
  if (state_ == State::socks) read_socks_reply();
  if (state_ != State::connecting) return state_;
  pollfd p{fd_.get(), POLLOUT, 0};
  if (::poll(&p, 1, 0) <= 0) return state_;
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    fail("connecting: " + errno_text(err));
    return state_;
  }
  state_ = route_.hops.empty() ? State::up : State::socks;
  send_some();  // the token (and the SOCKS request before it)
  if (state_ == State::socks) read_socks_reply();
  return state_;
}

void LaneWriter::read_socks_reply() {
  if (!send_some()) return;
  char buf[16];
  while (socks_reply_.size() < route_.reply_bytes()) {
    ssize_t n = ::recv(fd_.get(), buf, std::min(sizeof buf, route_.reply_bytes() - socks_reply_.size()), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) return fail("the host agent closed the connection before answering the request for the proc's lane port");
    socks_reply_.append(buf, static_cast<size_t>(n));
    const std::string problem = route_.reply_problem(socks_reply_);
    if (!problem.empty()) return fail(problem);
  }
  state_ = State::up;
}

bool LaneWriter::send_some() {
  while (out_at_ < out_.size()) {
    ssize_t n = ::send(fd_.get(), out_.data() + out_at_, out_.size() - out_at_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      out_at_ += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    fail(n == 0 ? "nothing could be written" : errno_text(errno));
    return false;
  }
  out_.clear();
  out_at_ = 0;
  return true;
}

LaneWriter::Result LaneWriter::wait_out(int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (pending()) {
    if (!send_some()) return Result::broken;
    if (!pending()) break;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (timeout_ms >= 0 && left <= 0) return Result::timed_out;
    pollfd p{fd_.get(), POLLOUT, 0};
    int rc = ::poll(&p, 1, timeout_ms < 0 ? 1000 : static_cast<int>(std::min<int64_t>(left, 1000)));
    if (rc < 0 && errno != EINTR) {
      fail(errno_text(errno));
      return Result::broken;
    }
  }
  return Result::ok;
}

LaneWriter::Result LaneWriter::write(const std::vector<uint8_t>& header, const std::vector<zmq::message_t>& frames,
                                     bool blocking, int timeout_ms) {
  State s = state();
  if (s == State::broken) return Result::broken;
  if (s == State::connecting || (!blocking && pending() && (send_some(), pending()))) {
    return state_ == State::broken ? Result::broken : Result::would_block;
  }
  sealer_.seal(header, frames, out_);
  if (!send_some()) return Result::broken;
  return blocking ? wait_out(timeout_ms) : Result::ok;
}

LaneWriter::Result LaneWriter::flush(int timeout_ms) {
  if (state() == State::broken) return Result::broken;
  if (state_ == State::connecting) return Result::would_block;
  if (timeout_ms == 0) return send_some() ? Result::ok : Result::broken;
  return wait_out(timeout_ms);
}

// ---- the listener ---------------------------------------------------------------------------
LaneListener::LaneListener(const std::string& host, int port, const std::string& handover) {
  addrinfo* res = resolve(host, port, true);
  fd_.reset(socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  int e = errno;
  if (fd_) {
    int one = 1;
    setsockopt(fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd_.get(), res->ai_addr, res->ai_addrlen) != 0 || listen(fd_.get(), 64) != 0) {
      e = errno;
      fd_.reset();
    }
  }
  freeaddrinfo(res);
  if (!fd_) throw std::runtime_error("cannot listen for lanes on " + host + ":" + std::to_string(port) + ": " + errno_text(e));
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len);
  port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                         : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  adopt_wake_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!adopt_wake_) throw std::runtime_error("cannot listen for lanes: no eventfd: " + errno_text(errno));
  if (handover.empty()) return;
  handover_fd_.reset(bind_unix_datagram(handover));  // throws naming why (fd_ closes with it)
  handover_path_ = handover;
}

LaneListener::~LaneListener() {
  if (handover_fd_) ::unlink(handover_path_.c_str());
}

void LaneListener::expect(const LaneSecret& secret, const std::string& writer_addr, int64_t now_ms, int64_t ttl_ms) {
  ttl_ms_ = ttl_ms;
  expected_.erase(std::remove_if(expected_.begin(), expected_.end(),
                                 [&](auto& e) { return e.second.deadline <= now_ms || e.second.writer_addr == writer_addr; }),
                  expected_.end());
  expected_.push_back({secret.token, Expected{writer_addr, secret.key, now_ms + ttl_ms}});
}

void LaneListener::accept_all(int64_t now_ms) {
  while (true) {
    unique_fd c(accept4(fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!c) return;  // EAGAIN, or a connection that went before it was taken
    set_nodelay(c.get());
    add_presenting(std::move(c), "", now_ms);
  }
}

// Connections the host agent handed over, each with what it read after the SOCKS5 request (the
// token, or part of it). Anything that is not a TCP connection is closed: the socket's file is
// the agent's and this process's only (the runtime directory is theirs), but a proc takes no
// file on trust.
void LaneListener::take_handed_over(int64_t now_ms) {
  if (!handover_fd_) return;
  char head[kHandoverMaxBytes];
  for (int i = 0; i < 64; ++i) {  // bounded: the rest at the next poll
    int received = -1;
    ssize_t n = recv_with_fd(handover_fd_.get(), head, sizeof head, &received, MSG_DONTWAIT);
    if (n < 0) return;
    unique_fd conn(received);
    if (!conn) continue;
    const int fd = conn.get();
    int type = 0;
    socklen_t len = sizeof type;
    sockaddr_storage ss{};
    socklen_t ss_len = sizeof ss;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &ss_len) != 0 ||
        (ss.ss_family != AF_INET && ss.ss_family != AF_INET6))
      continue;
    if (n < 1 || head[0] != kHandoverTag) continue;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    add_presenting(std::move(conn), std::string(head + 1, static_cast<size_t>(n - 1)), now_ms);
  }
}

bool hand_over_lane(int via_sock, int conn_fd, const std::string& read_so_far, const std::string& handover_path) {
  if (read_so_far.size() + 1 > kHandoverMaxBytes) {
    errno = EMSGSIZE;
    return false;
  }
  std::string datagram = kHandoverTag + read_so_far;
  return send_with_fds(via_sock, datagram, {conn_fd}, handover_path, MSG_DONTWAIT) == static_cast<ssize_t>(datagram.size());
}

void LaneListener::add_presenting(unique_fd fd, std::string got, int64_t now_ms) {
  if (presenting_.size() >= kMaxPresenting) presenting_.erase(presenting_.begin());  // a flood: the oldest goes
  std::string peer = peer_name(fd.get());
  presenting_.push_back(Presenting{std::move(fd), std::move(got), std::move(peer), now_ms + ttl_ms_});
}

// Reads what c sent so far; true when c is done with (accepted, refused or gone).
bool LaneListener::read_token(Presenting& c, std::vector<Accepted>& out, std::vector<std::string>* refused) {
  char buf[4096];
  if (c.got.size() < kLaneTokenBytes) {  // a handed-over connection may bring its token along
    ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    if (n <= 0) return true;  // gone: closed with its entry
    c.got.append(buf, static_cast<size_t>(n));
  }
  if (stream_adopter_ && c.got.size() >= sizeof kStreamMagic &&
      c.got.compare(0, sizeof kStreamMagic, kStreamMagic, sizeof kStreamMagic) == 0) {
    stream_adopter_(std::move(c.fd), std::move(c.got));  // a data-plane stream: its server owns it now
    return true;
  }
  if (back_adopter_ && c.got.size() >= sizeof kBackMagic &&
      c.got.compare(0, sizeof kBackMagic, kBackMagic, sizeof kBackMagic) == 0) {
    back_adopter_(std::move(c.fd), std::move(c.got));  // a controller's back connection (back_links.hpp)
    return true;
  }
  if (c.got.size() < kLaneTokenBytes) return false;
  auto it = std::find_if(expected_.begin(), expected_.end(), [&](auto& e) {
    return sodium_memcmp(e.first.data(), c.got.data(), kLaneTokenBytes) == 0;
  });
  if (it == expected_.end()) {
    if (refused) refused->push_back("a lane connection from " + c.peer + " presented a token this node did not give");
    return true;
  }
  out.push_back(Accepted{std::move(c.fd), it->second.writer_addr, it->second.key, c.got.substr(kLaneTokenBytes)});
  expected_.erase(it);  // each token opens one lane
  return true;
}

void LaneListener::adopt(unique_fd fd, std::string early) {
  std::lock_guard<std::mutex> g(adopted_mu_);
  adopted_.emplace_back(std::move(fd), std::move(early));
  uint64_t one = 1;
  (void)::write(adopt_wake_.get(), &one, sizeof one);
}

void LaneListener::take_adopted(int64_t now_ms) {
  std::vector<std::pair<unique_fd, std::string>> adopted;
  {
    std::lock_guard<std::mutex> g(adopted_mu_);
    adopted.swap(adopted_);
    uint64_t n;
    (void)::read(adopt_wake_.get(), &n, sizeof n);
  }
  for (auto& [fd, early] : adopted) add_presenting(std::move(fd), std::move(early), now_ms);
}

std::vector<LaneListener::Accepted> LaneListener::poll(int64_t now_ms, std::vector<std::string>* refused) {
  accept_all(now_ms);
  take_handed_over(now_ms);
  take_adopted(now_ms);
  std::vector<Accepted> out;
  for (size_t i = 0; i < presenting_.size();) {
    Presenting& c = presenting_[i];
    bool done = read_token(c, out, refused);
    if (!done && c.deadline <= now_ms) {
      if (refused) refused->push_back("a lane connection from " + c.peer + " did not present a token in time");
      done = true;
    }
    if (done)
      presenting_.erase(presenting_.begin() + static_cast<long>(i));
    else
      ++i;
  }
  expected_.erase(std::remove_if(expected_.begin(), expected_.end(), [&](auto& e) { return e.second.deadline <= now_ms; }),
                  expected_.end());
  return out;
}

void LaneListener::fds(std::vector<int>& out) const {
  out.push_back(fd_.get());
  out.push_back(adopt_wake_.get());
  if (handover_fd_) out.push_back(handover_fd_.get());
  for (auto& c : presenting_) out.push_back(c.fd.get());
}

// ---- a lane being read ----------------------------------------------------------------------
LaneIn::LaneIn(LaneListener::Accepted accepted, size_t max_message_bytes)
    : fd_(std::move(accepted.fd)), writer_addr_(std::move(accepted.writer_addr)), opener_(std::move(accepted.key), max_message_bytes) {
  if (!accepted.early.empty()) opener_.feed(accepted.early.data(), accepted.early.size());
}

LaneIn::~LaneIn() = default;

LaneIn::Status LaneIn::drain(std::vector<Message>& out, std::vector<TooLarge>& too_large, std::string* error) {
  while (true) {
    Message m;
    uint64_t payload = 0;
    switch (opener_.next(&m, error, &payload)) {
      case LaneOpener::Got::nothing:
        return Status::open;
      case LaneOpener::Got::broken:
        return Status::broken;
      case LaneOpener::Got::message:
        m.sender_addr = writer_addr_;
        out.push_back(std::move(m));
        break;
      case LaneOpener::Got::too_large:
        m.sender_addr = writer_addr_;
        too_large.push_back(TooLarge{std::move(m), payload});
        break;
    }
  }
}

LaneIn::Status LaneIn::read(std::vector<Message>& out, std::vector<TooLarge>& too_large, std::string* error,
                            size_t budget) {
  Status s = drain(out, too_large, error);  // bytes that came with the token
  if (s != Status::open) return s;
  char buf[64 << 10];
  for (size_t got = 0; got < budget;) {
    ssize_t n = ::recv(fd_.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::open;
    if (n <= 0) {
      if (n < 0) *error = errno_text(errno);
      return Status::closed;
    }
    got += static_cast<size_t>(n);
    opener_.feed(buf, static_cast<size_t>(n));
    s = drain(out, too_large, error);
    if (s != Status::open || static_cast<size_t>(n) < sizeof buf) return s;  // short: the socket is empty now
  }
  return Status::open;
}

}  // namespace xmesh
