#include "watch.hpp"

#include <dirent.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <set>
#include <vector>

#include "path_safety.hpp"

namespace xmesh::ws {

namespace {
// Not changes of the tree: xmesh's own state, and the bytecode Python writes next to sources
// (procs importing synced modules would otherwise make every host copy look edited).
bool unwatched(const char* name) { return !std::strcmp(name, kStateDirName) || !std::strcmp(name, "__pycache__"); }

constexpr uint32_t kMask = IN_CREATE | IN_DELETE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO |
                           IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR;

bool is_ignore_file(const char* name) { return !std::strcmp(name, ".gitignore") || !std::strcmp(name, ".xmeshignore"); }

// File systems whose every change reaches inotify (not network or FUSE ones, where another
// machine's writes go unseen).
bool local_file_system(const std::string& path) {
  struct statfs fs;
  if (statfs(path.c_str(), &fs) != 0) return false;
  switch (static_cast<uint64_t>(fs.f_type)) {
    case 0xEF53:      // ext2/3/4
    case 0x58465342:  // xfs
    case 0x9123683E:  // btrfs
    case 0x01021994:  // tmpfs
    case 0x794C7630:  // overlayfs
    case 0x2FC12FC1:  // zfs
    case 0xF2F52010:  // f2fs
      return true;
    default:
      return false;
  }
}
}

TreeWatcher::TreeWatcher(const std::string& root) : root_(root) {
  fd_.reset(inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!fd_) throw std::runtime_error(std::string("cannot watch the workspace: inotify: ") + std::strerror(errno));
  try {
    add_tree(root);
  } catch (...) {
    fd_.reset();
    throw;
  }
}

TreeWatcher::~TreeWatcher() = default;

TreeWatcher::TreeWatcher(const std::string& root, const std::vector<std::string>& dirs) : root_(root) {
  fd_.reset(inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!fd_) throw std::runtime_error(std::string("cannot watch the workspace: inotify: ") + std::strerror(errno));
  try {
    add_dir(root);
    for (auto& d : dirs) add_dir(root + "/" + d);
  } catch (...) {
    fd_.reset();
    throw;
  }
}

int TreeWatcher::add_dir(const std::string& path) {
  // Below the root, a directory replaced by a symlink is not followed out of the tree.
  int wd = inotify_add_watch(fd_.get(), path.c_str(), path == root_ ? kMask : kMask | IN_DONT_FOLLOW);
  if (wd < 0) {
    if (errno == ENOSPC)
      throw std::runtime_error("cannot watch " + path + ": the inotify watch limit is reached (raise "
                               "fs.inotify.max_user_watches, or exclude large directories)");
    if (errno == ENOENT || errno == ENOTDIR) return -1;  // gone meanwhile
    throw std::runtime_error("cannot watch " + path + ": " + std::strerror(errno));
  }
  dirs_[wd] = path;
  if (local_only_ && !local_file_system(path)) local_only_ = false;
  return wd;
}

void TreeWatcher::add_tree(const std::string& path) {
  if (add_dir(path) < 0) return;
  DIR* d = opendir(path.c_str());
  if (!d) return;
  std::vector<std::string> subdirs;
  while (dirent* de = readdir(d)) {
    if (!std::strcmp(de->d_name, ".") || !std::strcmp(de->d_name, "..") || unwatched(de->d_name)) continue;
    std::string p = path + "/" + de->d_name;
    struct stat st;
    if (de->d_type == DT_DIR || (de->d_type == DT_UNKNOWN && lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)))
      subdirs.push_back(p);
  }
  closedir(d);
  for (auto& s : subdirs) add_tree(s);
}

void TreeWatcher::watch_new(const std::vector<std::string>& dirs) {
  std::set<std::string> watched;
  for (auto& kv : dirs_) watched.insert(kv.second);
  for (auto& d : dirs) {
    std::string path = root_ + "/" + d;
    if (watched.count(path)) continue;
    add_dir(path);
    pending_.walked.insert(d);  // it went unwatched for a while: walk it at the next rescan
  }
}

std::string TreeWatcher::relative(const std::string& path) const {
  if (path.size() <= root_.size()) return "";
  return path.substr(root_.size() + 1);
}

// Reads what is queued (waiting up to timeout_ms for the first event), noting the directories
// it concerns in pending_. True if any arrived.
bool TreeWatcher::drain(int timeout_ms) {
  pollfd p{fd_.get(), POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return false;
  alignas(inotify_event) char buf[16384];
  bool any = false;
  while (true) {
    ssize_t n = read(fd_.get(), buf, sizeof(buf));
    if (n <= 0) break;
    for (char* at = buf; at < buf + n;) {
      auto* ev = reinterpret_cast<inotify_event*>(at);
      at += sizeof(inotify_event) + ev->len;
      if (ev->mask & IN_Q_OVERFLOW) {
        any = pending_.everything = true;
        continue;
      }
      auto it = dirs_.find(ev->wd);
      if (ev->mask & IN_IGNORED) {
        dirs_.erase(ev->wd);
        continue;
      }
      if (ev->len && unwatched(ev->name)) continue;
      any = true;
      if (it == dirs_.end()) continue;
      std::string dir = relative(it->second);
      if ((ev->mask & IN_MOVE_SELF) && it->second == root_) pending_.everything = true;
      if (!ev->len) continue;  // about the watched directory itself: its parent hears it too
      std::string child = dir.empty() ? std::string(ev->name) : dir + "/" + ev->name;
      if ((ev->mask & (IN_CREATE | IN_MOVED_TO)) && (ev->mask & IN_ISDIR)) {
        try {
          add_tree(it->second + "/" + ev->name);
        } catch (const std::exception&) {
          pending_.everything = true;  // part of the tree goes unwatched (the watch limit): look at all
        }
        pending_.walked.insert(child);
      }
      if (is_ignore_file(ev->name))
        pending_.walked.insert(dir);  // the rules of the whole subtree may differ now
      else
        pending_.listed.insert(dir);
    }
  }
  return any;
}

ChangedDirs TreeWatcher::take_changes() {
  drain(0);
  ChangedDirs out = std::move(pending_);
  pending_ = ChangedDirs{};
  return out;
}

bool TreeWatcher::wait(int timeout_ms, int quiet_ms) {
  pending_ = ChangedDirs{};  // a waiter wants to know whether, not where
  if (!drain(timeout_ms)) return false;
  while (drain(quiet_ms)) {
  }
  return true;
}

}  // namespace xmesh::ws
