// SyncWorker: the host agent's workspace syncs, on a thread of their own. A plan or commit of a
// million files takes the receiver minutes; on the agent's main loop that held every proc's
// output, every spawn and stop, and every status request for as long. Here the main loop only
// hands each step over; the steps run one at a time, in the order they came (SyncReceiver is
// single-threaded and owned by this thread), and answer through the node (sends are
// thread-safe). Sessions left idle are expired here too, only when no step waits: a step queued
// behind a long commit must not find its session expired for the wait.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "receiver.hpp"

namespace xmesh {

class SyncWorker {
 public:
  using Task = std::function<void(ws::SyncReceiver&)>;
  explicit SyncWorker(std::unique_ptr<ws::SyncReceiver> receiver);
  ~SyncWorker() { stop(); }
  SyncWorker(const SyncWorker&) = delete;
  SyncWorker& operator=(const SyncWorker&) = delete;

  // post() and stop() are the agent's main loop's (never called concurrently).
  // Runs task on the thread, after those before it. Once stopped, at once on the caller's thread
  // (the receiver is no other thread's then): what an exiting agent removes still goes.
  void post(Task task);
  // Cuts a step under way short (SyncReceiver::cancel: a commit leaves each file old or new, which
  // the next sync completes), drops the steps queued (their sessions with the receiver), and
  // joins the thread.
  void stop();
  uint64_t bytes_received() const { return receiver_->bytes_received(); }
  const std::string& root() const { return receiver_->root(); }

 private:
  void run();
  std::unique_ptr<ws::SyncReceiver> receiver_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stop_ = false;
  std::thread thread_;  // joined by stop()
};

}  // namespace xmesh
