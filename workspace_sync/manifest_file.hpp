// Manifests as files read entry by entry, so that a sync of a million-entry tree never holds the
// tree in memory: a cache-form file (manifest.hpp) mapped read-only, any number of cursors over
// it (each drops the pages it has read behind it), and a merge of two of them by path.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "manifest.hpp"

namespace xmesh::ws {

// A cache-form manifest file, mapped. open() is false when the file is missing or its header
// does not read; an entry that does not read throws std::runtime_error from a cursor.
class MappedManifest {
 public:
  static std::shared_ptr<const MappedManifest> open(const std::string& path);
  // The same from an open descriptor (readable; it stays open): what a writer just wrote, mapped
  // before the file is renamed into place, so a rename by another process cannot swap it.
  static std::shared_ptr<const MappedManifest> open_fd(int fd);
  static std::shared_ptr<const MappedManifest> empty();  // no entries (a copy not made yet)
  ~MappedManifest();
  MappedManifest(const MappedManifest&) = delete;
  MappedManifest& operator=(const MappedManifest&) = delete;

  int64_t scan_ns() const { return scan_ns_; }
  uint64_t count() const { return count_; }
  // The entry that starts at offset (an offset a cursor gave), or std::runtime_error.
  Entry entry_at(uint64_t offset) const;
  // Every entry in memory (tests, small trees, the Python scan API); std::runtime_error when an
  // entry does not read.
  Manifest load() const;

 private:
  friend class ManifestCursor;
  MappedManifest() = default;
  const char* base_ = nullptr;
  size_t size_ = 0;
  size_t first_ = 0;  // where the entries start
  uint64_t count_ = 0;
  int64_t scan_ns_ = 0;
};

// Entries of a MappedManifest in order. at_end() after the last; entry() is the current one and
// offset() where it starts in the file.
class ManifestCursor {
 public:
  explicit ManifestCursor(std::shared_ptr<const MappedManifest> m);
  ~ManifestCursor();  // the pages it read and kept go back too
  ManifestCursor(ManifestCursor&&) = default;
  ManifestCursor& operator=(ManifestCursor&&) = default;
  bool at_end() const { return done_; }
  const Entry& entry() const { return entry_; }
  uint64_t offset() const { return offset_; }
  uint64_t index() const { return read_ - 1; }  // the current entry's ordinal
  void next();  // throws std::runtime_error when the next entry does not read

 private:
  std::shared_ptr<const MappedManifest> m_;
  size_t pos_ = 0, dropped_ = 0;
  uint64_t read_ = 0, offset_ = 0;
  Entry entry_;
  bool done_ = false;
};

// Two manifests walked together by path: each step is one path, with the entry of the new
// manifest and of the old one at that path (either may be null).
class ManifestMerge {
 public:
  ManifestMerge(std::shared_ptr<const MappedManifest> new_m, std::shared_ptr<const MappedManifest> old_m);
  bool at_end() const { return now_.at_end() && before_.at_end(); }
  const Entry* now() const { return now_here_ ? &now_.entry() : nullptr; }
  const Entry* before() const { return before_here_ ? &before_.entry() : nullptr; }
  uint64_t now_offset() const { return now_.offset(); }
  uint64_t now_index() const { return now_.index(); }  // the ordinal of now() in the new manifest
  void next();

 private:
  void settle();
  ManifestCursor now_, before_;
  bool now_here_ = false, before_here_ = false;
};

}  // namespace xmesh::ws
