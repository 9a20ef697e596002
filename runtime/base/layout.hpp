// The runtime directory's layout, defined once. Every path a host agent, a controller, a proc
// or the `xmesh` command uses under a runtime directory comes from here (Python asks through
// `xmesh._core.layout_*`):
//
//   <rundir>/hostd.sock  hostd.pid  hostd.log  hostd.lock  cookie    the host agent
//   <rundir>/p/<alloc>.<rank>  <alloc>.<rank>.lanes                   procs' sockets
//   <rundir>/c/<pid>-<tag>   <rundir>/c/<pid>.debug                   controllers' sockets
//   <rundir>/logs/<name>-<alloc>/ (or <alloc>/) rank<r>.log  procs.json   log files
//   <rundir>/sync/                                                    a controller's scan caches
//   <workspace root>/<space>/                                         synced workspaces
//
// The workspace root is XMESH_WORKSPACE_ROOT or <rundir>/workspace. Each allocation owner has
// a space of its own there, so programs never share a synced tree: a named allocation has
// "n-<name>" (it keeps it across kernel restarts), every other allocation of a controller,
// and that controller's host-mesh syncs, have "c-<controller id>".
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace xmesh::layout {

std::string hostd_socket(const std::string& rundir);
std::string hostd_pid_file(const std::string& rundir);
std::string hostd_log(const std::string& rundir);
std::string hostd_lock_file(const std::string& rundir);
std::string cookie_file(const std::string& rundir);
std::string proc_socket_dir(const std::string& rundir);
std::string proc_address(const std::string& rundir, const std::string& alloc, int64_t rank);
// Where a proc behind its agent's port takes its TCP lanes' connections handed over (a path).
std::string lane_handover_socket(const std::string& rundir, const std::string& alloc, int64_t rank);
std::string controller_dir(const std::string& rundir);
std::string logs_root(const std::string& rundir);
std::string log_dir(const std::string& rundir, const std::string& name, const std::string& alloc);
// In a log directory: one rank's records (log_record.hpp), rotated into <file>.1 (newest) ...
// <file>.N, and procs.json (the allocation, its host, and each rank's pid and coordinates).
std::string rank_log_file(const std::string& logdir, int64_t rank);
std::string procs_meta_file(const std::string& logdir);
// The rank and rotation (0: the live file) of a file name in a log directory, if it is one.
std::optional<std::pair<int64_t, int>> rank_log_of(const std::string& filename);
std::string sync_cache_dir(const std::string& rundir);
std::string workspace_root(const std::string& rundir);  // XMESH_WORKSPACE_ROOT wins

// The workspace space of a named allocation ("n-..."), or of a controller's unnamed ones and
// its host-mesh syncs ("c-..."). Safe as one path component whatever the name holds.
std::string named_space(const std::string& name);
std::string controller_space(const std::string& controller_id);
// Whether s is a space name this layout makes (what an agent may remove).
bool is_space(const std::string& s);

}  // namespace xmesh::layout
