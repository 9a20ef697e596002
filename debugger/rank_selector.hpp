// Rank selectors of the debugger's `cast` command (Monarch's grammar):
//   ranks(3)                       one rank
//   ranks(1,4,6)                   several
//   ranks(2:8:2)                   a Python slice over the mesh's ranks
//   ranks(gpus=0:4, hosts=(0,2))   per dimension: an index, a slice or a tuple of indices
// Ranks are the actor mesh's own (0..size-1, row-major over its dimensions). Errors name what
// is wrong (the unknown dimension and the known ones, the index out of range and the valid
// range, the position of a syntax error).
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace xmesh {

struct RankSelectorError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Where the selector that starts at `start` in `line` ends (one past its closing parenthesis).
// Throws if there is no selector there or its parentheses do not close.
size_t rank_selector_end(const std::string& line, size_t start);

// The sorted, distinct ranks a selector ("ranks(...)") picks out of a mesh with these
// dimension labels and sizes.
std::vector<int64_t> select_ranks(const std::string& selector, const std::vector<std::string>& labels,
                                  const std::vector<int64_t>& sizes);

}  // namespace xmesh
