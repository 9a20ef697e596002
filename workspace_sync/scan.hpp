// Scans a local workspace tree into a Manifest. Change detection never misses an edit: a file's
// previous hash is reused only when its size, mtime (ns), ctime and inode are unchanged AND its
// mtime is more than a second older than the previous scan (git's racy-file rule: an edit in
// the same timestamp tick as the previous look, keeping the size, is caught by re-hashing).
#pragma once
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ignore.hpp"
#include "manifest.hpp"
#include "manifest_file.hpp"

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
  Manifest manifest;  // scan_tree only (in memory); a scan to a file leaves it empty
  std::shared_ptr<const MappedManifest> file;  // scans to a file: the manifest written, mapped
  Hash128 digest;                              // of the manifest (Manifest::digest())
  uint64_t entries = 0, files = 0, dirs = 0, symlinks = 0, bytes = 0;
  std::vector<std::pair<std::string, std::string>> skipped;  // path, why (special files, symlinks out)
  std::vector<std::pair<std::string, uint64_t>> too_large;   // path, size
  uint64_t hashed_files = 0, hashed_bytes = 0, reused = 0;
  bool incremental = false;  // only the directories a watch saw change were looked at
  uint64_t watched_dirs = 0;  // directories under the controller's watch after the scan
};

// Scans root into a cache-form manifest file at out_path (replaced when done; "" = a file of
// its own, unlinked once mapped), entry by entry in path order: the walk goes depth first in the
// manifest's byte order, a few directories listed ahead and files hashed on a pool of threads,
// each entry written as soon as those before it are. The hashes of `previous` (may be null) are
// reused under the racy rule, read in step with the walk. Memory: the listings of the
// directories ahead (each whole: one directory of a million files is listed in memory) and the
// hashes in flight, whatever the tree's size. std::runtime_error naming the root when it is not
// a readable directory, or naming the file when it cannot be written.
ScanResult scan_tree_to(const std::string& root, const ScanOptions& opts, const MappedManifest* previous,
                        const std::string& out_path);
// The same, in memory (tests and small trees): the result's manifest is filled.
ScanResult scan_tree(const std::string& root, const ScanOptions& opts, const Manifest* previous);

// Where a tree changed since a scan (relative directory paths, "" = the root).
struct ChangedDirs {
  std::set<std::string> listed;  // entries added, removed or changed directly in these
  std::set<std::string> walked;  // these whole subtrees (new directories, changed ignore files)
  bool everything = false;
  bool empty() const { return listed.empty() && walked.empty() && !everything; }
};

// A scan that revisits only what changed, to a file as scan_tree_to: `previous` is the manifest
// of an earlier scan of root with the same options and `notes` that scan's skipped and too_large
// lists, taken while a watch reported `changes` since; started_ns is the wall clock read before
// those changes were taken (the racy rule counts from it). The `listed` directories are listed
// again (their files re-hashed under the usual rule), the `walked` ones and any directory new
// since `previous` walked whole; all else is copied from previous as it streams by. Entries left
// without their parent directory are dropped. What is looked at afresh is held in memory: past
// max_fresh entries (a branch switch, a large unpack) this is a whole scan instead (the result
// says incremental false).
constexpr size_t kRescanEntries = 32768;
ScanResult rescan_tree(const std::string& root, const ScanOptions& opts, const MappedManifest& previous,
                       const ScanResult& notes, const ChangedDirs& changes, int64_t started_ns,
                       const std::string& out_path, size_t max_fresh = kRescanEntries);

int64_t wall_ns();

}  // namespace xmesh::ws
