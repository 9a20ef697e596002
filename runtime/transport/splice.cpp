#include "splice.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "util.hpp"

namespace xmesh {

namespace {
constexpr uint64_t kWakeKey = ~uint64_t(0);
constexpr uint64_t kListenerBit = uint64_t(1) << 63;
constexpr size_t kChunk = 256 * 1024;
constexpr uint32_t kIn = EPOLLIN, kOut = EPOLLOUT;
}  // namespace

bool write_some(int fd, std::string& bytes) {
  while (!bytes.empty()) {
    ssize_t w = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (w < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    bytes.erase(0, static_cast<size_t>(w));
  }
  return true;
}

void set_no_delay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

SpliceLoop::SpliceLoop() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) throw std::runtime_error(std::string("relay: ") + std::strerror(errno));
  epoll_event ev{EPOLLIN, {}};
  ev.data.u64 = kWakeKey;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
}

SpliceLoop::~SpliceLoop() {
  stop();
  for (auto& kv : conns_)
    for (int fd : kv.second->fd)
      if (fd >= 0) ::close(fd);
  for (int fd : {epoll_fd_, wake_fd_})
    if (fd >= 0) ::close(fd);
}

void SpliceLoop::start_thread() { thread_ = runtime_thread([this] { run(); }); }

void SpliceLoop::stop() {
  stop_ = true;
  wake();
  if (thread_.joinable()) thread_.join();
}

void SpliceLoop::wake() {
  uint64_t one = 1;
  (void)::write(wake_fd_, &one, sizeof one);
}

void SpliceLoop::add_listener(int fd, uint64_t key) {
  epoll_event ev{EPOLLIN, {}};
  ev.data.u64 = key | kListenerBit;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
}

void SpliceLoop::remove_listener(int fd) { epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr); }

SpliceLoop::Conn& SpliceLoop::add_conn(int client_fd, uint32_t events) {
  auto c = std::make_unique<Conn>();
  c->id = next_id_++;
  c->fd[kClient] = client_fd;
  c->interest[kClient] = events;
  epoll_event ev{events, {}};
  ev.data.u64 = c->id << 1;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, client_fd, &ev);
  Conn& ref = *c;
  conns_[c->id] = std::move(c);
  return ref;
}

void SpliceLoop::add_target(Conn& c, int fd, uint32_t events) {
  c.fd[kTarget] = fd;
  c.interest[kTarget] = events;
  epoll_event ev{events, {}};
  ev.data.u64 = (c.id << 1) | 1;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
}

void SpliceLoop::set_interest(Conn& c, int side, uint32_t events) {
  if (c.fd[side] < 0 || c.interest[side] == events) return;
  epoll_event ev{events, {}};
  ev.data.u64 = (c.id << 1) | static_cast<uint64_t>(side);
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd[side], &ev);
  c.interest[side] = events;
}

// Out of the epoll set first: closing a file takes it out only when no other process holds it,
// and a connection handed to a proc (port_mux.hpp) lives on there: left in the set, its bytes
// for the proc would wake this loop again and again.
void SpliceLoop::forget_fd(int fd) {
  if (fd < 0) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  ::close(fd);
}

void SpliceLoop::close_target(Conn& c) {
  forget_fd(c.fd[kTarget]);
  c.fd[kTarget] = -1;
  c.interest[kTarget] = 0;
  c.pending[kTarget].clear();
}

int SpliceLoop::release_fd(Conn& c, int side) {
  const int fd = c.fd[side];
  if (fd >= 0) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  c.fd[side] = -1;
  c.interest[side] = 0;
  return fd;
}

void SpliceLoop::close_conn(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  for (int fd : it->second->fd) forget_fd(fd);
  conns_.erase(it);
}

bool SpliceLoop::splice(Conn& c) {
  c.spliced = true;
  if (!flush(c, kTarget) || !flush(c, kClient)) return false;
  watch_spliced(c);
  return true;
}

void SpliceLoop::run() {
  epoll_event events[64];
  int64_t last_tick = now_ms();
  while (!stop_) {
    // tick_ms_ may change in a hook: the next tick is due tick_ms_ after the last, whatever it was.
    const int wait = static_cast<int>(std::max<int64_t>(0, tick_ms_ - (now_ms() - last_tick)));
    int n = epoll_wait(epoll_fd_, events, 64, wait);
    if (n > 0) event_wakes_.fetch_add(1, std::memory_order_relaxed);
    for (int i = 0; i < n; ++i) {
      const uint64_t key = events[i].data.u64;
      if (key == kWakeKey) {
        uint64_t v;
        (void)::read(wake_fd_, &v, sizeof v);
        if (!stop_) on_wake();
      } else if (key & kListenerBit) {
        on_listener(key & ~kListenerBit);
      } else {
        dispatch(key, events[i].events);
      }
    }
    const int64_t now = now_ms();
    if (now - last_tick >= tick_ms_) {
      last_tick = now;
      on_tick(now);
    }
  }
}

void SpliceLoop::dispatch(uint64_t key, uint32_t events) {
  auto it = conns_.find(key >> 1);
  if (it == conns_.end()) return;  // closed earlier in this batch
  Conn& c = *it->second;
  const Side side = (key & 1) ? kTarget : kClient;
  bool keep = true;
  if (!c.spliced) {
    keep = on_event(c, side, events);
  } else {
    if (events & EPOLLOUT) keep = flush(c, side);
    if (keep && (events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))) keep = pump(c, side);
    if (keep) watch_spliced(c);
  }
  if (!keep) close_conn(c.id);
}

bool SpliceLoop::pump(Conn& c, Side from) {
  const Side to = from == kClient ? kTarget : kClient;
  if (!c.pending[to].empty()) return true;  // the other side has not taken the last read yet
  if (buffer_.empty()) buffer_.resize(kChunk);
  ssize_t n = ::recv(c.fd[from], buffer_.data(), buffer_.size(), 0);
  if (n == 0) return false;
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  c.pending[to].assign(buffer_.data(), static_cast<size_t>(n));
  return flush(c, to);
}

bool SpliceLoop::flush(Conn& c, Side to) { return write_some(c.fd[to], c.pending[to]); }

void SpliceLoop::watch_spliced(Conn& c) {
  for (int s : {kClient, kTarget})
    set_interest(c, s, (c.pending[1 - s].empty() ? kIn : 0) | (c.pending[s].empty() ? 0 : kOut));
}

}  // namespace xmesh
