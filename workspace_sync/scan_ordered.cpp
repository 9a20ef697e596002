// The whole scan of a tree, written in the manifest's order as it goes (scan.hpp: scan_tree_to).
// One thread walks depth first in byte order and writes; a pool lists the directories the walk
// will need next and hashes files, always taking the task whose result the walk needs soonest
// (tasks are keyed by the path at which the walk takes their result).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "scan_internal.hpp"
#include "util.hpp"

namespace xmesh::ws {

namespace {

using detail::Listing;

// Worker threads running tasks in the order of their keys (smallest first).
class KeyedPool {
 public:
  explicit KeyedPool(unsigned threads) {
    for (unsigned i = 0; i < threads; ++i) threads_.push_back(runtime_thread([this] { work(); }));
  }
  ~KeyedPool() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
      queue_.clear();  // what nobody waits for any more (the walk failed)
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  KeyedPool(const KeyedPool&) = delete;
  KeyedPool& operator=(const KeyedPool&) = delete;

  template <typename T>
  std::shared_future<T> submit(std::string key, std::function<T()> fn) {
    auto task = std::make_shared<std::packaged_task<T()>>(std::move(fn));
    std::shared_future<T> out = task->get_future().share();
    {
      std::lock_guard<std::mutex> g(mu_);
      queue_.emplace(std::move(key), [task] { (*task)(); });
    }
    cv_.notify_one();
    return out;
  }

 private:
  void work() {
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        fn = std::move(queue_.begin()->second);
        queue_.erase(queue_.begin());
      }
      fn();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<std::string, std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

// The previous manifest read in step with the walk: find(path) for rising paths. An entry that
// does not read ends it (hashes are then taken afresh: a damaged cache costs time, not truth).
class PreviousInStep {
 public:
  explicit PreviousInStep(const MappedManifest* m) {
    if (!m) return;
    scan_ns_ = m->scan_ns();
    try {
      cursor_.emplace(std::shared_ptr<const MappedManifest>(std::shared_ptr<const MappedManifest>(), m));
    } catch (const std::runtime_error&) {
      cursor_.reset();
    }
  }
  int64_t scan_ns() const { return scan_ns_; }
  const Entry* find(const std::string& path) {
    try {
      while (cursor_ && !cursor_->at_end() && cursor_->entry().path < path) cursor_->next();
    } catch (const std::runtime_error&) {
      cursor_.reset();
    }
    if (!cursor_ || cursor_->at_end() || cursor_->entry().path != path) return nullptr;
    return &cursor_->entry();
  }

 private:
  std::optional<ManifestCursor> cursor_;
  int64_t scan_ns_ = 0;
};

constexpr size_t kListAhead = 16;       // directories listed ahead of the walk, at most
constexpr size_t kHashWindow = 4096;    // entries waiting for the files before them to be hashed
constexpr uint64_t kWindowBytes = 256u << 20;  // and the bytes of those files, at most

class OrderedWalk {
 public:
  OrderedWalk(const ScanOptions& opts, const MappedManifest* previous, detail::ScanWriter& out, ScanResult& r)
      : opts_(opts), fixed_(opts), previous_(previous), out_(out), r_(r),
        pool_(std::max(2u, std::min(4u, std::thread::hardware_concurrency()))) {}

  void run(int rootfd) {
    walk(detail::list_directory(rootfd, "", opts_, fixed_, std::make_shared<IgnoreRules>()));
    while (!pending_.empty()) write_front();
  }

 private:
  using ListingFuture = std::shared_future<std::shared_ptr<Listing>>;

  struct Pending {
    Entry e;
    std::optional<std::shared_future<Entry>> hashed;  // set: the entry is what the hash gives
  };

