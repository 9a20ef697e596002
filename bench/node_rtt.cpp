// Round trip of Node::call between a controller node and k proc nodes in child processes, each
// answered by a C++ thread (no Python on either side): the runtime's own cost per call, over the
// same-host rings (XMESH_RINGS=0: over ZeroMQ), or with `tcp` over loopback TCP links with CURVE
// (a key file made for the run), as between hosts. Prints one line: k, the median in us, how
// many messages went over rings and over TCP lanes, then the CPU per call (us, every thread, the
// warm-up included) of one proc (the procs' sum / k) and of the controller.
//
//   build/bench/xmesh_bench_node_rtt [k] [calls] [tcp]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "keys.hpp"
#include "node.hpp"

using namespace xmesh;

namespace {
double seconds_us(const timeval& t) { return double(t.tv_sec) * 1e6 + double(t.tv_usec); }

double cpu_us(int who) {
  struct rusage ru {};
  getrusage(who, &ru);
  return seconds_us(ru.ru_utime) + seconds_us(ru.ru_stime);
}

// A proc: answers every call to actor "a" until StopActor. Its address goes to `report` (a pipe).
[[noreturn]] void serve(const std::string& addr, const std::string& key_file, int report) {
  Node proc("proc", addr, "k", key_file);
  proc.transport().cookies().present_by_default("k");
  proc.start();
  std::string bound = proc.addr() + "\n";
  if (write(report, bound.data(), bound.size()) != static_cast<ssize_t>(bound.size())) _exit(1);
  close(report);
  std::shared_ptr<Inbox> inbox;
  while (!(inbox = proc.actors().inbox("a"))) usleep(1000);
  while (auto m = inbox->pop(10000)) {
    if (m->header.kind == Kind::StopActor) break;
    if (m->header.kind == Kind::Call) proc.reply(*m, true, nullptr, {});
  }
  proc.stop();
  _exit(0);
}
}  // namespace

int main(int argc, char** argv) {
  int k = argc > 1 ? std::atoi(argv[1]) : 1;
  int calls = argc > 2 ? std::atoi(argv[2]) : 4000;
  const bool tcp = argc > 3 && std::string(argv[3]) == "tcp";
  std::string base = "ipc:///tmp/xmesh-node-rtt-" + std::to_string(getpid());
  std::string key_file;
  if (tcp) {
    key_file = "/tmp/xmesh-node-rtt-" + std::to_string(getpid()) + ".key";
    write_key_file(key_file, generate_curve_keys(), true);
  }
  std::vector<pid_t> kids;
  std::vector<Target> targets;
  for (int j = 0; j < k; ++j) {
    std::string addr = tcp ? "tcp://127.0.0.1:*" : base + "-p" + std::to_string(j);
    int report[2];
    if (pipe(report) != 0) return 1;
    pid_t pid = fork();  // before any node exists in this process
    if (pid == 0) serve(addr, key_file, report[1]);
    close(report[1]);
    char buf[256];
    ssize_t got = read(report[0], buf, sizeof buf - 1);
    close(report[0]);
    if (got <= 1) return 1;
    kids.push_back(pid);
    targets.push_back(Target{std::string(buf, static_cast<size_t>(got) - 1), "a"});
  }
  Node ctl("controller", tcp ? "tcp://127.0.0.1:*" : base + "-c", "k", key_file);
  ctl.transport().cookies().present_by_default("k");
  ctl.start();
  Header spawn;
  spawn.kind = Kind::SpawnActor;
  ctl.call(targets, spawn, {}, false);
  std::vector<double> us;
  const double ctl_cpu_before = cpu_us(RUSAGE_SELF);
  int warmup = std::max(100, calls / 4);
  for (int i = 0; i < warmup + calls; ++i) {
    Header h;
    h.kind = Kind::Call;
    h.method = "noop";
    auto t0 = std::chrono::steady_clock::now();
    auto c = ctl.call(targets, h, {}, true);
    c->wait_for(false, -1);
    if (i >= warmup) us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  const double ctl_cpu = cpu_us(RUSAGE_SELF) - ctl_cpu_before;
  std::sort(us.begin(), us.end());
  auto st = ctl.stats();
  Header stop;
  stop.kind = Kind::StopActor;
  ctl.call(targets, stop, {}, false);
  double procs_cpu = 0;
  for (pid_t p : kids) {
    struct rusage ru {};
    wait4(p, nullptr, 0, &ru);
    procs_cpu += seconds_us(ru.ru_utime) + seconds_us(ru.ru_stime);
  }
  const int total = warmup + calls;
  std::printf("%d %.1f %llu %llu %.1f %.1f\n", k, us[us.size() / 2], static_cast<unsigned long long>(st.ring_sent),
              static_cast<unsigned long long>(st.lane_sent), procs_cpu / k / total, ctl_cpu / total);
  ctl.stop();
  if (tcp) std::remove(key_file.c_str());
}
