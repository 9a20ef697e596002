// The controller's side of a workspace sync: scan the local tree (reusing the previous
// manifest's hashes under the racy-file rule), then drive every host's SyncReceiver through
// the Sync steps concurrently: begin (digest only), plan (the manifest), data (only the content
// each host lacks, zstd-compressed where that helps, each byte sent once per host, hosts that
// lack the same content sharing one stream), commit. Any failure or interrupt aborts the hosts'
// sessions, which leaves every host copy as it was.
#pragma once
#include <nlohmann/json.hpp>

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "manifest_file.hpp"
#include "scan.hpp"

namespace xmesh {
class Node;
}

namespace xmesh::ws {

struct PushOptions {
  std::string dest;              // where on each host, relative to its workspace root ("" = the root)
  std::string space_for;         // the named allocation whose workspace this is ("" = the controller's)
  ScanOptions scan;
  std::string cache_path;        // the local manifest cache ("" = none)
  bool incremental = true;       // rescan only what a watch saw change (scan_cache.hpp)
  std::string compress = "auto";  // auto: only for hosts not on this machine (ipc://); always; never
  int zstd_level = 1;
  size_t batch_bytes = 4u << 20;  // raw bytes per data message
  int window = 4;                 // data messages in flight per group of hosts
  int step_timeout_ms = 60000;    // a host silent this long during one step fails the sync (plans and
                                  // commits get 1 ms more per manifest entry: a large tree takes long)
};

struct PushHost {
  std::string addr, label;
};

// Manifests this process scanned lately, newest first: a host whose manifest is one of them
// (its digest answers `begin`) gets the plan as a delta against it. Each is a mapped manifest
// file (a scan's, kept mapped after the next scan renamed its own over it: the pages are the
// page cache's, given back as cursors pass, and the disk space goes with the last mapping). At
// most max_count of them, and older ones only while all hold at most max(entry_budget, 2 x the
// newest's) entries: each version of a million-file tree is ~80 MiB of disk, and a host is
// rarely more than one version behind. Thread-safe.
class RecentManifests {
 public:
  RecentManifests(size_t max_count, size_t entry_budget) : max_count_(max_count), entry_budget_(entry_budget) {}
  void remember(const Hash128& digest, std::shared_ptr<const MappedManifest> m);
  std::shared_ptr<const MappedManifest> find(const Hash128& digest) const;
  size_t size() const;

 private:
  size_t max_count_, entry_budget_;
  mutable std::mutex mu_;
  std::deque<std::pair<Hash128, std::shared_ptr<const MappedManifest>>> recent_;
};

// Raised (as std::runtime_error) with a message naming the host and the problem.
// check_interrupt is called between waits; it throws to stop the sync (the hosts are aborted).
// Returns the report: scan figures, per host outcome (same, counts, bytes), what was sent.
nlohmann::json push_workspace(Node& node, const std::string& root, const std::vector<PushHost>& hosts,
                              const PushOptions& opts, const std::function<void()>& check_interrupt);

}  // namespace xmesh::ws
