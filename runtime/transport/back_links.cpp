#include "back_links.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <sodium.h>

#include "tcp_lane.hpp"
#include "util.hpp"

namespace xmesh {

namespace {
// A proc's agent refuses its back connections until the proc listens (its first moments): tried
// again quickly, as a DEALER reconnects, so its first message is not late.
constexpr int64_t kFirstBackoffMs = 20, kMaxBackoffMs = 250;
constexpr int64_t kBackHoldMs = 10000;  // a connection for a controller not heard of yet waits this long
constexpr size_t kMaxHeld = 64;         // and so many of them at most
constexpr size_t kMaxAddrBytes = 512;

int socket_error(int fd) {
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  return err;
}

// A socket whose connection to `at` (resolved) is under way; -1 with errno when none.
int start_connect(const sockaddr_storage& at, socklen_t len) {
  int fd = ::socket(at.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  set_no_delay(fd);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&at), len) != 0 && errno != EINPROGRESS) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

void resolve(const std::string& host, int port, sockaddr_storage* out, socklen_t* len) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0 || !found) throw std::runtime_error("cannot resolve " + host + ": " + gai_strerror(rc));
  std::memcpy(out, found->ai_addr, found->ai_addrlen);
  *len = found->ai_addrlen;
  freeaddrinfo(found);
}

// Whether an idle connection has ended (its peer closed it, or sent what an idle one never does).
bool ended(int fd) {
  pollfd pf{fd, POLLIN | POLLRDHUP, 0};
  return ::poll(&pf, 1, 0) != 0;
}
}  // namespace

std::string back_preamble(const std::string& token, const std::string& controller_addr) {
  std::string p(kBackMagic, sizeof kBackMagic);
  p += token;
  p.push_back(static_cast<char>((controller_addr.size() >> 8) & 0xff));
  p.push_back(static_cast<char>(controller_addr.size() & 0xff));
  p += controller_addr;
  return p;
}

bool read_back_preamble(const std::string& bytes, BackPreamble* out, size_t* used, std::string* error) {
  const size_t fixed = sizeof kBackMagic + kBackTokenBytes + 2;
  if (bytes.compare(0, std::min(bytes.size(), sizeof kBackMagic), kBackMagic,
                    std::min(bytes.size(), sizeof kBackMagic)) != 0) {
    *error = "not a back connection (its first bytes are not the preamble's)";
    return false;
  }
  if (bytes.size() < fixed) return false;
  const size_t n = (static_cast<uint8_t>(bytes[fixed - 2]) << 8) | static_cast<uint8_t>(bytes[fixed - 1]);
  if (n == 0 || n > kMaxAddrBytes) {
    *error = "a back connection's preamble names an address of " + std::to_string(n) + " bytes";
    return false;
  }
  if (bytes.size() < fixed + n) return false;
  out->token = bytes.substr(sizeof kBackMagic, kBackTokenBytes);
  out->controller_addr = bytes.substr(fixed, n);
  *used = fixed + n;
  return true;
}

// ---- the controller's side ---------------------------------------------------------------------
BackDialer::BackDialer(std::string token, std::string self_addr, TcpEndpoint router, LaneAdopter adopt_lane)
    : token_(std::move(token)),
      self_addr_(std::move(self_addr)),
      router_(std::move(router)),
      adopt_lane_(std::move(adopt_lane)),
      spares_wanted_(static_cast<int>(std::clamp<int64_t>(env_int("XMESH_BACK_SPARES", 2), 1, 16))) {
  if (router_.wildcard()) router_.host = router_.host.find(':') != std::string::npos ? "::1" : "127.0.0.1";
  tick_ms_ = 100;
  start_thread();
}

BackDialer::~BackDialer() { stop(); }

