// TreeWatcher: inotify on every directory of a workspace tree (new directories are added as they
// appear), for `sync_workspace(watch=True)`, `xmesh sync --watch`, the receiver's trust in its
// manifest, and the controller's incremental rescans (it says which directories changed).
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "unique_fd.hpp"
#include "scan.hpp"

namespace xmesh::ws {

class TreeWatcher {
 public:
  // Throws std::runtime_error naming the problem (no inotify, the watch limit reached).
  explicit TreeWatcher(const std::string& root);
  // Watches root and exactly these directories (relative to it: the ones a scan kept, so that
  // ignored trees cost no watches); directories created later are watched whole.
  TreeWatcher(const std::string& root, const std::vector<std::string>& dirs);
  // Adds the directories among these that are not watched yet (a scan found them after the
  // watch was set up) and reports them as `walked` changes, since they went unwatched a while.
  void watch_new(const std::vector<std::string>& dirs);
  ~TreeWatcher();
  TreeWatcher(const TreeWatcher&) = delete;
  TreeWatcher& operator=(const TreeWatcher&) = delete;
  // Waits up to timeout_ms for a change under the root; after the first event keeps reading
  // until quiet_ms pass without another (one save in an editor is several events). True when
  // something changed.
  bool wait(int timeout_ms, int quiet_ms);
  // What changed since the last call (reading what is queued, without waiting): directories
  // whose entries changed, trees that appeared or whose ignore files changed, or everything
  // (the event queue overflowed, the root itself moved). Paths are relative to the root.
  ChangedDirs take_changes();
  size_t watched_dirs() const { return dirs_.size(); }
  // Every watched directory is on a local file system (ext4, xfs, btrfs, tmpfs...), where
  // inotify sees every change made through the file system; on NFS and the like it sees only
  // this machine's.
  bool local_only() const { return local_only_; }

 private:
  void add_tree(const std::string& path);
  int add_dir(const std::string& path);  // the watch descriptor, or -1 when the directory is gone
  bool drain(int timeout_ms);
  std::string relative(const std::string& path) const;
  unique_fd fd_;
  std::string root_;
  std::unordered_map<int, std::string> dirs_;  // watch descriptor -> directory
  ChangedDirs pending_;
  bool local_only_ = true;
};

}  // namespace xmesh::ws
