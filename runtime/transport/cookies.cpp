#include "cookies.hpp"

namespace xmesh {

void Cookies::accept(const std::string& cookie) {
  std::lock_guard<std::mutex> g(mu_);
  accepted_.insert(cookie);
}

bool Cookies::accepts(const std::string& cookie) const {
  std::lock_guard<std::mutex> g(mu_);
  return accepted_.count(cookie) > 0;
}

std::string Cookies::reply_cookie() const {
  std::lock_guard<std::mutex> g(mu_);
  return accepted_.empty() ? "" : *accepted_.begin();
}

void Cookies::present(const std::string& addr, const std::string& cookie) {
  std::lock_guard<std::mutex> g(mu_);
  peers_[addr] = cookie;
  learned_.erase(addr);
}

void Cookies::present_by_default(const std::string& cookie) {
  std::lock_guard<std::mutex> g(mu_);
  default_ = cookie;
}

std::string Cookies::for_peer(const std::string& addr) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = peers_.find(addr);
  return it != peers_.end() ? it->second : default_;
}

void Cookies::learn(const std::string& addr, const std::string& cookie) {
  std::lock_guard<std::mutex> g(mu_);
  if (!cookie.empty() && peers_.emplace(addr, cookie).second) learned_.insert(addr);
}

void Cookies::forget_learned(const std::string& addr) {
  std::lock_guard<std::mutex> g(mu_);
  if (learned_.erase(addr)) peers_.erase(addr);
}

}  // namespace xmesh
