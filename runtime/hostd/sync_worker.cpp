#include "sync_worker.hpp"

#include <pthread.h>

#include "util.hpp"

namespace xmesh {

namespace {
constexpr int kExpireEveryMs = 1000;  // how often idle sessions are looked for
}

SyncWorker::SyncWorker(std::unique_ptr<ws::SyncReceiver> receiver) : receiver_(std::move(receiver)) {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "xmesh-sync");
    run();
  });
}

void SyncWorker::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    tasks_.clear();
  }
  receiver_->cancel();
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SyncWorker::post(Task task) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!stop_) {
      tasks_.push_back(std::move(task));
      cv_.notify_one();
      return;
    }
  }
  try {
    task(*receiver_);
  } catch (const std::exception& e) {
    log_diag("hostd", std::string("a workspace sync task failed: ") + e.what());
  }
}

void SyncWorker::run() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    if (tasks_.empty()) {
      lk.unlock();
      receiver_->expire_idle(now_ms());  // only with nothing queued (see the header)
      lk.lock();
      cv_.wait_for(lk, std::chrono::milliseconds(kExpireEveryMs), [this] { return stop_ || !tasks_.empty(); });
      continue;
    }
    Task task = std::move(tasks_.front());
    tasks_.pop_front();
    lk.unlock();
    try {
      task(*receiver_);
    } catch (const std::exception& e) {  // tasks answer their own errors; this is a last resort
      log_diag("hostd", std::string("a workspace sync task failed: ") + e.what());
    }
    lk.lock();
  }
}

}  // namespace xmesh
