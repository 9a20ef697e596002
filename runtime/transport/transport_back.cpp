// A controller the nodes cannot connect to (transport.hpp, back_links.hpp): the controller's
// side (its token in Hello, spare connections kept open to each TCP peer) and a node's side (the
// controllers it reaches back, its DEALERs to them rerouted through the back pool).
#include <chrono>
#include <thread>

#include <zmq_addon.hpp>

#include "relay_dialer.hpp"
#include "socks_route.hpp"
#include "transport.hpp"
#include "transport_sockets.hpp"
#include "util.hpp"

namespace xmesh {
using namespace transport_sockets;

void Transport::set_reach_back(bool on) {
  if (on) {
    const std::string bound = tcp_bound_addr(), addr = tcp_addr();
    if (bound.empty())
      throw std::runtime_error("a controller reached back needs a TCP address of its own first (listen_tcp)");
    std::lock_guard<std::mutex> g(back_mu_);
    if (!back_dialer_) {
      back_token_ = random_bytes(kBackTokenBytes);
      back_dialer_ = std::make_unique<BackDialer>(
          back_token_, addr, TcpEndpoint::parse(bound), [this](unique_fd fd, std::string early) {
            std::lock_guard<std::mutex> lg(lanes_mu_);
            if (lane_listener_) lane_listener_->adopt(std::move(fd), std::move(early));
          });
    }
  }
  reach_back_.store(on);
}

BackDialer* Transport::back_dialer() const {
  if (!reach_back_.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> g(back_mu_);
  return back_dialer_.get();
}

void Transport::reach_back_to(const std::string& addr) {
  if (!is_tcp(addr)) return;
  if (BackDialer* d = back_dialer()) d->reach(addr, gateway_for(addr));
}

void Transport::set_gateway(const std::string& host_port) {
  if (!host_port.empty()) {
    TcpEndpoint e = TcpEndpoint::parse(host_port);  // throws naming what is wrong
    if (e.behind || e.port == 0) throw std::invalid_argument("a gateway is a host agent's host:port, not " + host_port);
  }
  {
    std::lock_guard<std::mutex> g(gateway_mu_);
    gateway_ = host_port;
  }
  // Connections relayed before and spare back connections (through a gateway that may be gone:
  // a port forward that ended) take the new way from their next connect on. A gateway that does
  // not resolve is left to the connects through it to say.
  RelayDialer* dialer;
  {
    std::lock_guard<std::mutex> g(dialer_mu_);
    dialer = dialer_.get();
  }
  for (const std::string& addr : dialer ? dialer->addrs() : std::vector<std::string>{}) {
    try {
      dialer->local_endpoint(addr, socks_route(gateway_for(addr), TcpEndpoint::parse(addr)));
    } catch (const std::exception&) {
    }
  }
  BackDialer* back = back_dialer();
  for (const std::string& addr : back ? back->addrs() : std::vector<std::string>{}) {
    try {
      back->reach(addr, gateway_for(addr));
    } catch (const std::exception&) {
    }
  }
}

std::string Transport::gateway() const {
  std::lock_guard<std::mutex> g(gateway_mu_);
  return gateway_;
}

std::string Transport::gateway_for(const std::string& addr) const {
  const std::string gw = gateway();
  if (gw.empty() || !is_tcp(addr)) return "";
  TcpEndpoint to = TcpEndpoint::parse(addr), via = TcpEndpoint::parse(gw);
  return to.host == via.host && to.port == via.port && !to.behind ? "" : gw;
}

BackPool& Transport::back_pool() {
  std::lock_guard<std::mutex> g(back_mu_);
  if (!back_pool_) {
    back_pool_ = std::make_unique<BackPool>();
    has_back_pool_.store(true);
  }
  return *back_pool_;
}

void Transport::learn_back(const std::string& addr, const std::string& token_hex) {
  std::string token;
  if (!is_tcp(addr) || !from_hex(token_hex, &token) || token.size() != kBackTokenBytes) {
    count_malformed("ignored a back token that does not read (for " + addr + ")");
    return;
  }
  back_pool().learn(addr, token);
}

std::string Transport::back_token_for(const std::string& addr) const {
  if (!has_back_pool_.load()) return "";
  std::lock_guard<std::mutex> g(back_mu_);
  return back_pool_->token_for(addr);
}

void Transport::adopt_back_connection(unique_fd fd, std::string early) { back_pool().offer(std::move(fd), std::move(early)); }

Transport::BackStats Transport::back_stats() const {
  BackStats s;
  std::lock_guard<std::mutex> g(back_mu_);
  if (back_dialer_) s.dialer = back_dialer_->stats();
  if (back_pool_) s.pool = back_pool_->stats();
  return s;
}

unique_fd Transport::take_back_connection(const std::string& from, int wait_ms) {
  if (!has_back_pool_.load()) return unique_fd();
  const int64_t deadline = now_ms() + wait_ms;
  for (;;) {  // its controller opens another as soon as one is taken: a few milliseconds
    if (unique_fd fd = back_pool().take(from)) return fd;
    if (now_ms() >= deadline) return unique_fd();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void Transport::reroute_to_back(const std::string& addr) {
  auto p = existing_out_peer(addr);
  if (!p) return;
  std::unique_lock<std::mutex> g(p->mu, std::try_to_lock);  // the I/O thread never waits for a sender
  if (g.owns_lock()) return reroute_locked(p);
  p->reroute_due = true;  // its sender (send_once) or the I/O thread's next tick does it
  std::lock_guard<std::mutex> tg(mu_);
  reroutes_.push_back(p);
}

void Transport::reroute_locked(const std::shared_ptr<OutPeer>& p) {
  p->reroute_due = false;
  if (!p->sock || p->via_back) return;
  p->sock->set(zmq::sockopt::linger, 0);
  close_peer_locked(*p);  // what it held unacknowledged goes again on the new one, after Hello
  try {
    open_socket_locked(*p, false);
  } catch (const SendError& e) {
    log_diag(self_.role, std::string("cannot reach ") + p->addr + " back: " + e.what());
    return;
  }
  p->hello_due = true;
  p->handshaken = false;
  std::lock_guard<std::mutex> g(mu_);
  handshaking_.push_back(p);
}

void Transport::tend_reroutes() {
  std::vector<std::weak_ptr<OutPeer>> due, kept;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (reroutes_.empty()) return;
    due.swap(reroutes_);
  }
  for (auto& w : due) {
    auto p = w.lock();
    if (!p || !p->reroute_due) continue;
    std::unique_lock<std::mutex> g(p->mu, std::try_to_lock);
    if (g.owns_lock())
      reroute_locked(p);
    else
      kept.push_back(w);
  }
  std::lock_guard<std::mutex> g(mu_);
  reroutes_.insert(reroutes_.end(), kept.begin(), kept.end());
}

}  // namespace xmesh
