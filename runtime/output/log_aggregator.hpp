// Aggregation of the lines ranks print within one window (DESIGN §6, issue 46): lines that are
// the same on several ranks become one line with their rank set ("[ranks 0-6,9] epoch 3 done");
// lines that differ only in their numbers become the lowest rank's line as it printed it, with
// which ranks printed one like it ("[0] loss=0.12  [similar on ranks 1-7]"): a summary, never a
// line nobody printed. A rank's own repeated lines are never merged with each other: the k-th
// occurrence of a line shape on one rank only joins the k-th occurrence on the others. A summary
// of lines alike carries its members, each rank's own line as it printed it, for a notebook to
// show when the summary is unfolded.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace xmesh {

// A line with its numbers taken out: key has '\x01' where each number was.
struct LineShape {
  std::string key;
  std::vector<std::string> numbers;
};
LineShape shape_of(std::string_view line);

// "3" for one rank, "ranks 0-6,9" for several (sorted, duplicates removed).
std::string describe_ranks(std::vector<int64_t> ranks);

// Host names by rank, for an allocation whose procs run on more than one host.
using RankHosts = std::map<int64_t, std::string>;

// The "[...] " prefix of a line: "[3] ", "[ranks 0-3] ", with the allocation's label first when
// it has one ("[trainers 3] "); with hosts, the host of ranks that share one ("[3@node-b] ",
// "[ranks 0-3@node-a] ").
std::string rank_prefix(const std::string& label, const std::vector<int64_t>& ranks,
                        const RankHosts* hosts = nullptr);

// One line of an aggregation's output.
struct AggregatedLine {
  std::string text;                  // ends in '\n'
  std::vector<int64_t> ranks;        // the ranks it stands for
  std::vector<std::string> members;  // a summary of lines alike: each rank's line, prefixed as
                                     // its own ("[3] loss=0.13"), by rank, at most kMaxMembers
  size_t members_left_out = 0;       // members past kMaxMembers
};

class LineAggregator {
 public:
  // A summary of thousands of ranks unfolds to its first ones (the log files keep every line).
  static constexpr size_t kMaxMembers = 256;
  // line: without its newline.
  void add(int64_t rank, std::string_view line);
  bool empty() const { return groups_.empty(); }
  size_t groups() const { return groups_.size(); }
  // One line per group, in order of first appearance.
  std::vector<AggregatedLine> lines(const std::string& label, const RankHosts* hosts = nullptr) const;
  // The same lines' text, joined.
  std::string render(const std::string& label, const RankHosts* hosts = nullptr) const;
  void clear();

 private:
  struct Group {
    std::string key;
    std::string first_text;
    bool identical = true;
    std::vector<int64_t> ranks;
    std::vector<std::vector<std::string>> numbers;  // per member, in arrival order
  };
  std::string member_line(const Group& g, size_t member) const;  // that member's line as printed
  std::vector<Group> groups_;
  std::unordered_map<std::string, size_t> index_;  // key + '\0' + occurrence -> group
  std::unordered_map<int64_t, std::unordered_map<std::string, int>> occurrences_;
};

}  // namespace xmesh