void BackDialer::reach(const std::string& addr, const std::string& gateway) {
  TcpEndpoint e = TcpEndpoint::parse(addr);  // throws std::invalid_argument naming what is wrong
  SocksRoute route = socks_route(gateway, e, SocksHop{kBackSocksName, e.behind});
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = by_addr_.find(addr);
    if (it != by_addr_.end() && targets_[it->second].route == route) return;
  }
  sockaddr_storage agent{};
  socklen_t agent_len = 0;
  resolve(route.host, route.port, &agent, &agent_len);
  std::lock_guard<std::mutex> g(mu_);
  if (auto it = by_addr_.find(addr); it != by_addr_.end()) {  // its gateway changed: spares go the new way now
    Target& t = targets_[it->second];
    t.route = std::move(route);
    t.agent = agent;
    t.agent_len = agent_len;
    t.backoff_ms = t.retry_at = 0;
    wake();
    return;
  }
  Target t;
  t.addr = addr;
  t.route = std::move(route);
  t.agent = agent;
  t.agent_len = agent_len;
  const uint64_t key = next_key_++;
  by_addr_[addr] = key;
  targets_[key] = std::move(t);
  wake();
}

std::vector<std::string> BackDialer::addrs() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::string> out;
  for (const auto& [addr, key] : by_addr_) out.push_back(addr);
  return out;
}

void BackDialer::forget(const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = by_addr_.find(addr);
  if (it == by_addr_.end()) return;
  targets_.erase(it->second);
  by_addr_.erase(it);
  wake();
}

BackDialer::Stats BackDialer::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

std::string BackDialer::describe(const std::string& addr) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = by_addr_.find(addr);
  if (it == by_addr_.end()) return "";
  const Target& t = targets_.at(it->second);
  const std::string via = t.route.hops.size() > 1 ? " through the gateway at " + t.route.host + ":" +
                                                        std::to_string(t.route.port)
                                                  : "";
  if (!t.failure.empty()) return "back connections to it" + via + " fail (" + t.failure + ")";
  if (t.ready > 0 || t.used > 0)
    return std::to_string(t.ready) + " spare back connection" + (t.ready == 1 ? "" : "s") + " to it" + via +
           " ready, " + std::to_string(t.used) + " used";
  return "no back connection to it" + via + " got through yet (" + std::to_string(t.spares) + " connecting)";
}

void BackDialer::on_wake() { top_up(); }

void BackDialer::on_tick(int64_t) {
  // Spares of addresses forgotten since: closed (their nodes are gone or no longer talked to).
  std::vector<uint64_t> orphans;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& [id, c] : conns())
      if (!c->spliced && c->state != kToRouter && !targets_.count(c->route)) orphans.push_back(id);
  }
  for (uint64_t id : orphans) close_conn(id);
  top_up();
}

void BackDialer::top_up() {
  const int64_t now = now_ms();
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [key, t] : targets_)
    while (t.spares < spares_wanted_ && now >= t.retry_at) {
      int fd = start_connect(t.agent, t.agent_len);
      if (fd < 0) {
        t.failure = std::string("cannot connect: ") + std::strerror(errno);
        t.backoff_ms = t.backoff_ms ? std::min(kMaxBackoffMs, t.backoff_ms * 2) : kFirstBackoffMs;
        t.retry_at = now + t.backoff_ms;
        ++stats_.failed;
        break;
      }
      Conn& c = add_conn(fd, EPOLLOUT);
      c.state = kConnecting;
      c.route = key;
      c.pending[kTarget] = t.route.requests() + back_preamble(token_, self_addr_);  // sent once connected
      ++t.spares;
      ++stats_.opened;
    }
}

bool BackDialer::on_event(Conn& c, Side side, uint32_t events) {
  if (c.state == kToRouter) {
    if (side == kClient) return !(events & (EPOLLHUP | EPOLLERR));
    if (int err = socket_error(c.fd[kTarget])) {
      log_diag("controller", std::string("a back connection cannot reach this controller's own socket at ") +
                                 router_.str() + ": " + std::strerror(err));
      return false;
    }
    return splice(c);
  }
  switch (c.state) {
    case kConnecting: return connected(c);
    case kAwaitingReply: return read_reply(c);
    case kSpare: return read_tag(c);
  }
  return false;
}

