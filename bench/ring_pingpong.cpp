// The same-host floor of issue 23's call path: two processes bouncing a small message over two
// ShmRings (runtime/transport/shm_ring.hpp), one per direction, made by the parent and inherited by the
// child through fork (the runtime hands memfds over with SCM_RIGHTS instead).
//   ring_pingpong N [SIZE]     prints N round-trip times in microseconds, one per line
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "shm_ring.hpp"

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 10000;
  size_t size = argc > 2 ? static_cast<size_t>(std::atol(argv[2])) : 100;
  auto to_child = xmesh::ShmRing::create(1 << 16), to_parent = xmesh::ShmRing::create(1 << 16);
  pid_t pid = fork();
  if (pid == 0) {
    auto in = xmesh::ShmRing::attach(to_child.fd()), out = xmesh::ShmRing::attach(to_parent.fd());
    std::string m;
    while (in.read(m, -1) == xmesh::ShmRing::Result::ok) out.write(m, -1);
    _exit(0);
  }
  std::string message(size, 'x'), got;
  for (int i = 0; i < n + 200; ++i) {  // the first 200: warm-up
    auto t0 = std::chrono::steady_clock::now();
    to_child.write(message, -1);
    to_parent.read(got, -1);
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 200) std::printf("%.2f\n", us);
  }
  to_child.close();
  waitpid(pid, nullptr, 0);
  return 0;
}
