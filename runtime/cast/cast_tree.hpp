// Cast trees: a call (or broadcast) to many actors leaves its origin as at most `fanout`
// messages. The targets are cut into contiguous slices; the first target of a slice is its relay:
// the relay's node forwards the message to the rest of its slice the same way, in C++ before its
// own actor sees it, and the answers come back up the same tree, batched at each relay (Replies).
// Ranks are host-major, so slices are mostly host-local: one message per host crosses the
// network, and the relays' sends to their neighbours go over shared memory. Order across a tree
// and direct sends is the destination's OrderGate's (runtime/node/order.hpp).
//
// The parts here are plain data structures (Gathers with its own lock); CastTrees
// (cast_trees.hpp) wires them into the node's call path.
#pragma once
#include <cstdint>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bodies.hpp"
#include "node_bodies.hpp"
#include "call.hpp"
#include "wire.hpp"

namespace xmesh {


// [lo, hi) slices of n targets, at most `fanout` of them, in order, sizes differing by at most one.
std::vector<std::pair<size_t, size_t>> cast_slices(size_t n, size_t fanout);

// The host of a target's address, for grouping: "" for a unix socket (the sender's host), the
// host part of a TCP address (tcp://H:P, or tcp://H:P/N behind a host agent's port).
std::string cast_host(const std::string& addr);

// The messages a node sends for a cast: to whom, and the targets behind each (one level of the
// tree). Used by the origin over its targets and by a relay over the targets behind it. Targets
// of one host stay together (ranks are host-major): with several hosts in the list, each message
// goes to the first target of a run of whole hosts, at most `fanout` of them, so that one
// message per host crosses the network and relays forward to their own host's procs; the targets
// of a single host are cut into at most `fanout` slices.
struct CastHop {
  size_t first;                    // position of the hop's receiver in the list sliced
  std::vector<CastTarget> behind;  // the rest of its slice
};
std::vector<CastHop> cast_hops(const std::vector<CastTarget>& targets, size_t fanout);

// The parent of each target (by position) in the tree cast_hops makes: the position of its relay,
// or -1 where the origin sends to it.
std::vector<int32_t> cast_parents(const std::vector<CastTarget>& targets, size_t fanout);

// At a relay: the answers of relayed calls, coming back through this node to go up the tree.
// A gather is keyed by (origin, corr); answers pile up until the node flushes them (after each
// batch of messages it read), then go up as one Replies message. Thread-safe.
class Gathers {
 public:
  struct Batch {
    std::string to;  // the node up the tree (the origin for a first-level relay)
    std::string origin;
    uint64_t corr = 0;
    std::vector<CallResult> results;
  };
  explicit Gathers(size_t limit = 65536) : limit_(limit) {}
  // Answers for (origin, corr) go to `upstream`: `expected` of them (the relay's own and those
  // of the targets behind it).
  void open(const std::string& origin, uint64_t corr, const std::string& upstream, size_t expected);
  // An answer for a gather (moved from r); false when none is open (r is left for the caller to
  // send to the origin itself).
  bool add(const std::string& origin, uint64_t corr, CallResult& r);
  bool dirty() const { return dirty_.load(std::memory_order_acquire); }
  // What to send now; gathers whose every answer went up are closed.
  std::vector<Batch> take();
  // The node up the tree died: later answers of its gathers go to their origin directly.
  void reroute(const std::string& dead_upstream);
  size_t open_count() const;
  size_t remembered() const;  // keys kept for the oldest-first order (bounded by the open ones)

 private:
  struct Gather {
    std::string upstream;
    size_t expected = 0, passed = 0;
    std::vector<CallResult> pending;
  };
  using Key = std::pair<std::string, uint64_t>;
  mutable std::mutex mu_;
  std::map<Key, Gather> gathers_;
  std::deque<Key> order_;  // oldest first: a gather whose answers never all come (a call
                           // answered through a port) is dropped past `limit_`
  std::atomic<bool> dirty_{false};
  size_t limit_;
};

// Answers cut into batches of at most `cap` payload bytes each (an answer larger than that alone
// in its batch), in order.
std::vector<std::vector<CallResult>> split_batches(std::vector<CallResult> results, size_t cap);

// A Replies message: header (kind, corr) and body for `results` (their frames appended to
// `frames`).
Header replies_header(const std::string& origin, uint64_t corr, std::vector<CallResult>& results,
                      std::vector<zmq::message_t>& frames);
// The answers of a Replies message (its frames moved into them), or nullopt with *why.
std::optional<std::vector<CallResult>> read_replies(Message& m, std::string* origin, std::string* why);

}  // namespace xmesh
