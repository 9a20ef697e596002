// The role of a node: what kind of xmesh process it is. It names the node (ids read
// "<role>-<host>-<pid>-<incarnation>"), goes in Hello, and decides which links it takes.
#pragma once
#include <string>

namespace xmesh {

enum class Role { controller, proc, hostd };

// "controller", "proc", "hostd".
const char* role_name(Role role);
// The role a name gives; std::invalid_argument naming the roles there are, for any other.
Role parse_role(const std::string& name);
// Controllers and procs talk over shared-memory rings and TCP lanes; host agents keep ZeroMQ
// alone (few messages, many short-lived peers).
inline bool takes_fast_links(Role role) { return role != Role::hostd; }

}  // namespace xmesh
