#include "diff.hpp"

#include <algorithm>
#include <stdexcept>

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

ManifestDelta make_delta(const Manifest& base, const Manifest& target) {
  Diff d = diff_manifests(base, target);
  ManifestDelta out;
  std::vector<const Entry*> up(d.added);
  up.insert(up.end(), d.changed.begin(), d.changed.end());
  std::sort(up.begin(), up.end(), [](const Entry* a, const Entry* b) { return a->path < b->path; });
  for (const Entry* e : up) out.upserts.entries.push_back(*e);
  for (const Entry* e : d.deleted) out.deleted.entries.push_back(*e);  // already in path order
  return out;
}

}  // namespace xmesh::ws
