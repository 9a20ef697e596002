// The controller's memory of its last scan of each local tree, keyed by the cache file path.
// The manifest is that file (written as the scan goes), so the next process reuses its hashes (racy rule). While
// an inotify watch set up before that scan began runs on a local file system, the next scan with
// the same options revisits only the directories the watch saw change (rescan_tree): a no-op
// sync of a large tree then costs no stat calls at all. Anything doubtful (no watch, the watch
// queue overflowed, the root replaced, other options) falls back to a whole scan.
#pragma once
#include <memory>
#include <string>

#include "scan.hpp"

namespace xmesh::ws {

// The scan of root, its manifest a file (ScanResult::file): at cache_path ("" = no cache: a file of
// its own, unlinked once mapped). incremental: allow the watched rescan. Only the last scan's
// figures stay in memory between syncs (the manifest is the mapped file).
ScanResult scan_cached(const std::string& root, const std::string& cache_path, const ScanOptions& opts,
                       bool incremental);

}  // namespace xmesh::ws
