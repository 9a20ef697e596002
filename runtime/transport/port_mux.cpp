#include "port_mux.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "back_links.hpp"
#include "tcp_lane.hpp"
#include "util.hpp"

namespace xmesh {

namespace {
constexpr size_t kPreambleMax = 512;  // a SOCKS5 greeting and request take far less
// ZMTP 3's signature: 0xFF, 8 bytes of padding, 0x7F; a peer sends it before it hears anything.
constexpr size_t kZmtpSignature = 10;
// SOCKS5 replies (RFC 1928): succeeded, general failure, not allowed, refused, command or address
// type not supported.
constexpr uint8_t kSocksOk = 0x00, kSocksFailure = 0x01, kSocksNotAllowed = 0x02, kSocksRefused = 0x05,
                  kSocksNoCommand = 0x07, kSocksNoAddressType = 0x08;

// A SOCKS5 reply with the bound address 127.0.0.1:port.
std::string socks_reply(uint8_t code, int port = 0) {
  std::string r = {0x05, static_cast<char>(code), 0x00, 0x01, 127, 0, 0, 1};
  r.push_back(static_cast<char>((port >> 8) & 0xff));
  r.push_back(static_cast<char>(port & 0xff));
  return r;
}
}  // namespace

PortMux::PortMux(const std::string& listen)
    : preamble_ms_(env_int("XMESH_HANDSHAKE_MS", 5000)),
      max_preambles_(static_cast<size_t>(std::max<int64_t>(1, env_int("XMESH_PORT_PREAMBLES", 128)))),
      max_handshakes_(static_cast<size_t>(std::max<int64_t>(1, env_int("XMESH_PORT_HANDSHAKES", 64)))) {
  listen_fd_.reset(listening_socket(TcpEndpoint::parse(listen), &port_));
  add_listener(listen_fd_.get(), 0);
  handover_sock_.reset(socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));  // none: splice only
}

PortMux::~PortMux() { stop(); }  // its sockets close after (unique_fd)

void PortMux::start(int agent_port) {
  agent_port_ = agent_port;
  start_thread();
}

void PortMux::allow(int port, const std::string& handover) {
  std::lock_guard<std::mutex> g(mu_);
  allowed_[port] = handover;
}

void PortMux::allow_back(int port, const std::string& handover) {
  std::lock_guard<std::mutex> g(mu_);
  back_[port] = handover;
}

void PortMux::allow_remote(const std::string& host, int port) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0 || !found) throw std::runtime_error("cannot resolve " + host + " here: " + gai_strerror(rc));
  Remote r;
  r.name = host;
  r.port = port;
  std::memcpy(&r.addr, found->ai_addr, found->ai_addrlen);
  r.len = found->ai_addrlen;
  freeaddrinfo(found);
  char numeric[NI_MAXHOST] = {};
  getnameinfo(reinterpret_cast<sockaddr*>(&r.addr), r.len, numeric, sizeof numeric, nullptr, 0, NI_NUMERICHOST);
  r.numeric = numeric;
  std::lock_guard<std::mutex> g(mu_);
  for (auto& known : remotes_)
    if (known.name == r.name && known.port == port) {
      known = r;
      return;
    }
  remotes_.push_back(r);
}

bool PortMux::remote_allowed(const std::string& name, int port, Remote* out) const {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& r : remotes_)
    if (r.port == port && (r.name == name || r.numeric == name)) {
      *out = r;
      return true;
    }
  return false;
}

void PortMux::forbid(int port) {
  std::lock_guard<std::mutex> g(mu_);
  allowed_.erase(port);
  back_.erase(port);
}

bool PortMux::allowed(int port, std::string* handover) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = allowed_.find(port);
  if (it == allowed_.end()) return false;
  if (handover) *handover = it->second;
  return true;
}

PortMux::Stats PortMux::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  Stats s = stats_;
  s.event_wakes = event_wakes();
  return s;
}

void PortMux::count(uint64_t Stats::*counter) {
  std::lock_guard<std::mutex> g(mu_);
  ++(stats_.*counter);
}

void PortMux::on_listener(uint64_t) {
  for (;;) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of files: stop accepting for a moment rather than spin on a listener always ready.
        remove_listener(listen_fd_.get());
        accepting_ = false;
        accept_again_ms_ = now_ms() + 100;
      }
      return;
    }
    set_no_delay(fd);
    Conn& c = add_conn(fd, EPOLLIN);
    c.state = kPreamble;
    c.deadline = now_ms() + preamble_ms_;
    count(&Stats::accepted);
    bound_preambles();
  }
}

