#include "role.hpp"

#include <stdexcept>

namespace xmesh {

const char* role_name(Role role) {
  switch (role) {
    case Role::controller: return "controller";
    case Role::proc: return "proc";
    case Role::hostd: return "hostd";
  }
  return "unknown";
}

Role parse_role(const std::string& name) {
  for (Role r : {Role::controller, Role::proc, Role::hostd})
    if (name == role_name(r)) return r;
  throw std::invalid_argument("unknown node role '" + name + "': a node is a controller, a proc or a hostd");
}

}  // namespace xmesh
