// What a plan sends, part by part (the Sync protocol's `plan` step, sender.hpp): the whole
// manifest, or the delta from a manifest a host holds (the entries added or changed and the
// paths deleted), in path order, made one part at a time from cursors over mapped manifest files
// so that neither side ever holds more than a part (receiver.hpp takes them the same way).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "manifest_file.hpp"

namespace xmesh::ws {

// A plan part: at most this many entries (a host takes up to SyncReceiver::kMaxPartEntries)
// and about this many bytes of paths.
constexpr size_t kPartEntries = 16384;
constexpr size_t kPartBytes = 2u << 20;

// One part of a plan: its frames (the wire form of the upserts, and for a delta of the
// deletions) and the files its answers may ask for.
struct PlanPart {
  std::vector<std::string> frames;
  struct File {
    Hash128 hash;
    Entry e;
    uint64_t ordinal;  // in the manifest
  };
  std::vector<File> files;  // by hash
  size_t entries = 0;
  bool last = false;
};

class PlanParts {
 public:
  // base null: the whole of m. part_entries: at most this many entries a part (tests use few).
  PlanParts(std::shared_ptr<const MappedManifest> m, std::shared_ptr<const MappedManifest> base,
            size_t part_entries = kPartEntries);
  // The next part (the first even when there is nothing to send: a plan has at least one);
  // false after the last. std::runtime_error when a manifest file does not read.
  bool next(PlanPart& part);

 private:
  bool done() const;
  void advance();
  void skip_unchanged();

  bool delta_;
  size_t part_entries_;
  std::optional<ManifestCursor> whole_;
  std::optional<ManifestMerge> merge_;
  bool made_ = false;
};

}  // namespace xmesh::ws
