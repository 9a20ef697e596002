// Passing open files between processes of one host over unix sockets (SCM_RIGHTS): the host
// agent hands a proc its pipe ends through the fork server (hostd/fork_server.cpp) and a lane's
// accepted TCP connection through the proc's hand-over socket (port_mux.hpp, tcp_lane.hpp).
#pragma once
#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

namespace xmesh {

// Sends `data` with `fds` attached in one message: on a connected socket, or (to_path not
// empty) as a datagram to the unix socket bound at to_path. Returns what sendmsg returned
// (errno set on -1; a path too long for a unix address is -1 with ENAMETOOLONG).
ssize_t send_with_fds(int sock, std::string_view data, const std::vector<int>& fds, const std::string& to_path = "",
                      int flags = 0);

// Receives one message into data[0..cap) with at most one file attached: *fd is the file
// (close-on-exec) or -1 when none came; files beyond the first, and the file of a message cut
// short (MSG_TRUNC), are closed. Returns what recvmsg returned.
ssize_t recv_with_fd(int sock, char* data, size_t cap, int* fd, int flags = 0);

// A non-blocking unix datagram socket bound at path (a file left there before is replaced).
// Throws std::runtime_error naming the path and why.
int bind_unix_datagram(const std::string& path);

}  // namespace xmesh
