// Scans a local workspace tree into a Manifest. Change detection never misses an edit: a file's
// previous hash is reused only when its size, mtime (ns), ctime and inode are unchanged AND its
// mtime is more than a second older than the previous scan (git's racy-file rule: an edit in
// the same timestamp tick as the previous look, keeping the size, is caught by re-hashing).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ignore.hpp"
#include "manifest.hpp"

namespace xmesh::ws {

struct ScanOptions {
  std::vector<std::string> excludes;  // gitignore syntax, relative to the root
  bool use_ignore_files = true;       // .gitignore and .xmeshignore
  bool default_excludes = true;       // __pycache__/ and *.pyc
  uint64_t max_file_size = 0;         // 0: no limit; larger files are listed in too_large
};

struct ScanResult {
  Manifest manifest;
  std::vector<std::pair<std::string, std::string>> skipped;  // path, why (special files, symlinks out)
  std::vector<std::pair<std::string, uint64_t>> too_large;   // path, size
  uint64_t hashed_files = 0, hashed_bytes = 0, reused = 0;
};

// Throws std::runtime_error naming the root when it is not a readable directory.
ScanResult scan_tree(const std::string& root, const ScanOptions& opts, const Manifest* previous);

int64_t wall_ns();

}  // namespace xmesh::ws
