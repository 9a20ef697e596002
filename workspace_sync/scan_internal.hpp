// The pieces the scans share (scan.cpp: rescans; scan_ordered.cpp: the whole walk): one
// directory listed and judged against the ignore rules, the racy-file rule, and the writer of
// a scan's manifest file. Not part of the library's interface.
#pragma once
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "fs_ops.hpp"
#include "ignore.hpp"
#include "manifest_file.hpp"
#include "scan.hpp"

namespace xmesh::ws::detail {

// The rules every directory of a scan applies besides its rule files: the user's excludes and
// the defaults.
struct FixedRules {
  IgnoreRules user, defaults;
  explicit FixedRules(const ScanOptions& opts);
};

// One directory's entries that the scan keeps, sorted bytewise by `path`, which holds the name
// only. Each kept subdirectory (one that opened when listed) comes twice: its own entry (`name`)
// and, with subtree set, the place of its contents in the manifest's order (`name/`: "a" <
// "a.txt" < "a/b"). Files carry their stat values (mtime_ns, ctime_ns, ino, size), not a hash
// yet; symlinks their target. A directory of more than kListChunk entries is sorted in chunks
// spilled to scratch files as sorted runs (mapped, their names gone), read back merged by a
// ListingReader: a directory of a million files never has its listing in memory.
constexpr size_t kListChunk = 8192;
struct Listing {
  struct Item {
    Entry e;
    bool subtree = false;
  };
  std::string rel;  // the directory, relative to the root ("" = the root)
  std::shared_ptr<unique_fd> dir;  // open while a file or subdirectory of it may still be opened
  std::shared_ptr<const IgnoreRules> rules;  // the rule files of this directory and its ancestors
  std::vector<Item> items;  // with runs: the last chunk
  std::vector<std::shared_ptr<const MappedManifest>> runs;
  std::vector<std::pair<std::string, std::string>> skipped;
  std::vector<std::pair<std::string, uint64_t>> too_large;
  bool opened = true;  // false: the directory could not be opened (said in skipped)
};

// A listing's items in order, with a look ahead of up to kLook items (peek(k): the k-th after
// the current one, 0 the current; null past the end or past the look ahead).
class ListingReader {
 public:
  static constexpr size_t kLook = 1024;
  explicit ListingReader(const Listing& l);
  const Listing::Item* peek(size_t k);
  void pop();

 private:
  bool pull(Listing::Item& out);  // the next item of the merge of the runs and the last chunk
  const Listing& l_;
  size_t pos_ = 0;  // without runs: the current item's index
  std::vector<ManifestCursor> runs_;
  std::vector<size_t> heap_;  // the runs with entries left, by their current key
  size_t tail_ = 0;  // the next item of l_.items to merge
  std::deque<Listing::Item> window_;
};

// Lists the directory `fd` (taken over) at rel. parent_rules: its ancestors' rule files.
std::shared_ptr<Listing> list_directory(int fd, const std::string& rel, const ScanOptions& opts,
                                        const FixedRules& fixed, std::shared_ptr<const IgnoreRules> parent_rules);
// Opens subdirectory `name` of a listing and lists it; a directory that cannot be opened gives
// a listing with opened false and the reason in skipped.
std::shared_ptr<Listing> list_subdirectory(const Listing& parent, const std::string& name, const ScanOptions& opts,
                                           const FixedRules& fixed);

// A rule file's text (at most about 1 MiB); false when it cannot be opened.
bool read_small_file(int dirfd, const char* name, std::string& out);

std::string join_path(const std::string& dir, const std::string& name);

// The racy-file rule (scan.hpp): `old`'s hash still holds for a file whose stat is `now`'s.
bool hash_still_valid(const Entry& old, const Entry& now, int64_t previous_scan_ns);

// A scan's manifest written entry by entry in path order, with its digest and counts, the
// symlinks kept aside to judge at the end (a link through a link is dropped, said in skipped:
// only the whole tree's links tell; when one is, the file is written a second time without it).
class ScanWriter {
 public:
  ScanWriter(const std::string& out_path, int64_t scan_ns);
  ~ScanWriter();
  ScanWriter(const ScanWriter&) = delete;
  ScanWriter& operator=(const ScanWriter&) = delete;
  void add(const Entry& e);
  // Sets r.file, r.digest and the counts; adds the dropped links to r.skipped (sorted).
  void finish(ScanResult& r);

 private:
  struct Counts {
    uint64_t entries = 0, files = 0, dirs = 0, symlinks = 0, bytes = 0;
    void add(const Entry& e);
  };
  std::string out_path_, temp_;  // temp_: the file of its own when no out_path was given
  int64_t scan_ns_;
  std::unique_ptr<CacheWriter> writer_;
  DigestBuilder digest_;
  Counts counts_;
  Manifest links_;  // path and target of every symlink written
};

}  // namespace xmesh::ws::detail
