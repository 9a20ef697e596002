// The controller's memory of its last scan of each local tree, keyed by the cache file path.
// The manifest goes to that file too, so the next process reuses its hashes (racy rule). While
// an inotify watch set up before that scan began runs on a local file system, the next scan with
// the same options revisits only the directories the watch saw change (rescan_tree): a no-op
// sync of a large tree then costs no stat calls at all. Anything doubtful (no watch, the watch
// queue overflowed, the root replaced, other options) falls back to a whole scan.
#pragma once
#include <memory>
#include <string>

#include "scan.hpp"

namespace xmesh::ws {

// figures gets the scan's lists and counts (its manifest stays empty); the manifest is returned
// shared with the cache rather than copied. incremental: allow the watched rescan.
std::shared_ptr<const Manifest> scan_cached(const std::string& root, const std::string& cache_path,
                                            const ScanOptions& opts, bool incremental, ScanResult& figures);

}  // namespace xmesh::ws
