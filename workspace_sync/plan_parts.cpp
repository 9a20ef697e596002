#include "plan_parts.hpp"

#include <algorithm>

namespace xmesh::ws {

PlanParts::PlanParts(std::shared_ptr<const MappedManifest> m, std::shared_ptr<const MappedManifest> base,
                     size_t part_entries)
    : delta_(base != nullptr), part_entries_(std::max<size_t>(1, part_entries)) {
  if (delta_)
    merge_.emplace(std::move(m), std::move(base));
  else
    whole_.emplace(std::move(m));
}

bool PlanParts::next(PlanPart& part) {
  skip_unchanged();
  if (made_ && done()) return false;
  Manifest ups, dels;
  part = PlanPart();
  size_t bytes = 0;
  while (!done() && ups.entries.size() + dels.entries.size() < part_entries_ && bytes < kPartBytes) {
    const Entry* e = delta_ ? merge_->now() : &whole_->entry();
    const uint64_t ordinal = delta_ ? merge_->now_index() : whole_->index();
    if (e) {
      ups.entries.push_back(*e);
      if (e->type == EntryType::File) part.files.push_back({e->hash, *e, ordinal});
    } else {
      e = merge_->before();
      dels.entries.push_back(*e);
    }
    bytes += e->path.size() + e->target.size() + 32;
    advance();
    skip_unchanged();
  }
  part.entries = ups.entries.size() + dels.entries.size();
  std::sort(part.files.begin(), part.files.end(), [](auto& a, auto& b) { return a.hash < b.hash; });
  part.frames.push_back(ups.encode_wire());
  if (delta_) part.frames.push_back(dels.encode_wire());
  part.last = done();
  made_ = true;
  return true;
}

bool PlanParts::done() const { return delta_ ? merge_->at_end() : whole_->at_end(); }

void PlanParts::advance() {
  if (delta_)
    merge_->next();
  else
    whole_->next();
}

// A delta passes over what both manifests hold alike.
void PlanParts::skip_unchanged() {
  while (delta_ && !merge_->at_end() && merge_->now() && merge_->before() && merge_->now()->same_as(*merge_->before()))
    merge_->next();
}

}  // namespace xmesh::ws
