// What turns a host's manifest into the local one: entries to add, to change (content, type,
// mode or link target) and to delete, and how many are unchanged.
#pragma once
#include <vector>

#include "manifest.hpp"

namespace xmesh::ws {

struct Diff {
  std::vector<const Entry*> added, changed;  // entries of the new manifest
  std::vector<const Entry*> deleted;         // entries of the old manifest
  size_t unchanged = 0;
  bool empty() const { return added.empty() && changed.empty() && deleted.empty(); }
};

Diff diff_manifests(const Manifest& old_m, const Manifest& new_m);

// A manifest as the change from one a host already holds: the entries added or changed
// (upserts) and the paths deleted, each a sorted manifest of its own, so a small edit to a large
// tree sends a few entries instead of the whole manifest.
struct ManifestDelta {
  Manifest upserts, deleted;  // deleted: only the paths matter
};
ManifestDelta make_delta(const Manifest& base, const Manifest& target);
// (A host applies a delta part by part as it merges it with its own manifest: receiver.cpp.)

}  // namespace xmesh::ws
