#include "log_aggregator.hpp"

#include <algorithm>
#include <cstdlib>
#include <numeric>

namespace xmesh {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_word(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

// Length of the number starting at line[i] (0 if none): digits, an optional fraction and an
// optional exponent. A number glued to a word ("v1", "cuda0") is part of the word.
size_t number_at(std::string_view line, size_t i) {
  size_t n = line.size(), j = i;
  if (i > 0 && (is_word(line[i - 1]) || line[i - 1] == '.')) return 0;
  if (j < n && (line[j] == '-' || line[j] == '+')) ++j;
  size_t digits = j;
  while (j < n && is_digit(line[j])) ++j;
  if (j == digits) return 0;
  if (j + 1 < n && line[j] == '.' && is_digit(line[j + 1])) {
    ++j;
    while (j < n && is_digit(line[j])) ++j;
  }
  if (j + 1 < n && (line[j] == 'e' || line[j] == 'E')) {
    size_t k = j + 1;
    if (k < n && (line[k] == '-' || line[k] == '+')) ++k;
    if (k < n && is_digit(line[k])) {
      j = k;
      while (j < n && is_digit(line[j])) ++j;
    }
  }
  if (j < n && (is_word(line[j]) && !is_digit(line[j]))) return 0;  // "3rd", "10px": a word
  return j - i;
}

}  // namespace

LineShape shape_of(std::string_view line) {
  LineShape s;
  s.key.reserve(line.size());
  size_t i = 0;
  while (i < line.size()) {
    char c = line[i];
    if (is_digit(c) || ((c == '-' || c == '+') && i + 1 < line.size() && is_digit(line[i + 1]))) {
      size_t len = number_at(line, i);
      if (len > 0) {
        s.numbers.emplace_back(line.substr(i, len));
        s.key.push_back('\x01');
        i += len;
        continue;
      }
    }
    s.key.push_back(c == '\x01' ? '?' : c);
    ++i;
  }
  return s;
}

std::string describe_ranks(std::vector<int64_t> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  if (ranks.size() == 1) return std::to_string(ranks[0]);
  std::string out = "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out.push_back(',');
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string rank_prefix(const std::string& label, const std::vector<int64_t>& ranks, const RankHosts* hosts) {
  std::string p = "[";
  if (!label.empty()) p += label + " ";
  p += describe_ranks(ranks);
  if (hosts) {  // the host, when these ranks share one
    std::string host;
    for (int64_t r : ranks) {
      auto it = hosts->find(r);
      if (it == hosts->end() || (!host.empty() && it->second != host)) {
        host.clear();
        break;
      }
      host = it->second;
    }
    if (!host.empty()) p += "@" + host;
  }
  p += "] ";
  return p;
}

void LineAggregator::add(int64_t rank, std::string_view line) {
  LineShape s = shape_of(line);
  int occurrence = occurrences_[rank][s.key]++;
  std::string slot = s.key;
  slot.push_back('\0');
  slot += std::to_string(occurrence);
  auto it = index_.find(slot);
  if (it == index_.end()) {
    Group g;
    g.key = std::move(s.key);
    g.first_text.assign(line);
    g.ranks.push_back(rank);
    g.numbers.push_back(std::move(s.numbers));
    index_.emplace(std::move(slot), groups_.size());
    groups_.push_back(std::move(g));
    return;
  }
  Group& g = groups_[it->second];
  if (g.identical && line != g.first_text) g.identical = false;
  g.ranks.push_back(rank);
  g.numbers.push_back(std::move(s.numbers));
}

std::string LineAggregator::member_line(const Group& g, size_t member) const {
  std::string out;
  size_t slot = 0;
  for (char c : g.key) {
    if (c != '\x01') {
      out.push_back(c);
      continue;
    }
    out += slot < g.numbers[member].size() ? g.numbers[member][slot] : "?";
    ++slot;
  }
  return out;
}

std::vector<AggregatedLine> LineAggregator::lines(const std::string& label, const RankHosts* hosts) const {
  std::vector<AggregatedLine> out;
  out.reserve(groups_.size());
  for (auto& g : groups_) {
    AggregatedLine line;
    line.ranks = g.ranks;
    if (g.ranks.size() == 1 || g.identical) {
      line.text = rank_prefix(label, g.ranks, hosts) + g.first_text + "\n";
      out.push_back(std::move(line));
      continue;
    }
    // Lines that differ in their numbers: the lowest rank's own line, as it printed it, and
    // which other ranks printed one like it (what a person reads as a summary, never as a line
    // somebody printed); unfolded, each rank's own line.
    std::vector<size_t> by_rank(g.ranks.size());
    std::iota(by_rank.begin(), by_rank.end(), 0);
    std::stable_sort(by_rank.begin(), by_rank.end(), [&](size_t a, size_t b) { return g.ranks[a] < g.ranks[b]; });
    std::vector<int64_t> others;
    for (size_t k = 1; k < by_rank.size(); ++k) others.push_back(g.ranks[by_rank[k]]);
    std::string who = describe_ranks(others);
    if (who.rfind("ranks", 0) != 0) who = "rank " + who;
    line.text = rank_prefix(label, {g.ranks[by_rank[0]]}, hosts) + member_line(g, by_rank[0]) + "  [similar on " +
                who + "]\n";
    size_t shown = std::min(by_rank.size(), kMaxMembers);
    for (size_t k = 0; k < shown; ++k) {
      size_t m = by_rank[k];
      line.members.push_back(rank_prefix(label, {g.ranks[m]}, hosts) + member_line(g, m));
    }
    line.members_left_out = by_rank.size() - shown;
    out.push_back(std::move(line));
  }
  return out;
}

std::string LineAggregator::render(const std::string& label, const RankHosts* hosts) const {
  std::string out;
  for (auto& line : lines(label, hosts)) out += line.text;
  return out;
}

void LineAggregator::clear() {
  groups_.clear();
  index_.clear();
  occurrences_.clear();
}

}  // namespace xmesh
