// The checks of the bodies in output_bodies.hpp whose fields' types do not say everything.
#include "output_bodies.hpp"

namespace xmesh {

void LogBody::check() const {
  if (stream != "stdout" && stream != "stderr") refuse_body(what, "'stream' is " + stream);
}

}  // namespace xmesh
