// Cookies: the secrets a node's links present and accept (handshake.hpp: the PLAIN password of
// a unix-socket link; on a CURVE link the one its Hello carries). Thread-safe; its lock is
// taken inside the transport's own (innermost of all).
#pragma once
#include <map>
#include <mutex>
#include <set>
#include <string>

namespace xmesh {

class Cookies {
 public:
  // Peers presenting `cookie` are let in (the transport's accept cookie, a controller's that
  // a host agent serves).
  void accept(const std::string& cookie);
  bool accepts(const std::string& cookie) const;
  // The one a Hello asks its peer to present when it connects back ("" when none is accepted).
  std::string reply_cookie() const;
  // What to present to the node at addr (set by the caller: kept for good).
  void present(const std::string& addr, const std::string& cookie);
  // What to present to a node no cookie was given for.
  void present_by_default(const std::string& cookie);
  std::string for_peer(const std::string& addr) const;
  // A Hello from addr asked for `cookie` back: presented to addr unless one was given for it.
  void learn(const std::string& addr, const std::string& cookie);
  // addr belongs to another process now, or is gone: what a Hello taught about it is forgotten
  // (one given with present() stays).
  void forget_learned(const std::string& addr);

 private:
  mutable std::mutex mu_;
  std::set<std::string> accepted_;
  std::map<std::string, std::string> peers_;
  std::set<std::string> learned_;  // the peers_ entries a Hello gave
  std::string default_;
};

}  // namespace xmesh