bool BackDialer::connected(Conn& c) {
  if (int err = socket_error(c.fd[kClient])) {
    failed(c, std::string("cannot connect: ") + std::strerror(err));
    return false;
  }
  std::string ask = std::move(c.pending[kTarget]);
  c.pending[kTarget].clear();
  if (!write_some(c.fd[kClient], ask) || !ask.empty()) {
    failed(c, "the connection closed at once");
    return false;
  }
  c.state = kAwaitingReply;
  set_interest(c, kClient, EPOLLIN);
  return true;
}

bool BackDialer::read_reply(Conn& c) {
  char buf[512];
  ssize_t n = ::recv(c.fd[kClient], buf, sizeof buf, 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
  if (n <= 0) {
    failed(c, "the host agent closed the connection (an older xmesh-hostd?)");
    return false;
  }
  c.head.append(buf, static_cast<size_t>(n));
  SocksRoute route;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = targets_.find(c.route);
    if (it == targets_.end()) return false;  // forgotten meanwhile
    route = it->second.route;
  }
  if (auto problem = route.reply_problem(c.head); !problem.empty()) {
    failed(c, route.hops.back().port ? problem + ": the proc is gone or not started yet" : problem);
    return false;
  }
  if (c.head.size() < route.reply_bytes()) return true;
  c.head.erase(0, route.reply_bytes());
  c.state = kSpare;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (auto it = targets_.find(c.route); it != targets_.end()) {
      it->second.backoff_ms = 0;
      it->second.failure.clear();
      ++it->second.ready;
    }
  }
  return c.head.empty() || read_tag(c);
}

bool BackDialer::read_tag(Conn& c) {
  if (c.head.empty()) {
    char buf[4096];
    ssize_t n = ::recv(c.fd[kClient], buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    if (n <= 0) {  // the node closed a spare (it is gone, or its pool let it go)
      failed(c, "the node closed it");
      return false;
    }
    c.head.assign(buf, static_cast<size_t>(n));
  }
  const char tag = c.head[0];
  std::string rest = c.head.substr(1);
  c.head.clear();
  if (tag == kBackTagLane) {
    used(c, true);
    adopt_lane_(unique_fd(release_fd(c, kClient)), std::move(rest));
    return false;  // the lane listener's now
  }
  if (tag != kBackTagZmtp) {
    failed(c, "the node wrote an unknown tag on it");
    return false;
  }
  used(c, false);
  sockaddr_storage at{};
  socklen_t len = 0;
  int fd = -1;
  try {
    resolve(router_.host, router_.port, &at, &len);
    fd = start_connect(at, len);
  } catch (const std::exception&) {
  }
  if (fd < 0) return false;
  c.pending[kTarget] = std::move(rest);
  c.state = kToRouter;
  set_interest(c, kClient, 0);
  add_target(c, fd, EPOLLOUT);
  return true;
}

void BackDialer::failed(Conn& c, const std::string& why) {
  {
    std::lock_guard<std::mutex> g(mu_);
    ++stats_.failed;
    auto it = targets_.find(c.route);
    if (it == targets_.end()) return;
    Target& t = it->second;
    --t.spares;
    if (c.state == kSpare) --t.ready;
    t.failure = why;
    t.backoff_ms = t.backoff_ms ? std::min(kMaxBackoffMs, t.backoff_ms * 2) : kFirstBackoffMs;
    t.retry_at = now_ms() + t.backoff_ms;
  }
  c.route = 0;
}

void BackDialer::used(Conn& c, bool lane) {
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = targets_.find(c.route);
    if (it != targets_.end()) {
      --it->second.spares;
      --it->second.ready;
      ++it->second.used;
    }
    ++(lane ? stats_.lanes : stats_.zmtp);
  }
  c.route = 0;
  top_up();
}

// ---- the node's side ---------------------------------------------------------------------------
BackPool::BackPool() {
  tick_ms_ = 500;
  start_thread();
}

BackPool::~BackPool() {
  stop();
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [addr, fds] : idle_)
    for (int fd : fds) ::close(fd);
  for (auto& [key, l] : listener_fds_) ::close(l.fd);
  for (int fd : retired_fds_) ::close(fd);
}

