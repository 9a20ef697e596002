#include "relay_dialer.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>

#include "tcp_endpoint.hpp"
#include "util.hpp"

namespace xmesh {

namespace {
constexpr int64_t kFirstBackoffMs = 10, kMaxBackoffMs = 200;  // as the node's DEALERs reconnect
}  // namespace

RelayDialer::RelayDialer() {
  tick_ms_ = 1000;
  start_thread();
}

RelayDialer::~RelayDialer() {
  stop();
  for (auto& [key, r] : routes_) ::close(r.listen_fd);
  for (int fd : retired_fds_) ::close(fd);
}

std::string RelayDialer::local_endpoint(const std::string& addr, const SocksRoute& route) {
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = by_addr_.find(addr);
    if (it != by_addr_.end() && routes_[it->second].route == route) return routes_[it->second].endpoint;
  }
  Route r;
  r.addr = addr;
  r.route = route;
  addrinfo hints{}, *found = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(route.host.c_str(), std::to_string(route.port).c_str(), &hints, &found);
  if (rc != 0 || !found) throw std::runtime_error("cannot resolve " + route.host + ": " + gai_strerror(rc));
  std::copy_n(reinterpret_cast<const char*>(found->ai_addr), found->ai_addrlen, reinterpret_cast<char*>(&r.agent));
  r.agent_len = found->ai_addrlen;
  freeaddrinfo(found);
  {
    std::lock_guard<std::mutex> g(mu_);
    if (auto it = by_addr_.find(addr); it != by_addr_.end()) {  // known (or made meanwhile): this route from now on
      Route& known = routes_[it->second];
      known.route = std::move(r.route);
      known.agent = r.agent;
      known.agent_len = r.agent_len;
      return known.endpoint;
    }
  }
  int port = 0;
  r.listen_fd = listening_socket(TcpEndpoint{"127.0.0.1", 0, 0}, &port);
  r.endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  std::lock_guard<std::mutex> g(mu_);
  if (auto it = by_addr_.find(addr); it != by_addr_.end()) {  // made meanwhile by another thread
    ::close(r.listen_fd);
    return routes_[it->second].endpoint;
  }
  const uint64_t key = next_key_++;
  by_addr_[addr] = key;
  std::string endpoint = r.endpoint;
  const int fd = r.listen_fd;
  routes_[key] = std::move(r);
  add_listener(fd, key);  // epoll_ctl may be called from any thread
  return endpoint;
}

std::vector<std::string> RelayDialer::addrs() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::string> out;
  for (const auto& [addr, key] : by_addr_) out.push_back(addr);
  return out;
}

void RelayDialer::forget(const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = by_addr_.find(addr);
  if (it == by_addr_.end()) return;
  auto r = routes_.find(it->second);
  remove_listener(r->second.listen_fd);
  retired_fds_.push_back(r->second.listen_fd);  // closed by the loop, which may be accepting on it now
  routes_.erase(r);
  by_addr_.erase(it);
}

void RelayDialer::on_listener(uint64_t key) {
  int listen_fd;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = routes_.find(key);
    if (it == routes_.end()) return;
    listen_fd = it->second.listen_fd;
  }
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    set_no_delay(fd);
    // Not read before the splice: only its end matters until then.
    Conn& c = add_conn(fd, EPOLLRDHUP);
    c.route = key;
    connect_upstream(c);
  }
}

void RelayDialer::connect_upstream(Conn& c) {
  sockaddr_storage agent;
  socklen_t len;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = routes_.find(c.route);
    if (it == routes_.end()) return back_off(c);  // forgotten: its node closes the connection soon
    agent = it->second.agent;
    len = it->second.agent_len;
    c.head = it->second.route.requests();  // sent once connected; the replies are read into head then
  }
  int fd = ::socket(agent.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return back_off(c);
  set_no_delay(fd);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&agent), len) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return back_off(c);
  }
  c.state = kConnecting;
  add_target(c, fd, EPOLLOUT);
}

bool RelayDialer::on_event(Conn& c, Side side, uint32_t events) {
  if (side == kClient) return !(events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR));  // the node hung up
  if (c.state == kConnecting) return upstream_connected(c);
  if (c.state == kAwaitingReply) return read_reply(c);
  return true;
}

bool RelayDialer::upstream_connected(Conn& c) {
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(c.fd[kTarget], SOL_SOCKET, SO_ERROR, &err, &len);
  std::string ask = std::move(c.head);
  c.head.clear();
  if (err != 0 || !write_some(c.fd[kTarget], ask) || !ask.empty()) {
    back_off(c);
    return true;
  }
  c.state = kAwaitingReply;
  set_interest(c, kTarget, EPOLLIN);
  return true;
}

bool RelayDialer::read_reply(Conn& c) {
  char buf[4096];
  ssize_t n = ::recv(c.fd[kTarget], buf, sizeof buf, 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
  if (n <= 0) {
    back_off(c);
    return true;
  }
  c.head.append(buf, static_cast<size_t>(n));
  SocksRoute route;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = routes_.find(c.route);
    if (it == routes_.end()) {
      back_off(c);
      return true;
    }
    route = it->second.route;
  }
  if (!route.reply_problem(c.head).empty()) {  // the proc does not listen (yet), or a hop refused
    back_off(c);
    return true;
  }
  if (c.head.size() < route.reply_bytes()) return true;
  c.pending[kClient] = c.head.substr(route.reply_bytes());  // the node's first bytes, if they came along
  c.head.clear();
  c.backoff_ms = 0;
  return splice(c);
}

void RelayDialer::back_off(Conn& c) {
  close_target(c);
  c.head.clear();
  c.state = kBackoff;
  c.backoff_ms = c.backoff_ms ? std::min(kMaxBackoffMs, c.backoff_ms * 2) : kFirstBackoffMs;
  c.deadline = now_ms() + c.backoff_ms;
  tick_ms_ = static_cast<int>(kFirstBackoffMs);
}

void RelayDialer::on_tick(int64_t now) {
  {
    std::lock_guard<std::mutex> g(mu_);
    for (int fd : retired_fds_) ::close(fd);
    retired_fds_.clear();
  }
  // Quick ticks while something backs off (a retry that fails again backs off anew, setting them).
  bool waiting = false;
  std::vector<Conn*> due;
  for (auto& [id, c] : conns())
    if (!c->spliced && c->state == kBackoff) {
      if (now >= c->deadline)
        due.push_back(c.get());
      else
        waiting = true;
    }
  tick_ms_ = waiting ? static_cast<int>(kFirstBackoffMs) : 1000;
  for (Conn* c : due) connect_upstream(*c);
}

}  // namespace xmesh
