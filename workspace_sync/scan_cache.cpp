#include "scan_cache.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <vector>
#include <mutex>

#include "fs_ops.hpp"
#include "manifest_file.hpp"
#include "watch.hpp"

namespace xmesh::ws {

namespace {

struct TreeState {
  std::mutex mu;  // one scan of a tree at a time
  ScanResult last;  // the last scan: its manifest file (mapped), lists and counts; no file: none yet
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

// The directories of a manifest (what the watch covers); none when it does not read.
std::vector<std::string> directories(const std::shared_ptr<const MappedManifest>& m) {
  std::vector<std::string> out;
  if (!m) return out;
  try {
    for (ManifestCursor c(m); !c.at_end(); c.next())
      if (c.entry().type == EntryType::Dir) out.push_back(c.entry().path);
  } catch (const std::runtime_error&) {
    out.clear();
  }
  return out;
}

// The whole scan under a new watch: watch first, then look, so a change made while we look is
// an event for the next scan. The watch covers the directories the previous scan kept (ignored
// trees cost no watches); the ones this scan finds beyond them are added after it, to be walked
// at the next rescan.
ScanResult scan_whole(TreeState& state, const std::string& root, const std::string& cache_path,
                      const ScanOptions& opts, bool incremental, const std::shared_ptr<const MappedManifest>& previous) {
  state.watcher.reset();
  std::unique_ptr<TreeWatcher> watcher;
  // The watch ignores __pycache__ (Python's own writes); a scan that includes it cannot use it.
  if (incremental && opts.default_excludes) {
    try {
      watcher = std::make_unique<TreeWatcher>(root, directories(previous));
    } catch (const std::exception&) {
      // no inotify or its limit reached: every scan is whole
    }
  }
  ScanResult r = scan_tree_to(root, opts, previous.get(), cache_path);
  if (watcher) {
    try {
      watcher->watch_new(directories(r.file));
      if (!watcher->local_only()) watcher.reset();
    } catch (const std::exception&) {
      watcher.reset();
    }
  }
  state.watcher = std::move(watcher);
  return r;
}

}  // namespace

ScanResult scan_cached(const std::string& root, const std::string& cache_path, const ScanOptions& opts,
                       bool incremental) {
  if (cache_path.empty()) return scan_tree_to(root, opts, nullptr, "");
  std::shared_ptr<TreeState> state = state_of(cache_path);
  if (auto evicted = touch(state)) {
    std::lock_guard<std::mutex> g(evicted->mu);
    evicted->watcher.reset();  // its next scan is whole, and sets up a new watch
  }
  std::lock_guard<std::mutex> g(state->mu);
  std::shared_ptr<const MappedManifest> previous = state->last.file;
  if (!previous) previous = MappedManifest::open(cache_path);  // another process's scan
  dev_t dev = 0;
  ino_t ino = 0;
  bool same_root = identity(root, &dev, &ino) && dev == state->dev && ino == state->ino && root == state->root;
  int64_t started = wall_ns();  // before the changes are taken: the racy rule counts from here
  ScanResult r;
  bool scanned = false;
  if (incremental && state->watcher && state->last.file && same_root && state->opts == opts) {
    ChangedDirs changes = state->watcher->take_changes();
    if (changes.empty()) {  // nothing changed: the manifest is the previous one itself
      ScanResult same = state->last;
      same.hashed_files = same.hashed_bytes = 0;
      same.reused = same.files;
      same.incremental = true;
      same.watched_dirs = state->watcher->watched_dirs();
      return same;
    }
    if (changes.everything) {
      state->watcher.reset();  // below: a new watch, then the whole scan
    } else {
      try {
        // (a change of the root's ignore files makes this a whole scan, under the same watch)
        r = rescan_tree(root, opts, *state->last.file, state->last, changes, started, cache_path);
        scanned = true;
      } catch (...) {
        state->watcher.reset();  // the changes taken are lost with this scan: the next is whole
        throw;
      }
    }
  }
  if (!scanned) r = scan_whole(*state, root, cache_path, opts, incremental, previous);
  r.watched_dirs = state->watcher ? state->watcher->watched_dirs() : 0;
  state->last = r;
  state->opts = opts;
  state->root = root;
  state->dev = dev;
  state->ino = ino;
  return r;
}

}  // namespace xmesh::ws
