#include "diff.hpp"

namespace xmesh::ws {

Diff diff_manifests(const Manifest& old_m, const Manifest& new_m) {
  Diff d;
  size_t i = 0, j = 0;
  const auto& a = old_m.entries;
  const auto& b = new_m.entries;
  while (i < a.size() || j < b.size()) {
    if (j == b.size() || (i < a.size() && a[i].path < b[j].path)) {
      d.deleted.push_back(&a[i++]);
    } else if (i == a.size() || b[j].path < a[i].path) {
      d.added.push_back(&b[j++]);
    } else {
      if (a[i].same_as(b[j]))
        ++d.unchanged;
      else
        d.changed.push_back(&b[j]);
      ++i, ++j;
    }
  }
  return d;
}

}  // namespace xmesh::ws
