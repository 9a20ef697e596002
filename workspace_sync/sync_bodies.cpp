// The checks of the bodies in sync_bodies.hpp whose fields' types do not say everything.
#include "sync_bodies.hpp"

namespace xmesh {

void SyncStepBody::check() const {
  if (op != "begin" && op != "plan" && op != "data" && op != "commit" && op != "abort")
    refuse_body(what, "unknown step '" + op + "'");
}

}  // namespace xmesh
