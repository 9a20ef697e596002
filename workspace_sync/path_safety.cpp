#include "path_safety.hpp"

#include <algorithm>
#include <vector>

namespace xmesh::ws {

namespace {
std::vector<std::string> split(const std::string& p) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    size_t slash = p.find('/', pos);
    out.push_back(p.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos));
    if (slash == std::string::npos) return out;
    pos = slash + 1;
  }
}
}  // namespace

bool valid_relative_path(const std::string& path, std::string* why, bool allow_empty) {
  auto fail = [&](const std::string& w) {
    if (why) *why = w;
    return false;
  };
  if (path.empty()) return allow_empty ? true : fail("is empty");
  if (path.size() > 4096) return fail("is longer than 4096 bytes");
  if (path.find('\0') != std::string::npos) return fail("contains a NUL byte");
  if (path[0] == '/') return fail("is absolute");
  auto parts = split(path);
  for (auto& c : parts) {
    if (c.empty()) return fail("has an empty component");
    if (c == "." || c == "..") return fail("has a '" + c + "' component");
    if (c.size() > 255) return fail("has a component longer than 255 bytes");
  }
  if (parts[0] == kStateDirName) return fail(std::string("is inside ") + kStateDirName + ", the copy's own state");
  return true;
}

bool symlink_stays_inside(const std::string& link_path, const std::string& target, std::string* why) {
  auto fail = [&](const std::string& w) {
    if (why) *why = w;
    return false;
  };
  if (target.empty()) return fail("is empty");
  if (target.find('\0') != std::string::npos) return fail("contains a NUL byte");
  if (target[0] == '/') return fail("points outside the workspace (absolute)");
  // Depth of the link's directory, then walk the target's components.
  auto link_parts = split(link_path);
  long depth = static_cast<long>(link_parts.size()) - 1;
  for (auto& c : split(target)) {
    if (c.empty() || c == ".") continue;
    if (c == "..") {
      if (--depth < 0) return fail("points outside the workspace");
    } else {
      ++depth;
    }
  }
  return true;
}

bool symlink_resolves_inside(const Manifest& m, const std::string& link_path, const std::string& target,
                             std::string* why) {
  if (!symlink_stays_inside(link_path, target, why)) return false;
  std::vector<std::string> at = split(link_path);
  at.pop_back();  // the link's directory
  std::vector<std::string> steps;
  for (auto& c : split(target))
    if (!c.empty() && c != ".") steps.push_back(c);
  std::string walked;
  for (size_t i = 0; i + 1 < steps.size(); ++i) {  // the last component may be a link (checked on its own)
    if (steps[i] == "..") {
      at.pop_back();  // never past the root: the lexical walk above stayed inside
      continue;
    }
    at.push_back(steps[i]);
    walked.clear();
    for (auto& part : at) walked += (walked.empty() ? "" : "/") + part;
    const Entry* e = m.find(walked);
    if (e && e->type == EntryType::Symlink) {
      if (why) *why = "passes through the symlink '" + walked + "' (a link's target may not go through another "
                      "link: it could resolve outside the workspace)";
      return false;
    }
  }
  return true;
}

std::vector<std::pair<std::string, std::string>> links_through_links(const Manifest& links) {
  std::vector<std::pair<std::string, std::string>> refused;
  std::string why;
  for (auto& e : links.entries)
    if (e.type == EntryType::Symlink && !symlink_resolves_inside(links, e.path, e.target, &why))
      refused.emplace_back(e.path, "symlink to " + e.target + " " + why);
  return refused;
}

void check_manifest(const Manifest& m) {
  ManifestChecker check;
  for (auto& e : m.entries) check.add(e);
  check.finish();
}

void ManifestChecker::add(const Entry& e) {
  std::string why;
  if (!valid_relative_path(e.path, &why)) throw PathError("refused manifest entry '" + e.path + "': the path " + why);
  if (count_ > 0 && !(last_ < e.path))
    throw PathError("refused manifest entry '" + e.path + "': the paths are not sorted and unique (it follows '" +
                    last_ + "')");
  if (e.type == EntryType::Symlink && !symlink_stays_inside(e.path, e.target, &why))
    throw PathError("refused manifest entry '" + e.path + "': symlink to '" + e.target + "' " + why);
  while (!prefixes_.empty() && e.path.compare(0, prefixes_.back().path.size(), prefixes_.back().path) != 0)
    prefixes_.pop_back();
  const std::string_view parent = parent_dir(e.path);
  if (!parent.empty()) {
    const Open* found = nullptr;  // the parent, when present, is near the top (usually the top)
    for (auto o = prefixes_.rbegin(); o != prefixes_.rend() && !found; ++o)
      if (o->path == parent) found = &*o;
    if (!found || found->type != EntryType::Dir)
      throw PathError("refused manifest entry '" + e.path + "': its parent '" + std::string(parent) +
                      (found ? "' is not a directory" : "' is not in the manifest"));
  }
  prefixes_.push_back(Open{e.path, e.type});
  last_ = e.path;
  ++count_;
  if (e.type == EntryType::Symlink) {
    Entry link;
    link.path = e.path;
    link.type = e.type;
    link.target = e.target;
    links_.entries.push_back(std::move(link));
  }
}

void ManifestChecker::finish() {
  auto refused = links_through_links(links_);
  if (!refused.empty()) throw PathError("refused manifest entry '" + refused[0].first + "': " + refused[0].second);
}

}  // namespace xmesh::ws
