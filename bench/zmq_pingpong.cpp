// The floor for actor round trips: two processes bouncing a small message over ZeroMQ ipc
// (REQ/REP, blocking receives, no extra threads of ours).
//   zmq_pingpong serve ADDR         answers until it receives "stop"
//   zmq_pingpong ping ADDR N        prints N round-trip times in microseconds, one per line
//   zmq_pingpong fanout ADDR K N    K servers at ADDR0..ADDR{K-1} (or ADDR a comma-separated list
//                                   of K addresses): sends to all, then receives from all;
//                                   prints N such times in microseconds
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <zmq.hpp>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: zmq_pingpong serve ADDR | ping ADDR N | fanout ADDR K N\n");
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
  if (mode == "fanout") {
    int k = argc > 3 ? std::atoi(argv[3]) : 16;
    int n = argc > 4 ? std::atoi(argv[4]) : 200;
    std::vector<zmq::socket_t> socks;
    for (int i = 0; i < k; ++i) {
      socks.emplace_back(ctx, zmq::socket_type::req);
      socks.back().set(zmq::sockopt::linger, 0);
    }
    std::vector<std::string> listed;
    for (size_t start = 0, comma; addr.find(',') != std::string::npos && start <= addr.size(); start = comma + 1) {
      comma = addr.find(',', start);
      if (comma == std::string::npos) comma = addr.size();
      listed.push_back(addr.substr(start, comma - start));
    }
    for (int i = 0; i < k; ++i)
      socks[i].connect(listed.empty() ? addr + std::to_string(i) : listed.at(i % listed.size()));
    for (int i = 0; i < n + 20; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      for (auto& s : socks) {
        zmq::message_t m("ping", 4);
        s.send(m, zmq::send_flags::none);
      }
      for (auto& s : socks) {
        zmq::message_t r;
        (void)s.recv(r);
      }
      auto us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (i >= 20) std::printf("%.1f\n", us);
    }
    for (auto& s : socks) {
      zmq::message_t m("stop", 4);
      s.send(m, zmq::send_flags::none);
      zmq::message_t r;
      (void)s.recv(r);
    }
    return 0;
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
