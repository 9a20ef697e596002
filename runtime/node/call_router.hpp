// CallRouter: the seam through which a way of reaching many targets other than one message each
// plugs into a node's call path: cast trees (runtime/cast/cast_trees.hpp) implement it, above
// the node; a node without one sends one message per target and refuses to relay.
//
// The node keeps what is every call's: order numbers per destination, the order gate, direct
// sends, supervision of the targets. The router takes the targets it will reach, sends the
// call's message along its route, relays messages that came for others, carries the answers of
// those back its own way, and hears which peers failed and which relayed messages were lost.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bodies.hpp"
#include "node_bodies.hpp"
#include "call.hpp"
#include "transport.hpp"
#include "wire.hpp"

namespace xmesh {

// What a node offers its router, and only it (Node::set_router hands it over): order numbers
// that will not come, sends that may wait, answers for the node's own calls, its addresses.
class RouterHost {
 public:
  // The order numbers of `targets` that will not come (their message was lost or never sent):
  // their destinations hear it (CastLost; origin_id: whose numbers they are).
  virtual void tell_lost(const std::vector<CastTarget>& targets, const std::string& origin_id) = 0;
  // Sends now or, on a thread that must not wait and a full link, through the xmesh-relay thread
  // (always through it when !try_now); `failed` answers for a message that could not go.
  virtual void send_or_defer(const std::string& addr, Header h, const std::vector<zmq::message_t>& frames,
                             std::function<void(const std::string&)> failed, bool try_now = true) = 0;
  // Answers for the node's own call `corr` (Replies through a tree): filed into the call.
  virtual void deliver(uint64_t corr, std::vector<CallResult> results) = 0;
  // One of the node's own addresses (unix socket or TCP).
  virtual bool mine(const std::string& addr) const = 0;

 protected:
  ~RouterHost() = default;
};

class CallRouter {
 public:
  virtual ~CallRouter() = default;

  // The targets a router reaches for one call, and for supervision, the relay of each (its
  // position in `targets`, or -1: sent to from here).
  struct Route {
    std::vector<CastTarget> targets;
    std::vector<int32_t> relay_of;
    size_t fanout = 0;
  };
  // Of a call's live, numbered targets (an actor message's), moves those the router will reach
  // out of `targets` into the route (none: it leaves them all). Before the call is registered.
  virtual Route plan(std::vector<CastTarget>& targets) = 0;
  // Sends the call's message (tmpl: its header, corr set) along the route; what cannot go is
  // answered into c. After the call is registered.
  virtual void send(const std::shared_ptr<Call>& c, const Route& route, const Header& tmpl,
                    const std::vector<zmq::message_t>& frames) = 0;
  // An actor message that came with a router's part ("cast" in its body): forwarded to the
  // targets behind this node, then made its own target's. false: it does not read (answered).
  virtual bool take(Message& m) = 0;
  // The answer to a message that came through the router (Message::gathered): true when the
  // router carries it (r moved from); false: the node sends it to the message's origin.
  virtual bool carry_reply(const Message& call_msg, CallResult& r) = 0;
  // Answers held to go together: flush() sends them (after a batch of input, on each tick).
  virtual bool holding() const = 0;
  virtual void flush() = 0;
  // The peer at addr failed: what was to go up through it goes around it.
  virtual void peer_failed(const std::string& addr) = 0;
  // A message this node relayed to `to` was lost with the link it was on (a broken ring).
  virtual void relayed_lost(const std::string& to, const Header& h, const std::string& why) = 0;
  virtual void add_stats(NodeStats& s) const = 0;
};

}  // namespace xmesh
