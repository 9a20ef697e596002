// Ignore rules with git's semantics: `.gitignore` and `.xmeshignore` files in any directory of
// the workspace, plus the caller's `exclude=` patterns (which win over the files). Patterns:
// `#` comments, `!` re-includes, a trailing `/` matches directories only, a `/` at the start or
// in the middle anchors the pattern to the directory of its file (otherwise it matches a name
// at any depth), `*` `?` `[a-z]` within one path component, `**` across components.
#pragma once
#include <string>
#include <vector>

namespace xmesh::ws {

// Matches a gitignore-style glob against a '/'-separated path (see above).
bool glob_match(const std::string& pattern, const std::string& path);

class IgnoreRules {
 public:
  // One line of a rule file that lives in directory `base` ("" for the workspace root).
  void add_line(const std::string& base, const std::string& line);
  void add_text(const std::string& base, const std::string& text);
  size_t size() const { return rules_.size(); }
  // The verdict of the last rule matching `path` (relative to the root): 1 ignored,
  // 0 re-included by a `!` rule, -1 no rule matched.
  int verdict(const std::string& path, bool is_dir) const;

 private:
  struct Rule {
    std::string base, pattern;
    bool negate = false, dir_only = false, anchored = false;
  };
  std::vector<Rule> rules_;
};

// What the scanner applies: the user's excludes first (they have the last word), then the
// rule files found in the tree, then the defaults (compiled Python files).
struct IgnoreStack {
  const IgnoreRules* user = nullptr;
  const IgnoreRules* files = nullptr;  // the rule files of this directory and its ancestors
  const IgnoreRules* defaults = nullptr;
  bool ignored(const std::string& path, bool is_dir) const;
};

}  // namespace xmesh::ws
