#include "ignore.hpp"

namespace xmesh::ws {

namespace {

// [...] at p (p points at '['); on success advances p past ']' and returns whether c matched.
// Returns -1 for a malformed class (then '[' is taken literally).
int match_class(const char*& p, char c) {
  const char* q = p + 1;
  bool negate = false;
  if (*q == '!' || *q == '^') {
    negate = true;
    ++q;
  }
  bool matched = false;
  bool first = true;
  while (*q && (first || *q != ']')) {
    first = false;
    char lo = *q;
    if (lo == '\\' && q[1]) lo = *++q;
    char hi = lo;
    if (q[1] == '-' && q[2] && q[2] != ']') {
      hi = q[2];
      if (hi == '\\' && q[3]) {
        hi = q[3];
        ++q;
      }
      q += 2;
    }
    if (c >= lo && c <= hi) matched = true;
    ++q;
  }
  if (*q != ']') return -1;
  p = q + 1;
  return (matched != negate) && c != '/';
}

bool match(const char* p, const char* s) {
  while (*p) {
    if (*p == '*') {
      if (p[1] == '*') {
        const char* rest = p + 2;
        while (*rest == '*') ++rest;
        if (*rest == '/') {  // "**/": zero or more whole directories
          ++rest;
          if (match(rest, s)) return true;
          for (const char* t = s; *t; ++t)
            if (*t == '/' && match(rest, t + 1)) return true;
          return false;
        }
        for (const char* t = s;; ++t) {  // "**" elsewhere: anything, '/' included
          if (match(rest, t)) return true;
          if (!*t) return false;
        }
      }
      const char* rest = p + 1;
      for (const char* t = s;; ++t) {
        if (match(rest, t)) return true;
        if (!*t || *t == '/') return false;
      }
    }
    if (!*s) return false;
    if (*p == '?') {
      if (*s == '/') return false;
      ++p, ++s;
      continue;
    }
    if (*p == '[') {
      const char* q = p;
      int r = match_class(q, *s);
      if (r == 0) return false;
      if (r == 1) {
        p = q, ++s;
        continue;
      }
    }
    if (*p == '\\' && p[1]) ++p;
    if (*p != *s) return false;
    ++p, ++s;
  }
  return *s == 0;
}

}  // namespace

bool glob_match(const std::string& pattern, const std::string& path) { return match(pattern.c_str(), path.c_str()); }

void IgnoreRules::add_line(const std::string& base, const std::string& raw) {
  std::string line = raw;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  // Trailing spaces go unless escaped with a backslash.
  while (!line.empty() && line.back() == ' ' && !(line.size() >= 2 && line[line.size() - 2] == '\\')) line.pop_back();
  if (line.empty() || line[0] == '#') return;
  Rule r;
  r.base = base;
  if (line[0] == '!') {
    r.negate = true;
    line.erase(0, 1);
  } else if (line[0] == '\\' && line.size() > 1 && (line[1] == '!' || line[1] == '#')) {
    line.erase(0, 1);
  }
  if (!line.empty() && line.back() == '/') {
    r.dir_only = true;
    line.pop_back();
  }
  if (line.empty()) return;
  if (line[0] == '/') {
    r.anchored = true;
    line.erase(0, 1);
  } else if (line.find('/') != std::string::npos) {
    r.anchored = true;
  }
  if (line.empty()) return;
  r.pattern = line;
  rules_.push_back(std::move(r));
}

void IgnoreRules::add_text(const std::string& base, const std::string& text) {
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    add_line(base, text.substr(pos, nl - pos));
    pos = nl + 1;
  }
}

int IgnoreRules::verdict(const std::string& path, bool is_dir) const {
  for (auto it = rules_.rbegin(); it != rules_.rend(); ++it) {
    const Rule& r = *it;
    if (r.dir_only && !is_dir) continue;
    std::string rel;
    if (r.base.empty()) {
      rel = path;
    } else if (path.size() > r.base.size() && path.compare(0, r.base.size(), r.base) == 0 && path[r.base.size()] == '/') {
      rel = path.substr(r.base.size() + 1);
    } else {
      continue;
    }
    bool hit;
    if (r.anchored) {
      hit = glob_match(r.pattern, rel);
    } else {
      size_t slash = rel.rfind('/');
      hit = glob_match(r.pattern, slash == std::string::npos ? rel : rel.substr(slash + 1));
    }
    if (hit) return r.negate ? 0 : 1;
  }
  return -1;
}

bool IgnoreStack::ignored(const std::string& path, bool is_dir) const {
  for (const IgnoreRules* rules : {user, files, defaults}) {
    if (!rules) continue;
    int v = rules->verdict(path, is_dir);
    if (v >= 0) return v == 1;
  }
  return false;
}

}  // namespace xmesh::ws
