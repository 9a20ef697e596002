#include "fd_passing.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "util.hpp"

namespace xmesh {

namespace {
constexpr size_t kMaxFds = 4;  // the most one message of ours carries

bool unix_address(const std::string& path, sockaddr_un* sa) {
  if (path.size() >= sizeof sa->sun_path) return false;
  std::memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  std::memcpy(sa->sun_path, path.data(), path.size());
  return true;
}
}  // namespace

ssize_t send_with_fds(int sock, std::string_view data, const std::vector<int>& fds, const std::string& to_path,
                      int flags) {
  if (fds.empty() || fds.size() > kMaxFds) {
    errno = EINVAL;
    return -1;
  }
  sockaddr_un to{};
  if (!to_path.empty() && !unix_address(to_path, &to)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  // Linux sends no file with an empty message on a datagram socket: one byte at least.
  char empty = 0;
  iovec iov{data.empty() ? &empty : const_cast<char*>(data.data()), data.empty() ? 1 : data.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))] = {};
  msghdr msg{};
  if (!to_path.empty()) {
    msg.msg_name = &to;
    msg.msg_namelen = sizeof to;
  }
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
  std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  ssize_t w;
  do {
    w = sendmsg(sock, &msg, flags | MSG_NOSIGNAL);
  } while (w < 0 && errno == EINTR);
  return w;
}

ssize_t recv_with_fd(int sock, char* data, size_t cap, int* fd, int flags) {
  *fd = -1;
  iovec iov{data, cap};
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int f;
      std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
      if (*fd < 0 && !(msg.msg_flags & MSG_TRUNC))
        *fd = f;
      else
        ::close(f);
    }
  }
  return n;
}

int bind_unix_datagram(const std::string& path) {
  sockaddr_un sa{};
  if (!unix_address(path, &sa))
    throw std::runtime_error("cannot bind " + path + ": longer than " + std::to_string(sizeof sa.sun_path - 1) + " bytes");
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("cannot bind " + path + ": " + std::strerror(errno));
  ::unlink(path.c_str());
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    int e = errno;
    ::close(fd);
    throw std::runtime_error("cannot bind " + path + ": " + std::strerror(e));
  }
  return fd;
}

}  // namespace xmesh