void BackPool::learn(const std::string& addr, const std::string& token) {
  std::lock_guard<std::mutex> g(mu_);
  auto& known = tokens_[addr];
  if (known == token) return;
  known = token;
  learned_ = true;
  wake();
}

bool BackPool::knows(const std::string& addr) const {
  std::lock_guard<std::mutex> g(mu_);
  return tokens_.count(addr) > 0;
}

std::string BackPool::token_for(const std::string& addr) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = tokens_.find(addr);
  return it == tokens_.end() ? "" : to_hex(it->second);
}

void BackPool::offer(unique_fd fd, std::string early) {
  std::lock_guard<std::mutex> g(mu_);
  ++stats_.offered;
  offers_.emplace_back(std::move(fd), std::move(early));
  wake();
}

std::string BackPool::local_endpoint(const std::string& addr) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (auto it = listeners_.find(addr); it != listeners_.end()) return listener_endpoint(it->second);
  }
  int port = 0;
  int fd = listening_socket(TcpEndpoint{"127.0.0.1", 0, 0}, &port);  // throws naming why
  std::lock_guard<std::mutex> g(mu_);
  if (auto it = listeners_.find(addr); it != listeners_.end()) {  // made meanwhile by another thread
    ::close(fd);
    return listener_endpoint(it->second);
  }
  const uint64_t key = next_key_++;
  listeners_[addr] = key;
  listener_fds_[key] = Listener{addr, fd, port};
  add_listener(fd, key);  // epoll_ctl may be called from any thread
  return listener_endpoint(key);
}

std::string BackPool::listener_endpoint(uint64_t key) const {
  return "tcp://127.0.0.1:" + std::to_string(listener_fds_.at(key).port);
}

unique_fd BackPool::take(const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = idle_.find(addr);
  while (it != idle_.end() && !it->second.empty()) {
    unique_fd fd(it->second.front());
    it->second.pop_front();
    const char tag = kBackTagLane;
    if (ended(fd.get()) || ::send(fd.get(), &tag, 1, MSG_NOSIGNAL) != 1) continue;
    ++stats_.taken;
    return fd;
  }
  return unique_fd();
}

void BackPool::forget(const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  tokens_.erase(addr);
  if (auto it = idle_.find(addr); it != idle_.end()) {
    for (int fd : it->second) ::close(fd);
    idle_.erase(it);
  }
  if (auto it = listeners_.find(addr); it != listeners_.end()) {
    auto lf = listener_fds_.find(it->second);
    remove_listener(lf->second.fd);
    retired_fds_.push_back(lf->second.fd);  // closed by the loop, which may be accepting on it now
    listener_fds_.erase(lf);
    listeners_.erase(it);
  }
}

BackPool::Stats BackPool::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  Stats s = stats_;
  s.idle = 0;
  for (auto& [addr, fds] : idle_) s.idle += fds.size();
  return s;
}

void BackPool::on_wake() {
  take_offers();
  bool recheck;
  {
    std::lock_guard<std::mutex> g(mu_);
    recheck = std::exchange(learned_, false);
  }
  if (!recheck) return;
  std::vector<uint64_t> held;
  for (auto& [id, c] : conns())
    if (!c->spliced && c->state == kPreamble) held.push_back(id);
  for (uint64_t id : held)
    if (auto it = conns().find(id); it != conns().end() && !read_preamble(*it->second)) close_conn(id);
}

void BackPool::take_offers() {
  std::vector<std::pair<unique_fd, std::string>> offers;
  {
    std::lock_guard<std::mutex> g(mu_);
    offers.swap(offers_);
  }
  const int64_t now = now_ms();
  for (auto& [fd, early] : offers) {
    set_no_delay(fd.get());
    Conn& c = add_conn(fd.release(), EPOLLIN | EPOLLRDHUP);
    c.state = kPreamble;
    c.head = std::move(early);
    c.deadline = now + kBackHoldMs;
    if (!read_preamble(c)) close_conn(c.id);
  }
  // Bounded: the oldest held connections go first.
  std::vector<uint64_t> held;
  for (auto& [id, c] : conns())
    if (!c->spliced && c->state == kPreamble) held.push_back(id);
  std::sort(held.begin(), held.end());
  for (size_t i = 0; i + kMaxHeld < held.size(); ++i) close_conn(held[i]);
}