  void walk(const std::shared_ptr<Listing>& dir) {
    take_notes(*dir);
    detail::ListingReader rd(*dir);
    std::deque<std::optional<ListingFuture>> ahead;  // ahead[k]: the listing of rd.peek(k), once asked for
    auto slot = [&ahead](size_t k) -> std::optional<ListingFuture>& {
      if (ahead.size() <= k) ahead.resize(k + 1);
      return ahead[k];
    };
    size_t next_submit = 0;  // the items before it (from the current one) were looked at to list ahead
    while (const Listing::Item* cur = rd.peek(0)) {
      for (const Listing::Item* it; lists_ahead_ < kListAhead && (it = rd.peek(next_submit)) != nullptr; ++next_submit)
        if (it->subtree) slot(next_submit) = submit_listing(dir, it->e.path);
      if (cur->subtree) {
        std::optional<ListingFuture>& mine = slot(0);
        if (!mine) mine = submit_listing(dir, cur->e.path);
        std::shared_ptr<Listing> sub = mine->get();
        --lists_ahead_;
        mine.reset();
        walk(sub);
      } else {
        emit(*dir, cur->e);
      }
      rd.pop();
      if (!ahead.empty()) ahead.pop_front();
      if (next_submit > 0) --next_submit;
    }
  }

  // The listing of subdirectory `key` ("name/") of dir, on the pool.
  ListingFuture submit_listing(const std::shared_ptr<Listing>& dir, const std::string& key) {
    std::string name = key.substr(0, key.size() - 1);
    ++lists_ahead_;
    const ScanOptions& opts = opts_;
    const detail::FixedRules& fixed = fixed_;
    return pool_.submit<std::shared_ptr<Listing>>(
        detail::join_path(dir->rel, key),
        [dir, name, &opts, &fixed] { return detail::list_subdirectory(*dir, name, opts, fixed); });
  }

  void take_notes(const Listing& l) {
    r_.skipped.insert(r_.skipped.end(), l.skipped.begin(), l.skipped.end());
    r_.too_large.insert(r_.too_large.end(), l.too_large.begin(), l.too_large.end());
  }

  // One entry in order: files hashed (or their hash reused) before it is written.
  void emit(const Listing& dir, const Entry& item) {
    Pending p;
    p.e = item;
    p.e.path = detail::join_path(dir.rel, item.path);
    if (p.e.type == EntryType::File) {
      const Entry* old = previous_.find(p.e.path);
      if (old && detail::hash_still_valid(*old, p.e, previous_.scan_ns())) {
        p.e.hash = old->hash;
        ++r_.reused;
      } else {
        p.hashed = submit_hash(dir, item.path, p.e);
        window_bytes_ += p.e.size;
      }
    }
    pending_.push_back(std::move(p));
    while (!pending_.empty() && (!pending_.front().hashed || is_ready(*pending_.front().hashed))) write_front();
    while (pending_.size() > kHashWindow || window_bytes_ > kWindowBytes) write_front();
  }

  std::shared_future<Entry> submit_hash(const Listing& dir, const std::string& name, const Entry& e) {
    std::shared_ptr<unique_fd> dirfd = dir.dir;  // open until the hash is taken
    return pool_.submit<Entry>(e.path, [dirfd, name, e] {
      Entry out = e;
      out.hash = hash_file(dirfd->get(), name, out.path, &out.size, &out.mtime_ns, &out.ctime_ns, &out.ino);
      return out;
    });
  }

  static bool is_ready(const std::shared_future<Entry>& f) {
    return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

  void write_front() {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    if (p.hashed) {
      window_bytes_ -= p.e.size;
      try {
        p.e = p.hashed->get();
      } catch (const std::system_error& ex) {
        if (ex.code().value() == ENOENT) return;  // deleted while we looked: not part of this state
        throw;
      }
      ++r_.hashed_files;
      r_.hashed_bytes += p.e.size;
    }
    out_.add(p.e);
  }

  const ScanOptions& opts_;
  detail::FixedRules fixed_;
  PreviousInStep previous_;
  detail::ScanWriter& out_;
  ScanResult& r_;
  std::deque<Pending> pending_;
  uint64_t window_bytes_ = 0;
  size_t lists_ahead_ = 0;
  KeyedPool pool_;  // last: its threads stop before what their tasks use goes
};

}  // namespace

ScanResult scan_tree_to(const std::string& root, const ScanOptions& opts, const MappedManifest* previous,
                        const std::string& out_path) {
  const int64_t started = wall_ns();
  int fd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open workspace " + root + ": " + std::strerror(errno));
  ScanResult r;
  detail::ScanWriter out(out_path, started);
  {
    OrderedWalk walk(opts, previous, out, r);
    walk.run(fd);  // the root's listing takes fd over
  }
  std::sort(r.skipped.begin(), r.skipped.end());
  std::sort(r.too_large.begin(), r.too_large.end());
  out.finish(r);
  return r;
}

}  // namespace xmesh::ws