void PortMux::bound_preambles() {
  std::vector<uint64_t> ids;  // ids grow with each connection: the smallest are the oldest
  for (auto& [id, c] : conns())
    if (!c->spliced && c->state != kConnecting) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i + max_preambles_ < ids.size(); ++i) {
    close_conn(ids[i]);
    count(&Stats::evicted);
  }
}

void PortMux::bound_handshakes(uint64_t id) {
  const int64_t now = now_ms();
  auto settled = [&](const std::pair<uint64_t, int64_t>& h) {  // past the handshake time, or gone
    return now - h.second > preamble_ms_ || !conns().count(h.first);
  };
  while (!handshaking_.empty() && settled(handshaking_.front())) handshaking_.pop_front();
  handshaking_.emplace_back(id, now);
  while (handshaking_.size() > max_handshakes_) {
    close_conn(handshaking_.front().first);
    handshaking_.pop_front();
    count(&Stats::evicted);
  }
}

void PortMux::on_tick(int64_t now) {
  std::vector<uint64_t> late;
  for (auto& [id, c] : conns())
    if (!c->spliced && now > c->deadline) late.push_back(id);
  for (uint64_t id : late) close_conn(id);
  if (!accepting_ && now >= accept_again_ms_) {
    add_listener(listen_fd_.get(), 0);
    accepting_ = true;
  }
}

bool PortMux::on_event(Conn& c, Side side, uint32_t events) {
  if (c.state == kConnecting) {
    if (side == kTarget) return target_connected(c);
    return !(events & (EPOLLHUP | EPOLLERR));
  }
  return side == kClient && read_preamble(c);
}

bool PortMux::read_preamble(Conn& c) {
  char buf[kPreambleMax];
  ssize_t n = ::recv(c.fd[kClient], buf, sizeof buf, 0);
  if (n == 0) return false;
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  c.head.append(buf, static_cast<size_t>(n));
  if (c.head.size() > kPreambleMax) return refuse(c, kSocksFailure);
  if (c.state == kPreamble) {
    const auto first = static_cast<uint8_t>(c.head[0]);
    if (first == 0xFF) {  // a ZMTP greeting: the agent's own socket, once its signature is whole
      if (c.head.size() < kZmtpSignature) return true;
      if (static_cast<uint8_t>(c.head[kZmtpSignature - 1]) != 0x7F) return refuse(c);
      c.pending[kTarget] = std::move(c.head);
      c.head.clear();
      count(&Stats::relayed_to_agent);
      if (!connect_target(c, agent_port_)) return false;
      bound_handshakes(c.id);
      return true;
    }
    if (first != 0x05) return refuse(c);
    if (c.head.size() < 2) return true;
    const size_t need = 2 + static_cast<uint8_t>(c.head[1]);
    if (c.head.size() < need) return true;
    const bool no_auth = std::memchr(c.head.data() + 2, 0x00, need - 2) != nullptr;
    std::string answer = {0x05, static_cast<char>(no_auth ? 0x00 : 0xFF)};
    if (!write_some(c.fd[kClient], answer) || !answer.empty() || !no_auth) return refuse(c);
    c.head.erase(0, need);
    c.state = kSocksRequest;
  }
  return socks_request(c);
}

