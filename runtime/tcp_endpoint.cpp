#include "tcp_endpoint.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace xmesh {

TcpEndpoint TcpEndpoint::parse(const std::string& text) {
  std::string rest = text.rfind("tcp://", 0) == 0 ? text.substr(6) : text;
  auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw std::invalid_argument("'" + text + "' is not a TCP address (host:port)");
  TcpEndpoint e;
  e.host = rest.substr(0, colon);
  if (e.host.size() >= 2 && e.host.front() == '[' && e.host.back() == ']') e.host = e.host.substr(1, e.host.size() - 2);
  std::string port = rest.substr(colon + 1);
  if (port == "*") return e;
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) > 65535)
    throw std::invalid_argument("'" + text + "' has no valid port (0-65535 or *)");
  e.port = std::stoi(port);
  return e;
}

std::string TcpEndpoint::str() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return "tcp://" + h + ":" + (port ? std::to_string(port) : std::string("*"));
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

namespace {
// Whether port can be bound on host now (and the port the kernel chose for port 0).
std::optional<int> try_bind(const std::string& host, int port) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  int family = AF_INET;
  std::string h = (host == "*" || host.empty()) ? "0.0.0.0" : host == "localhost" ? "127.0.0.1" : host;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, h.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v4);
  } else if (inet_pton(AF_INET6, h.c_str(), &v6->sin6_addr) == 1) {
    family = AF_INET6;
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v6);
  } else {
    return std::nullopt;  // a name: the caller listens on an address
  }
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  std::optional<int> got;
  if (bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0 && getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0)
    got = ntohs(family == AF_INET ? v4->sin_port : v6->sin6_port);
  close(fd);
  return got;
}
}  // namespace

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

}  // namespace xmesh
