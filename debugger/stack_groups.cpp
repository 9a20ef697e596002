#include "stack_groups.hpp"

#include <algorithm>
#include <map>
#include <sstream>

namespace xmesh {

std::vector<ThreadStack> parse_thread_dump(const std::string& text) {
  std::vector<ThreadStack> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    bool current = line.rfind("Current thread 0x", 0) == 0;
    if (current || line.rfind("Thread 0x", 0) == 0) {
      ThreadStack t;
      t.current = current;
      size_t hex = line.find("0x");
      t.ident = std::stoull(line.substr(hex + 2, line.find(' ', hex) - hex - 2), nullptr, 16);
      out.push_back(std::move(t));
      continue;
    }
    // '  File "name", line N in function'; the name itself may contain quotes.
    const std::string lead = "  File \"";
    if (out.empty() || line.rfind(lead, 0) != 0) continue;
    size_t mid = line.rfind("\", line ");
    if (mid == std::string::npos || mid < lead.size()) continue;
    size_t in_pos = line.find(" in ", mid + 8);
    if (in_pos == std::string::npos) continue;
    StackFrame f;
    f.file = line.substr(lead.size(), mid - lead.size());
    try {
      f.line = std::stoll(line.substr(mid + 8, in_pos - mid - 8));
    } catch (const std::exception&) {
      f.line = 0;  // "line ???" for a frame without line information
    }
    f.function = line.substr(in_pos + 4);
    out.back().frames.push_back(std::move(f));
  }
  for (auto& t : out) std::reverse(t.frames.begin(), t.frames.end());  // dumps are innermost first
  return out;
}

std::vector<StackGroup> group_stacks(const std::vector<RankStack>& stacks) {
  std::vector<StackGroup> groups;
  for (const auto& s : stacks) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const StackGroup& g) { return g.state == s.state && g.frames == s.frames; });
    if (it == groups.end()) {
      groups.push_back({s.state, s.frames, {s.rank}});
    } else {
      it->ranks.push_back(s.rank);
    }
  }
  for (auto& g : groups) std::sort(g.ranks.begin(), g.ranks.end());
  std::stable_sort(groups.begin(), groups.end(), [](const StackGroup& a, const StackGroup& b) {
    if (a.ranks.size() != b.ranks.size()) return a.ranks.size() > b.ranks.size();
    return a.ranks.front() < b.ranks.front();
  });
  return groups;
}

}  // namespace xmesh
