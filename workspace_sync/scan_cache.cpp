#include "scan_cache.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <vector>
#include <mutex>

#include "fs_ops.hpp"
#include "watch.hpp"

namespace xmesh::ws {

namespace {

struct TreeState {
  std::mutex mu;  // one scan of a tree at a time
  std::shared_ptr<const Manifest> manifest;
  ScanResult notes;  // that scan's skipped and too_large lists
  ScanOptions opts;
  std::string root;
  dev_t dev = 0;
  ino_t ino = 0;
  std::unique_ptr<TreeWatcher> watcher;  // up since before that scan began; null: scan whole
};

// inotify instances are few per user (128 by default) and shared with the user's other
// programs: only the trees synced most recently keep their watch.
constexpr size_t kWatchedTrees = 8;

std::mutex g_mu;
std::map<std::string, std::shared_ptr<TreeState>> g_trees;
std::vector<std::shared_ptr<TreeState>> g_recent;  // most recently scanned first

std::shared_ptr<TreeState> state_of(const std::string& cache_path) {
  std::lock_guard<std::mutex> g(g_mu);
  auto& s = g_trees[cache_path];
  if (!s) s = std::make_shared<TreeState>();
  return s;
}

// Marks s as just scanned; returns the tree that falls out of the watched few, if any.
std::shared_ptr<TreeState> touch(const std::shared_ptr<TreeState>& s) {
  std::lock_guard<std::mutex> g(g_mu);
  g_recent.erase(std::remove(g_recent.begin(), g_recent.end(), s), g_recent.end());
  g_recent.insert(g_recent.begin(), s);
  if (g_recent.size() <= kWatchedTrees) return nullptr;
  auto out = g_recent.back();
  g_recent.pop_back();
  return out;
}

bool identity(const std::string& root, dev_t* dev, ino_t* ino) {
  struct stat st;
  if (stat(root.c_str(), &st) != 0) return false;
  *dev = st.st_dev;
  *ino = st.st_ino;
  return true;
}

std::vector<std::string> directories(const Manifest& m) {
  std::vector<std::string> out;
  for (auto& e : m.entries)
    if (e.type == EntryType::Dir) out.push_back(e.path);
  return out;
}

}  // namespace

std::shared_ptr<const Manifest> scan_cached(const std::string& root, const std::string& cache_path,
                                            const ScanOptions& opts, bool incremental, ScanResult& figures) {
  if (cache_path.empty()) {
    figures = scan_tree(root, opts, nullptr);
    auto m = std::make_shared<const Manifest>(std::move(figures.manifest));
    figures.manifest = Manifest{};
    return m;
  }
  std::shared_ptr<TreeState> state = state_of(cache_path);
  if (auto evicted = touch(state)) {
    std::lock_guard<std::mutex> g(evicted->mu);
    evicted->watcher.reset();  // its next scan is whole, and sets up a new watch
  }
  std::lock_guard<std::mutex> g(state->mu);
  std::shared_ptr<const Manifest> previous = state->manifest;
  if (!previous) {
    std::string bytes;
    auto m = std::make_shared<Manifest>();
    if (read_whole_file(cache_path, bytes) && Manifest::decode_cache(bytes, *m)) previous = m;
  }
  dev_t dev = 0;
  ino_t ino = 0;
  bool same_root = identity(root, &dev, &ino) && dev == state->dev && ino == state->ino && root == state->root;
  int64_t started = wall_ns();  // before the changes are taken: the racy rule counts from here
  bool scanned = false;
  if (incremental && state->watcher && state->manifest && same_root && state->opts == opts) {
    ChangedDirs changes = state->watcher->take_changes();
    if (changes.empty()) {  // nothing changed: the manifest is the previous one itself, not a copy
      ScanResult same;
      same.skipped = state->notes.skipped;
      same.too_large = state->notes.too_large;
      for (auto& e : state->manifest->entries) same.reused += e.type == EntryType::File;
      same.incremental = true;
      same.watched_dirs = state->watcher->watched_dirs();
      figures = std::move(same);
      return state->manifest;
    }
    if (changes.everything) {
      state->watcher.reset();  // below: a new watch, then the whole scan
    } else {
      try {
        // (a change of the root's ignore files makes this a whole scan, under the same watch)
        figures = rescan_tree(root, opts, *state->manifest, state->notes, changes, started);
        scanned = true;
      } catch (...) {
        state->watcher.reset();  // the changes taken are lost with this scan: the next is whole
        throw;
      }
    }
  }
  if (!scanned) {
    // Watch first, then look: a change made while we look is an event for the next scan. The
    // watch covers the directories the previous scan kept (ignored trees cost no watches); the
    // ones this scan finds beyond them are added after it, to be walked at the next rescan.
    state->watcher.reset();
    std::unique_ptr<TreeWatcher> watcher;
    // The watch ignores __pycache__ (Python's own writes); a scan that includes it cannot use it.
    if (incremental && opts.default_excludes) {
      try {
        watcher = std::make_unique<TreeWatcher>(root, previous ? directories(*previous) : std::vector<std::string>{});
      } catch (const std::exception&) {
        // no inotify or its limit reached: every scan is whole
      }
    }
    figures = scan_tree(root, opts, previous.get());
    if (watcher) {
      try {
        watcher->watch_new(directories(figures.manifest));
        if (!watcher->local_only()) watcher.reset();
      } catch (const std::exception&) {
        watcher.reset();
      }
    }
    state->watcher = std::move(watcher);
  }
  figures.watched_dirs = state->watcher ? state->watcher->watched_dirs() : 0;
  auto current = std::make_shared<const Manifest>(std::move(figures.manifest));
  figures.manifest = Manifest{};
  bool changed = figures.hashed_files > 0 || !previous || previous->entries.size() != current->entries.size();
  state->manifest = current;
  state->notes = figures;
  state->opts = opts;
  state->root = root;
  state->dev = dev;
  state->ino = ino;
  // The file serves the next process; rewrite it only when it would say something new.
  if (changed) {
    try {
      save_manifest_cache(cache_path, *current);
    } catch (const std::exception&) {
      // Only a cache: the next process re-hashes.
    }
  }
  return current;
}

}  // namespace xmesh::ws