// False: close it (refused, or handed on: kept idle or joined).
bool BackPool::read_preamble(Conn& c) {
  BackPreamble p;
  size_t used = 0;
  std::string error;
  if (!read_back_preamble(c.head, &p, &used, &error)) {
    if (error.empty()) return true;  // more to come
    std::lock_guard<std::mutex> g(mu_);
    ++stats_.refused;
    return false;
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = tokens_.find(p.controller_addr);
    if (it == tokens_.end()) return true;  // held: its controller's Hello may be on its way
    const bool right = it->second.size() == kBackTokenBytes &&
                       sodium_memcmp(it->second.data(), p.token.data(), kBackTokenBytes) == 0;
    if (!right || c.head.size() != used) {  // a controller writes nothing more until told to
      ++stats_.refused;
      return false;
    }
  }
  c.head.clear();
  keep(c, p.controller_addr);
  return false;
}

void BackPool::keep(Conn& c, const std::string& addr) {
  int fd = release_fd(c, kClient);
  uint64_t key = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (auto it = listeners_.find(addr); it != listeners_.end()) key = it->second;
  }
  if (key) {
    std::vector<uint64_t> waiting;
    for (auto& [id, w] : conns())
      if (!w->spliced && w->state == kWaitingForBack && w->route == key) waiting.push_back(id);
    if (!waiting.empty()) {
      Conn& local = *conns()[*std::min_element(waiting.begin(), waiting.end())];
      if (!join(local, fd)) close_conn(local.id);
      return;
    }
  }
  std::lock_guard<std::mutex> g(mu_);
  idle_[addr].push_back(fd);
}

bool BackPool::join(Conn& local, int back_fd) {
  {
    std::lock_guard<std::mutex> g(mu_);
    ++stats_.joined;
  }
  local.pending[kTarget] = std::string(1, kBackTagZmtp);
  add_target(local, back_fd, 0);
  return splice(local);
}

void BackPool::on_listener(uint64_t key) {
  int listen_fd;
  std::string addr;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = listener_fds_.find(key);
    if (it == listener_fds_.end()) return;
    addr = it->second.addr;
    listen_fd = it->second.fd;
  }
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    set_no_delay(fd);
    Conn& c = add_conn(fd, EPOLLRDHUP);  // not read before the splice: only its end matters until then
    c.route = key;
    c.state = kWaitingForBack;
    int back = -1;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = idle_.find(addr);
      while (back < 0 && it != idle_.end() && !it->second.empty()) {
        back = it->second.front();
        it->second.pop_front();
        if (ended(back)) {
          ::close(back);
          back = -1;
        }
      }
    }
    if (back >= 0 && !join(c, back)) close_conn(c.id);
  }
}

bool BackPool::on_event(Conn& c, Side side, uint32_t events) {
  if (c.state == kWaitingForBack)  // the DEALER gave up on this connection
    return side == kClient && !(events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR));
  char buf[1024];
  ssize_t n = ::recv(c.fd[kClient], buf, sizeof buf, 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
  if (n <= 0) return false;
  c.head.append(buf, static_cast<size_t>(n));
  if (c.head.size() > sizeof kBackMagic + kBackTokenBytes + 2 + kMaxAddrBytes) return false;
  return read_preamble(c);
}

void BackPool::on_tick(int64_t now) {
  std::vector<uint64_t> late;
  for (auto& [id, c] : conns())
    if (!c->spliced && c->state == kPreamble && now > c->deadline) late.push_back(id);
  for (uint64_t id : late) close_conn(id);
  std::lock_guard<std::mutex> g(mu_);
  stats_.refused += late.size();
  for (int fd : retired_fds_) ::close(fd);
  retired_fds_.clear();
  for (auto& [addr, fds] : idle_)
    for (auto it = fds.begin(); it != fds.end();) {
      if (ended(*it)) {
        ::close(*it);
        it = fds.erase(it);
      } else {
        ++it;
      }
    }
}

}  // namespace xmesh
