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

}  // namespace xmesh::ws
