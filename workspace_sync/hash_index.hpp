// Which file of a host's copy holds a given content: the host manifest's file entries as a file
// of (hash, entry offset) records sorted by hash, with a fan-out table of 65,536 buckets in
// memory (256 KiB whatever the tree), so a lookup reads one bucket (a few records) with one
// pread. Built in three passes over a mapped manifest in constant memory: count per bucket,
// scatter into 256 regions through small buffers, sort each region (1/256 of the records).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fs_ops.hpp"
#include "manifest_file.hpp"

namespace xmesh::ws {

class HashIndex {
 public:
  // Writes the index of m's files to path (replaced); throws std::runtime_error naming it.
  HashIndex(const std::shared_ptr<const MappedManifest>& m, const std::string& path);
  // The offset in m of a file entry with this content, if any.
  std::optional<uint64_t> find(const Hash128& h) const;
  uint64_t size() const { return total_; }

 private:
  struct Record {
    uint64_t hi, lo, offset;
  };
  static size_t bucket(const Hash128& h) { return static_cast<size_t>(h.hi >> 48); }
  void scatter(const std::shared_ptr<const MappedManifest>& m);
  void sort_regions();
  unique_fd fd_;
  std::string path_;
  std::vector<uint32_t> start_;  // 65,537: where each bucket's records start
  uint64_t total_ = 0;
};

}  // namespace xmesh::ws
