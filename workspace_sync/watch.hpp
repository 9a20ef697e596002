// TreeWatcher: inotify on every directory of a workspace tree (new directories are added as they
// appear), for `sync_workspace(watch=True)` and `xmesh sync --watch`.
#pragma once
#include <string>
#include <unordered_map>

namespace xmesh::ws {

class TreeWatcher {
 public:
  // Throws std::runtime_error naming the problem (no inotify, the watch limit reached).
  explicit TreeWatcher(const std::string& root);
  ~TreeWatcher();
  TreeWatcher(const TreeWatcher&) = delete;
  TreeWatcher& operator=(const TreeWatcher&) = delete;
  // Waits up to timeout_ms for a change under the root; after the first event keeps reading
  // until quiet_ms pass without another (one save in an editor is several events). True when
  // something changed.
  bool wait(int timeout_ms, int quiet_ms);
  size_t watched_dirs() const { return dirs_.size(); }

 private:
  void add_tree(const std::string& path);
  bool drain(int timeout_ms);
  int fd_ = -1;
  std::unordered_map<int, std::string> dirs_;  // watch descriptor -> directory
};

}  // namespace xmesh::ws
