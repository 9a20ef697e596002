#include "socks_route.hpp"

#include <stdexcept>

namespace xmesh {

std::string socks5_request(const SocksHop& hop) {
  std::string r = {0x05, 0x01, 0x00, 0x05, 0x01, 0x00};  // greeting (no authentication), CONNECT
  if (hop.name == "127.0.0.1") {
    r += std::string("\x01\x7f\x00\x00\x01", 5);
  } else {
    if (hop.name.empty() || hop.name.size() > 255) throw std::invalid_argument("a SOCKS5 host name of 1-255 bytes");
    r.push_back(0x03);
    r.push_back(static_cast<char>(hop.name.size()));
    r += hop.name;
  }
  r.push_back(static_cast<char>((hop.port >> 8) & 0xff));
  r.push_back(static_cast<char>(hop.port & 0xff));
  return r;
}

std::string socks5_connect_request(int port) { return socks5_request(SocksHop{"127.0.0.1", port}); }

std::string socks5_reply_problem(const std::string& reply, int port) {
  if (reply.size() >= 2 && reply.compare(0, 2, "\x05\x00", 2) != 0)
    return "the host agent refused SOCKS5 without authentication";
  if (reply.size() >= 4 && reply[3] != 0)  // the CONNECT's answer: 0 is yes
    return "the host agent refused to reach port " + std::to_string(port) + " (SOCKS5 reply " +
           std::to_string(static_cast<uint8_t>(reply[3])) + ")";
  return "";
}

std::string SocksRoute::requests() const {
  std::string all;
  for (auto& hop : hops) all += socks5_request(hop);
  return all;
}

std::string SocksRoute::reply_problem(const std::string& replies) const {
  for (size_t i = 0; i < hops.size() && i * kSocks5ReplyBytes < replies.size(); ++i) {
    std::string problem = socks5_reply_problem(replies.substr(i * kSocks5ReplyBytes, kSocks5ReplyBytes), hops[i].port);
    if (problem.empty()) continue;
    if (hops[i].name != "127.0.0.1")
      problem += " (asked for " + hops[i].name + (hops[i].port ? ":" + std::to_string(hops[i].port) : "") + ")";
    if (i == 0 && hops.size() > 1) problem = "the gateway at " + host + ":" + std::to_string(port) + ": " + problem;
    return problem;
  }
  return "";
}

std::string SocksRoute::describe() const {
  std::string d = host + ":" + std::to_string(port);
  for (auto& hop : hops) d += " -> " + hop.name + ":" + std::to_string(hop.port);
  return d;
}

SocksRoute socks_route(const std::string& gateway, const TcpEndpoint& to, const SocksHop& last) {
  SocksRoute r;
  if (gateway.empty()) {
    r.host = to.host;
    r.port = to.port;
  } else {
    TcpEndpoint g = TcpEndpoint::parse(gateway);  // throws naming what is wrong
    r.host = g.host;
    r.port = g.port;
    r.hops.push_back(SocksHop{to.host, to.port});
  }
  if (!last.name.empty())
    r.hops.push_back(last);
  else if (to.behind)
    r.hops.push_back(SocksHop{"127.0.0.1", to.behind});
  return r;
}

}  // namespace xmesh
