// The checks of the bodies in debug_bodies.hpp whose fields' types do not say everything.
#include "debug_bodies.hpp"

namespace xmesh {

void DebugEventBody::check() const {
  if (ev != "prompt" && ev != "running" && ev != "ended" && ev != "sources" && ev != "pause")
    refuse_body(what, "'ev' is " + ev);
}

}  // namespace xmesh
