// CastTrees: the node's part that sends calls past the fan-out through cast trees (cast_tree.hpp
// has the design) and relays the trees of others: a Node's CallRouter (call_router.hpp), added
// before the node starts (attach). At the origin it takes the targets on other hosts of an actor
// message when there are more than XMESH_CAST_FANOUT of them (16; XMESH_CAST_TREE=off: never,
// =all: this host's procs too) and sends at most that many messages; at a relay it forwards a
// tree's message before its own actor sees it, gathers the answers from behind it and sends them
// up as Replies; a forward that cannot go is answered for everyone behind it, and their order
// numbers are told lost.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "call_router.hpp"
#include "cast_tree.hpp"
#include "node.hpp"
#include "util.hpp"
#include "node_bodies.hpp"

namespace xmesh {

class CastTrees : public NodePart, public CallRouter {
 public:
  // Adds cast trees to node (before node.start()): this part, its router, its Replies handler.
  static CastTrees& attach(Node& node);
  // node's part; std::logic_error when none was attached.
  static CastTrees& of(Node& node);

  explicit CastTrees(Node& node);

  // Calls to more targets on other hosts than this go through a tree; 0 or 1: never.
  size_t fanout() const { return fanout_.load(); }
  void set_fanout(size_t n) { fanout_.store(n); }
  // Whether this host's procs (unix-socket addresses) go through trees too; else they get one
  // message each from the origin. Benchmarks and tests switch it.
  bool local() const { return local_.load(); }
  void set_local(bool on) { local_.store(on); }

  // CallRouter
  Route plan(std::vector<CastTarget>& targets) override;
  void send(const std::shared_ptr<Call>& c, const Route& route, const Header& tmpl,
            const std::vector<zmq::message_t>& frames) override;
  bool take(Message& m) override;
  bool carry_reply(const Message& call_msg, CallResult& r) override;
  bool holding() const override { return gathers_.dirty(); }
  void flush() override;  // the answers gathered here go up their trees
  void peer_failed(const std::string& addr) override { gathers_.reroute(addr); }
  void relayed_lost(const std::string& to, const Header& h, const std::string& why) override;
  void add_stats(NodeStats& s) const override { s.relayed = relayed_.load(); }

 private:
  // One message of a tree to `to`, carrying `cast` (the targets behind it); when it cannot be
  // sent, `failed` answers for everyone it was for.
  void send_hop(const Header& base, const std::vector<zmq::message_t>& frames, const CastTarget& to, CastBody cast,
                std::function<void(const std::string&)> failed);
  // A target of this node's host is reached at its unix socket (over shared memory), not
  // through its host agent's TCP port.
  std::string hop_addr(const CastTarget& t) const;
  void relay(const Message& m, const CastBody& cast, const std::string& origin, const std::string& origin_id);
  void fail_at_relay(const std::string& origin, const std::string& origin_id, uint64_t corr,
                     const std::vector<CastTarget>& targets, const std::string& why);
  void on_replies(Message& m);  // answers coming up a tree: to a gather here, or this node's call
  void send_replies(const std::string& to, const std::string& origin, uint64_t corr, std::vector<CallResult> results);

  Node& node_;
  RouterHost* host_ = nullptr;  // what the node offers its router (set by attach)
  std::atomic<size_t> fanout_{16};
  std::atomic<bool> local_{false};
  Gathers gathers_;
  std::atomic<uint64_t> relayed_{0};
  LogBudget log_{5, 60000};
};

}  // namespace xmesh
