// The floor for actor round trips: two processes bouncing a small message over ZeroMQ ipc
// (REQ/REP, blocking receives, no extra threads of ours).
//   zmq_pingpong serve ADDR         answers until it receives "stop"
//   zmq_pingpong ping ADDR N        prints N round-trip times in microseconds, one per line
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <zmq.hpp>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: zmq_pingpong serve ADDR | ping ADDR N\n");
    return 2;
  }
  std::string mode = argv[1], addr = argv[2];
  zmq::context_t ctx(1);
  if (mode == "serve") {
    zmq::socket_t s(ctx, zmq::socket_type::rep);
    s.bind(addr);
    while (true) {
      zmq::message_t m;
      if (!s.recv(m)) continue;
      bool stop = m.to_string() == "stop";
      s.send(m, zmq::send_flags::none);
      if (stop) return 0;
    }
  }
  int n = argc > 3 ? std::atoi(argv[3]) : 1000;
  zmq::socket_t s(ctx, zmq::socket_type::req);
  s.set(zmq::sockopt::linger, 0);
  s.connect(addr);
  for (int i = 0; i < n + 100; ++i) {  // the first 100 warm up
    auto t0 = std::chrono::steady_clock::now();
    zmq::message_t m("ping", 4);
    s.send(m, zmq::send_flags::none);
    zmq::message_t r;
    (void)s.recv(r);
    auto us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 100) std::printf("%.1f\n", us);
  }
  zmq::message_t stop("stop", 4);
  s.send(stop, zmq::send_flags::none);
  zmq::message_t r;
  (void)s.recv(r);
  return 0;
}
