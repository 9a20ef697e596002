// What a host accepts from a manifest: relative paths that stay inside the workspace copy, and
// only files, directories and symlinks whose targets stay inside too. Used by the receiving side
// on every manifest (a malicious or broken one is refused as a whole, naming the entry) and by
// the scanner to skip local symlinks that point out of the workspace.
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "manifest.hpp"

namespace xmesh::ws {

// The directory part of a relative path ("" for a top-level entry).
inline std::string_view parent_dir(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? std::string_view() : path.substr(0, slash);
}

// Where a host copy keeps its state (manifests, staged files); never a synced path.
constexpr const char* kStateDirName = ".xmesh-sync";

struct PathError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A relative '/'-separated path with no empty, "." or ".." component, no NUL, not absolute, not
// under the state directory. `allow_empty` admits "" (the workspace root, for a destination).
bool valid_relative_path(const std::string& path, std::string* why, bool allow_empty = false);
// The target of a symlink at link_path, resolved lexically from the link's directory, stays
// inside the workspace (absolute targets never do).
bool symlink_stays_inside(const std::string& link_path, const std::string& target, std::string* why);
// The same, and no component the target walks through (all but its last) is a symlink of m:
// the kernel follows a link before a '..' after it, so `s/..` with s -> ../.. leaves the tree
// although the lexical walk stays in. m is sorted (Manifest::find).
bool symlink_resolves_inside(const Manifest& m, const std::string& link_path, const std::string& target,
                             std::string* why);
// The symlinks of `links` (a tree's symlinks only, sorted) that symlink_resolves_inside refuses:
// (path, "symlink to <target> <why>") each, in path order. What the scan drops and a host refuses.
std::vector<std::pair<std::string, std::string>> links_through_links(const Manifest& links);
// Every entry of a received manifest: valid paths in order, targets inside, each parent present
// as a directory entry (so no path reaches through a symlink or a file). Throws PathError.
void check_manifest(const Manifest& m);
// check_manifest for a manifest that comes entry by entry in path order, in memory that grows
// with its symlinks only: each entry is judged as it comes (a valid path, after the one before,
// its parent present as a directory: the entries that are string prefixes of the current path
// are all it keeps, since every path with a given prefix sorts together), and finish() judges
// every symlink against the symlinks of the whole manifest. Throws PathError.
class ManifestChecker {
 public:
  void add(const Entry& e);
  void finish();
  uint64_t count() const { return count_; }

 private:
  struct Open {
    std::string path;
    EntryType type;
  };
  std::vector<Open> prefixes_;  // each a prefix of the next
  std::string last_;
  uint64_t count_ = 0;
  Manifest links_;  // the symlinks so far (in path order: find() works)
};

}  // namespace xmesh::ws
