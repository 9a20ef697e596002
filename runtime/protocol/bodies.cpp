// The bodies' shared machinery that is not a template (bodies.hpp).
#include "bodies.hpp"

namespace xmesh {

void refuse_body(const char* what, const std::string& why) {
  throw std::invalid_argument(std::string(what) + " body: " + why);
}

}  // namespace xmesh
