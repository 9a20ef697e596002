#include "rank_selector.hpp"

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>

namespace xmesh {
namespace {

// What one dimension (or the flat rank list) is restricted to: an index, a slice or a tuple.
struct Pick {
  bool is_slice = false;
  std::optional<int64_t> start, stop, step;  // slice parts, each may be absent
  std::vector<int64_t> indices;              // an index or a tuple
};

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  void skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool at(char c) {
    skip();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  void expect(char c) {
    if (!at(c)) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool at_end() {
    skip();
    return pos_ >= s_.size();
  }
  [[noreturn]] void fail(const std::string& what) const {
    std::string near = pos_ < s_.size() ? "at '" + s_.substr(pos_, 12) + "'" : "at the end";
    throw RankSelectorError("malformed rank selector " + s_ + ": " + what + " " + near +
                            " (examples: ranks(3), ranks(1,4,6), ranks(2:8:2), ranks(gpus=0:4, hosts=(0,2)))");
  }
  std::string ident() {
    skip();
    size_t b = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
    return s_.substr(b, pos_ - b);
  }
  std::optional<int64_t> maybe_int() {
    skip();
    size_t b = pos_;
    if (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) ++pos_;
    size_t digits = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (pos_ == digits) {
      pos_ = b;
      return std::nullopt;
    }
    if (pos_ - digits > 15) fail("number too large");
    return std::stoll(s_.substr(b, pos_ - b));
  }
  int64_t integer() {
    auto v = maybe_int();
    if (!v) fail("expected a number");
    return *v;
  }
  // index | [start]:[stop][:[step]]
  Pick index_or_slice() {
    Pick p;
    auto first = maybe_int();
    if (!at(':')) {
      if (!first) fail("expected a rank, a slice such as 0:4, or name=...");
      p.indices.push_back(*first);
      return p;
    }
    p.is_slice = true;
    p.start = first;
    ++pos_;
    p.stop = maybe_int();
    if (at(':')) {
      ++pos_;
      p.step = maybe_int();
    }
    return p;
  }
  Pick value() {
    if (!at('(')) return index_or_slice();
    ++pos_;
    Pick p;
    while (!at(')')) {
      p.indices.push_back(integer());
      if (!at(',')) break;
      ++pos_;
    }
    expect(')');
    if (p.indices.empty()) fail("an empty tuple selects nothing");
    return p;
  }
  size_t pos() const { return pos_; }
  void set_pos(size_t p) { pos_ = p; }

 private:
  const std::string& s_;
  size_t pos_ = 0;
};

std::vector<int64_t> resolve(const Pick& p, int64_t n, const std::string& what) {
  std::vector<int64_t> out;
  if (!p.is_slice) {
    for (int64_t i : p.indices) {
      int64_t j = i < 0 ? i + n : i;
      if (j < 0 || j >= n)
        throw RankSelectorError(what + " " + std::to_string(i) + " is out of range: there are " + std::to_string(n) +
                                " (0-" + std::to_string(n - 1) + ")");
      out.push_back(j);
    }
    return out;
  }
  int64_t step = p.step.value_or(1);
  if (step == 0) throw RankSelectorError("a slice step cannot be zero (" + what + ")");
  // Python's slice.indices().
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v < 0 ? *v + n : *v;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  int64_t start = clamp(p.start, step > 0 ? 0 : n - 1);
  int64_t stop = clamp(p.stop, step > 0 ? n : -1);
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(i);
  return out;
}

}  // namespace

size_t rank_selector_end(const std::string& line, size_t start) {
  size_t open = line.find('(', start);
  std::string word = line.substr(start, open == std::string::npos ? std::string::npos : open - start);
  while (!word.empty() && std::isspace(static_cast<unsigned char>(word.back()))) word.pop_back();
  if (open == std::string::npos || word != "ranks")
    throw RankSelectorError("expected a rank selector such as ranks(0,2) or ranks(gpus=0:4), got '" +
                            line.substr(start, 24) + "'");
  int depth = 0;
  for (size_t i = open; i < line.size(); ++i) {
    if (line[i] == '(') ++depth;
    if (line[i] == ')' && --depth == 0) return i + 1;
  }
  throw RankSelectorError("the rank selector '" + line.substr(start) + "' has no closing parenthesis");
}

std::vector<int64_t> select_ranks(const std::string& selector, const std::vector<std::string>& labels,
                                  const std::vector<int64_t>& sizes) {
  int64_t total = 1;
  for (int64_t s : sizes) total *= s;
  Parser ps(selector);
  if (ps.ident() != "ranks") ps.fail("expected 'ranks('");
  ps.expect('(');
  std::vector<Pick> positional;
  std::vector<std::pair<std::string, Pick>> named;
  while (!ps.at(')')) {
    size_t save = ps.pos();
    std::string name = ps.ident();
    if (!name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) && ps.at('=')) {
      ps.expect('=');
      named.emplace_back(name, ps.value());
    } else {
      ps.set_pos(save);
      positional.push_back(ps.index_or_slice());
    }
    if (!ps.at(',')) break;
    ps.expect(',');
  }
  ps.expect(')');
  if (!ps.at_end()) ps.fail("unexpected text after the selector");
  if (positional.empty() && named.empty()) ps.fail("no ranks given");
  if (!positional.empty() && !named.empty())
    throw RankSelectorError("rank selector " + selector +
                            " mixes plain ranks and dimensions: use either ranks(1,2) or ranks(gpus=0:2)");

  std::set<int64_t> picked;
  if (!positional.empty()) {
    for (const Pick& p : positional)
      for (int64_t r : resolve(p, total, "rank")) picked.insert(r);
  } else {
    // Per dimension: the chosen coordinates (all of them for dimensions not named).
    std::vector<std::vector<int64_t>> coords(labels.size());
    for (size_t d = 0; d < labels.size(); ++d)
      for (int64_t i = 0; i < sizes[d]; ++i) coords[d].push_back(i);
    std::set<std::string> seen;
    for (auto& [name, pick] : named) {
      auto it = std::find(labels.begin(), labels.end(), name);
      if (it == labels.end()) {
        std::string known;
        for (auto& l : labels) known += (known.empty() ? "" : ", ") + l;
        throw RankSelectorError("this mesh has no dimension '" + name + "' (its dimensions: " +
                                (known.empty() ? "none" : known) + ")");
      }
      if (!seen.insert(name).second) throw RankSelectorError("dimension '" + name + "' is given twice");
      size_t d = static_cast<size_t>(it - labels.begin());
      coords[d] = resolve(pick, sizes[d], "index of '" + name + "'");
    }
    // Row-major: rank = sum(coord[d] * stride[d]).
    std::vector<int64_t> stride(labels.size(), 1);
    for (size_t d = labels.size(); d-- > 1;) stride[d - 1] = stride[d] * sizes[d];
    std::vector<size_t> at(labels.size(), 0);
    bool empty = false;
    for (auto& c : coords) empty = empty || c.empty();
    while (!empty) {
      int64_t r = 0;
      for (size_t d = 0; d < labels.size(); ++d) r += coords[d][at[d]] * stride[d];
      picked.insert(r);
      size_t d = labels.size();
      while (d > 0) {
        --d;
        if (++at[d] < coords[d].size()) break;
        at[d] = 0;
        if (d == 0) empty = true;
      }
      if (labels.empty()) break;
    }
  }
  if (picked.empty()) throw RankSelectorError("rank selector " + selector + " selects no rank");
  return {picked.begin(), picked.end()};
}

}  // namespace xmesh