// VER CMD RSV ATYP DST.ADDR DST.PORT: a CONNECT to 127.0.0.1 (or "localhost") at an allowed port.
bool PortMux::socks_request(Conn& c) {
  const std::string& h = c.head;
  if (h.size() < 5) return true;
  const auto atyp = static_cast<uint8_t>(h[3]);
  size_t addr_len = 0;
  if (atyp == 1)
    addr_len = 4;
  else if (atyp == 3)
    addr_len = 1 + static_cast<uint8_t>(h[4]);
  else
    return refuse(c, kSocksNoAddressType);
  const size_t need = 4 + addr_len + 2;
  if (h.size() < need) return true;
  if (static_cast<uint8_t>(h[0]) != 0x05) return refuse(c);
  if (static_cast<uint8_t>(h[1]) != 0x01) return refuse(c, kSocksNoCommand);
  const int port = (static_cast<uint8_t>(h[4 + addr_len]) << 8) | static_cast<uint8_t>(h[5 + addr_len]);
  const std::string name = atyp == 3 ? h.substr(5, addr_len - 1) : "";
  if (name == kBackSocksName) {
    c.route = 1;
    c.target_port = port;
    c.head.erase(0, need);  // the preamble (or part of it): the pool that takes it reads it
    return back_connection(c, port);
  }
  const bool loopback = atyp == 1 ? static_cast<uint8_t>(h[4]) == 127 : (name == "localhost" || name == "127.0.0.1");
  std::string handover;
  char dotted[INET_ADDRSTRLEN] = {};
  if (atyp == 1) inet_ntop(AF_INET, h.data() + 4, dotted, sizeof dotted);
  Remote to;
  if (remote_allowed(atyp == 1 ? std::string(dotted) : name, port, &to)) {  // another agent, as a gateway
    c.route = 1;
    c.head.erase(0, need);
    c.pending[kTarget] = std::move(c.head);  // what follows (the next hop's request) goes on
    c.head.clear();
    count(&Stats::relayed_to_remote);
    return connect_remote(c, to);
  }
  if (!loopback) return refuse(c, kSocksNotAllowed);
  if (!allowed(port, &handover)) return refuse(c, kSocksNotAllowed);
  c.route = 1;                            // a SOCKS client: answered once the proc is reached
  c.target_port = port;
  c.head.erase(0, need);                  // what is left: anything it sent after its request
  if (!handover.empty() && hand_over(c, handover)) return false;  // the proc's now, not ours
  c.pending[kTarget] = std::move(c.head);
  c.head.clear();
  count(&Stats::relayed_to_procs);
  return connect_target(c, port);
}

// The connection goes to the proc with what it sent after its request; the proc has it before
// the writer hears yes, so nothing the writer sends next is read here.
bool PortMux::hand_over(Conn& c, const std::string& handover) {
  if (!handover_sock_ || !hand_over_lane(handover_sock_.get(), c.fd[kClient], c.head, handover)) return false;
  std::string yes = socks_reply(kSocksOk, c.target_port);
  write_some(c.fd[kClient], yes);  // 10 bytes into an empty socket buffer: taken whole
  count(&Stats::lanes_handed_over);
  return true;
}

// The connection is yes'd first (the controller reads the answer, then waits for a tag), then
// given to the agent's back pool in this process, or handed over to the proc named.
bool PortMux::back_connection(Conn& c, int port) {
  std::string handover;
  if (port != 0) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (auto it = back_.find(port); it != back_.end()) handover = it->second;
    }
    if (handover.empty()) return refuse(c, kSocksNotAllowed);
  } else if (!back_adopter_) {
    return refuse(c, kSocksNotAllowed);
  }
  if (!handover.empty()) {
    if (!hand_over(c, handover)) return refuse(c, kSocksFailure);
    count(&Stats::back);
    return false;  // the proc's now
  }
  std::string yes = socks_reply(kSocksOk, 0);
  if (!write_some(c.fd[kClient], yes) || !yes.empty()) return refuse(c);
  count(&Stats::back);
  back_adopter_(unique_fd(release_fd(c, kClient)), std::move(c.head));
  return false;
}

bool PortMux::connect_target(Conn& c, int port) {
  c.target_port = port;
  unique_fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return refuse(c, kSocksFailure);
  set_no_delay(fd.get());
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 && errno != EINPROGRESS)
    return refuse(c, kSocksRefused);
  c.state = kConnecting;
  set_interest(c, kClient, 0);
  add_target(c, fd.release(), EPOLLOUT);  // the connection's now (closed with it)
  return true;
}

bool PortMux::connect_remote(Conn& c, const Remote& to) {
  c.target_port = to.port;
  unique_fd fd(::socket(to.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return refuse(c, kSocksFailure);
  set_no_delay(fd.get());
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to.addr), to.len) != 0 && errno != EINPROGRESS)
    return refuse(c, kSocksRefused);
  c.state = kConnecting;
  set_interest(c, kClient, 0);
  add_target(c, fd.release(), EPOLLOUT);
  return true;
}

bool PortMux::target_connected(Conn& c) {
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(c.fd[kTarget], SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) return refuse(c, kSocksRefused);
  if (c.route == 1) c.pending[kClient] = socks_reply(kSocksOk, c.target_port);
  return splice(c);
}

bool PortMux::refuse(Conn& c, uint8_t socks_code) {
  if (socks_code != 0 && (c.state == kSocksRequest || c.route == 1)) {
    std::string r = socks_reply(socks_code);
    write_some(c.fd[kClient], r);
  }
  count(&Stats::refused);
  return false;
}

}  // namespace xmesh
