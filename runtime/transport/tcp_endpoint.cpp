#include "tcp_endpoint.hpp"

#include "unique_fd.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace xmesh {

namespace {
bool valid_port(const std::string& port) {
  return !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos &&
         std::stoi(port) <= 65535;
}
}  // namespace

TcpEndpoint TcpEndpoint::parse(const std::string& text) {
  std::string rest = text.rfind("tcp://", 0) == 0 ? text.substr(6) : text;
  int behind = 0;
  if (auto slash = rest.find('/'); slash != std::string::npos) {
    std::string b = rest.substr(slash + 1);
    if (!valid_port(b) || std::stoi(b) == 0)
      throw std::invalid_argument("'" + text + "' names no valid port behind its host agent (tcp://host:port/N)");
    behind = std::stoi(b);
    rest = rest.substr(0, slash);
  }
  auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw std::invalid_argument("'" + text + "' is not a TCP address (host:port)");
  TcpEndpoint e;
  e.host = rest.substr(0, colon);
  if (e.host.size() >= 2 && e.host.front() == '[' && e.host.back() == ']') e.host = e.host.substr(1, e.host.size() - 2);
  std::string port = rest.substr(colon + 1);
  e.behind = behind;
  if (port == "*" && !behind) return e;
  if (!valid_port(port)) throw std::invalid_argument("'" + text + "' has no valid port (0-65535 or *)");
  e.port = std::stoi(port);
  return e;
}

std::string TcpEndpoint::proxy() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return h + ":" + std::to_string(port);
}

std::string TcpEndpoint::str() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return "tcp://" + h + ":" + (port ? std::to_string(port) : std::string("*")) +
         (behind ? "/" + std::to_string(behind) : std::string());
}

bool TcpEndpoint::loopback() const { return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0; }

bool TcpEndpoint::wildcard() const { return host == "0.0.0.0" || host == "::" || host == "*" || host.empty(); }

bool loopback_tcp(const std::string& addr) {
  try {
    return TcpEndpoint::parse(addr).loopback();
  } catch (const std::invalid_argument&) {
    return false;
  }
}

int relayed_port(const std::string& addr) {
  if (addr.rfind("tcp://", 0) != 0 || addr.find('/', 6) == std::string::npos) return 0;
  try {
    return TcpEndpoint::parse(addr).behind;
  } catch (const std::invalid_argument&) {
    return 0;
  }
}

namespace {
// host (an IP address, "localhost", or * / "" for every interface) and port as a socket address;
// false for a name.
bool socket_address(const std::string& host, int port, sockaddr_storage& ss, socklen_t& len) {
  ss = sockaddr_storage{};
  std::string h = (host == "*" || host.empty()) ? "0.0.0.0" : host == "localhost" ? "127.0.0.1" : host;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, h.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v4);
    return true;
  }
  if (inet_pton(AF_INET6, h.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v6);
    return true;
  }
  return false;
}

int port_of(const sockaddr_storage& ss) {
  return ntohs(ss.ss_family == AF_INET ? reinterpret_cast<const sockaddr_in*>(&ss)->sin_port
                                       : reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
}

// Whether port can be bound on host now (and the port the kernel chose for port 0).
std::optional<int> try_bind(const std::string& host, int port) {
  sockaddr_storage ss;
  socklen_t len = 0;
  if (!socket_address(host, port, ss, len)) return std::nullopt;  // a name: the caller listens on an address
  unique_fd fd(socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return std::nullopt;
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) == 0 &&
      getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) == 0)
    return port_of(ss);
  return std::nullopt;
}
}  // namespace

int listening_socket(const TcpEndpoint& at, int* bound_port) {
  sockaddr_storage ss;
  socklen_t len = 0;
  if (!socket_address(at.host, at.port, ss, len))
    throw std::runtime_error("cannot listen on " + at.str() + ": not an IP address");
  unique_fd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) throw std::runtime_error("cannot listen on " + at.str() + ": " + std::strerror(errno));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd.get(), 512) != 0 ||
      getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    throw std::runtime_error("cannot listen on " + at.str() + ": " + std::strerror(errno));
  if (bound_port) *bound_port = port_of(ss);
  return fd.release();
}

int connecting_socket(const TcpEndpoint& to) {
  sockaddr_storage ss;
  socklen_t len = 0;
  if (!socket_address(to.host, to.port, ss, len))
    throw std::runtime_error("cannot connect to " + to.str() + ": not an IP address");
  unique_fd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) throw std::runtime_error("cannot connect to " + to.str() + ": " + std::strerror(errno));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0 && errno != EINPROGRESS)
    throw std::runtime_error("cannot connect to " + to.str() + ": " + std::strerror(errno));
  return fd.release();
}

std::optional<int> free_tcp_port(const std::string& host, int first, int last, const std::set<int>& taken) {
  if (first == 0) {
    for (int attempt = 0; attempt < 16; ++attempt)
      if (auto p = try_bind(host, 0); p && !taken.count(*p)) return p;
    return std::nullopt;
  }
  for (int port = first; port <= last; ++port)
    if (!taken.count(port) && try_bind(host, port)) return port;
  return std::nullopt;
}

std::optional<int> free_tcp_port_from_top(const std::string& host, int first, int last, const std::set<int>& taken) {
  for (int port = last; port >= first; --port)
    if (!taken.count(port) && try_bind(host, port)) return port;
  return std::nullopt;
}

}  // namespace xmesh
