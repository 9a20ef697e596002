// The C++ state behind a Future: one outstanding call to N targets. The node's I/O thread
// delivers replies (or supervision failures) into it; any thread waits on it without Python.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "event_fd.hpp"
#include "spin.hpp"
#include "wait_feed.hpp"
#include "wire.hpp"

namespace xmesh {

struct CallResult {
  int64_t index = 0;     // which target answered
  bool ok = false;       // true: frames hold the pickled value; false: an error
  json body;             // error details (kind, text, rank...) when !ok
  std::vector<zmq::message_t> frames;
};

// Why a wait_for returned.
enum class WaitOutcome { Ready, Woken, Timeout };

class Call {
 public:
  Call(uint64_t id, std::vector<std::string> target_addrs);
  // A port (Monarch's Channel.open): no targets; any number of results from anyone holding its
  // id, each kept with the index its sender gave (a rank, or -1); a once port takes one.
  struct PortTag {};
  Call(uint64_t id, PortTag, bool once);
  ~Call();
  bool is_port() const { return port_; }
  uint64_t id() const { return id_; }
  size_t size() const { return addrs_.size(); }
  const std::string& target_addr(size_t i) const { return addrs_.at(i); }  // out_of_range: IndexError
  // Names target i's address once known (Node::retarget); before the call is handed to
  // anything that reads target_addr (which reads without the lock).
  void set_target_addr(size_t i, const std::string& addr);

  // Returns false if that target had already answered (late duplicates are dropped).
  bool deliver(CallResult r);
  // The call went through a cast tree (runtime/cast/): each target's parent (its relay, an index
  // of this call; -1: sent by the origin itself) and order number. Before the call is shared.
  void set_tree(std::vector<int32_t> parents, std::vector<uint64_t> oseqs);
  // Fails every target at this address that has not answered, and those behind it in a cast
  // tree (their answers were to come through it); returns how many. *behind gets (address,
  // order number) of each target failed because its relay died.
  size_t fail_addr(const std::string& addr, const json& error,
                   std::vector<std::pair<std::string, uint64_t>>* behind = nullptr);
  size_t fail_all(const json& error);
  // The caller cancelled: every target that has not answered is failed with error now (its
  // waiters return), but counts as still running until its own answer comes (an endpoint in a
  // C call runs on until that call returns): running() lists it, and the node keeps the call
  // until then. A proc that dies ends it too. Returns how many were failed.
  size_t cancel_all(const json& error);

  bool done() const;
  size_t received() const;
  // True once a target failed through supervision because its proc or host died: waiting for
  // the other targets would only delay the error, so waits end early. An actor's failure (its
  // tombstone, info.report) is not: the other targets' answers are awaited as for any error.
  bool fatal() const;
  // Waits until every target answered or the call is fatal, up to timeout_ms (-1: forever).
  bool wait_done(int timeout_ms);
  // The one wait behind every Future and stream: until the call is done or fatal (any=false)
  // or a result not yet taken exists (any=true), or wake() is called (Woken: the waiter has
  // something else to do, such as showing output or a debugger stop), up to timeout_ms (-1:
  // forever). A wake() that came before the wait makes it return Woken at once.
  WaitOutcome wait_for(bool any, int timeout_ms);
  void wake();
  // The node's rings deliver its replies: a waiter reads them itself (wait_feed.hpp). Before waits.
  void fed_by(std::shared_ptr<WaitFeed> feed) { feed_ = std::move(feed); }
  // Moves out the results that arrived since the last take, in arrival order.
  std::vector<CallResult> take();
  // The targets that have not answered yet, by index (what the panel shows as "in a call").
  std::vector<int64_t> missing() const;
  // The targets cancelled by cancel_all() whose own answer has not come: still running there.
  std::vector<int64_t> lingering() const;
  // missing() and lingering() together: the targets whose actor is still busy with this call.
  std::vector<int64_t> running() const;
  // Done, and nothing cancelled still runs: the node may forget it.
  bool settled() const;
  // eventfd that becomes readable with each arrival (for asyncio's add_reader).
  int fd();

 private:
  size_t fail_where(const std::string* addr, const json& error);  // nullptr: every target
  size_t fail_index(size_t i, const json& error);
  void end_lingering(size_t i);  // mu_ held
  // The ancestor of target i (a relay) at addr, or -1.
  int32_t relay_at(size_t i, const std::string& addr) const;
  std::vector<int32_t> parents_;  // cast trees: target -> its relay (empty: every target direct)
  std::vector<uint64_t> oseqs_;
  bool complete() const;  // every target answered (a once port: its one result came); mu_ held
  WaitOutcome wait_fed(bool any, int timeout_ms, std::unique_lock<std::mutex>& g);
  // After a change that ends waits: the condition variable, and a waiter asleep on the feed.
  void notify_waiters(bool fed_sleepers);
  uint64_t id_;
  std::vector<std::string> addrs_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> have_;
  std::vector<bool> lingering_;  // cancelled targets still running (empty until cancel_all)
  size_t lingering_count_ = 0;
  size_t received_ = 0;
  bool fatal_ = false;
  bool woken_ = false;
  std::atomic<uint32_t> changes_{0};  // bumped with every notify: a spinning waiter looks at it
  int any_waiters_ = 0;
  std::shared_ptr<WaitFeed> feed_;
  int feed_sleepers_ = 0;  // under mu_: waiters asleep on the feed  // threads in wait_for(any): only they need a wake-up per arrival
  std::deque<CallResult> untaken_;
  EventFd efd_{/*drained_outside=*/true};  // readable when results came, made on first use (under mu_)
  bool port_ = false;
  bool once_ = false;
};

}  // namespace xmesh
