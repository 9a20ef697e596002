// The checks of the bodies in agent_bodies.hpp whose fields' types do not say everything.
#include "agent_bodies.hpp"

namespace xmesh {

void ReadLogBody::check() const {
  if (dir.find('/') != std::string::npos || dir == "." || dir == ".." || (dir.empty() && !file.empty()))
    refuse_body(what, "'dir' must name a log directory");
  if (file.find('/') != std::string::npos) refuse_body(what, "'file' must be a file name");
  if (offset < 0) refuse_body(what, "'offset' is negative");
  if (max_bytes <= 0) refuse_body(what, "'max_bytes' is not positive");
}

void SpawnProcsBody::check() const {
  if (alloc.empty() || alloc.size() > 16 || alloc.find_first_not_of("0123456789abcdef") != std::string::npos)
    refuse_body(what, "'alloc' must be 1-16 lowercase hex digits");
  if (argv.empty()) refuse_body(what, "'argv' is empty");
  if (ranks.empty()) refuse_body(what, "'ranks' must be a non-empty list");
}

void StopProcsBody::check() const {
  if (alloc.empty() && name.empty()) refuse_body(what, "names neither 'alloc' nor 'name'");
}

}  // namespace xmesh
