// Scans a local workspace tree into a Manifest. Change detection never misses an edit: a file's
// previous hash is reused only when its size, mtime (ns), ctime and inode are unchanged AND its
// mtime is more than a second older than the previous scan (git's racy-file rule: an edit in
// the same timestamp tick as the previous look, keeping the size, is caught by re-hashing).
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "ignore.hpp"
#include "manifest.hpp"

namespace xmesh::ws {

// What a workspace never needs on the hosts, excluded unless the user's exclude= says
// otherwise ("!.git/"): compiled Python, notebook checkpoints, version control, environments
// and tools' caches.
inline constexpr const char* kDefaultExcludes[] = {
    "__pycache__/", "*.py[co]",     ".ipynb_checkpoints/", ".git/",         ".hg/",      ".svn/",
    ".venv/",       "node_modules/", ".mypy_cache/",       ".pytest_cache/", ".ruff_cache/", ".tox/",
    "*.egg-info/",  ".DS_Store"};

struct ScanOptions {
  std::vector<std::string> excludes;  // gitignore syntax, relative to the root
  bool use_ignore_files = true;       // .gitignore and .xmeshignore
  bool default_excludes = true;       // kDefaultExcludes
  uint64_t max_file_size = 0;         // 0: no limit; larger files are listed in too_large

  bool operator==(const ScanOptions& o) const {
    return excludes == o.excludes && use_ignore_files == o.use_ignore_files &&
           default_excludes == o.default_excludes && max_file_size == o.max_file_size;
  }
};

struct ScanResult {
  Manifest manifest;
  std::vector<std::pair<std::string, std::string>> skipped;  // path, why (special files, symlinks out)
  std::vector<std::pair<std::string, uint64_t>> too_large;   // path, size
  uint64_t hashed_files = 0, hashed_bytes = 0, reused = 0;
  bool incremental = false;  // only the directories a watch saw change were looked at
  uint64_t watched_dirs = 0;  // directories under the controller's watch after the scan
};

// Throws std::runtime_error naming the root when it is not a readable directory.
ScanResult scan_tree(const std::string& root, const ScanOptions& opts, const Manifest* previous);

// Where a tree changed since a scan (relative directory paths, "" = the root).
struct ChangedDirs {
  std::set<std::string> listed;  // entries added, removed or changed directly in these
  std::set<std::string> walked;  // these whole subtrees (new directories, changed ignore files)
  bool everything = false;
  bool empty() const { return listed.empty() && walked.empty() && !everything; }
};

// A scan that revisits only what changed: `previous` is the manifest of an earlier scan of
// root with the same options and `notes` that scan's skipped and too_large lists (its manifest
// is not read), taken while a watch reported `changes` since; started_ns is the wall clock read
// before those changes were taken (the racy rule counts from it). The `listed` directories are
// listed again (their files re-hashed under the usual rule), the `walked` ones and any
// directory new since `previous` walked whole; all else is taken from previous. Entries left
// without their parent directory are dropped.
ScanResult rescan_tree(const std::string& root, const ScanOptions& opts, const Manifest& previous,
                       const ScanResult& notes, const ChangedDirs& changes, int64_t started_ns);

int64_t wall_ns();

}  // namespace xmesh::ws
