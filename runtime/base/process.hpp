// Starting processes without fork(). A proc from the host agent: posix_spawn (vfork-based in glibc, safe in a process
// that already runs ZeroMQ threads), a fresh process group, the signal mask and every
// disposition reset, stdin from /dev/null, stdout and stderr into pipes the agent reads.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace xmesh {

struct SpawnedProc {
  pid_t pid = -1;
  int out_fd = -1;  // read ends, non-blocking, close-on-exec
  int err_fd = -1;
};

// A proc's stdout and stderr pipes (close-on-exec): the write ends for the proc, the read ends
// for the agent. What is still open when it goes is closed.
struct ProcPipes {
  int out[2] = {-1, -1};
  int err[2] = {-1, -1};
  ProcPipes();  // throws naming the reason
  ~ProcPipes();
  ProcPipes(const ProcPipes&) = delete;
  ProcPipes& operator=(const ProcPipes&) = delete;
  // The proc `pid` has its copies of the write ends: these are closed here and the read ends
  // (non-blocking) handed over.
  SpawnedProc started(pid_t pid);
};

// Throws std::runtime_error naming the program and the reason when it cannot start.
SpawnedProc spawn_proc(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                       const std::string& cwd);

// Starts a helper program (signals reset, stdin on /dev/null, stdout and stderr inherited) with
// `channel` as its fd 3 and in `cwd`. Returns its pid; throws naming the reason on failure.
pid_t spawn_with_channel(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                         const std::string& cwd, int channel);

// Starts a program in a new session (setsid) with signals reset and stdio on /dev/null, for
// daemons such as xmesh-hostd started by a controller. Returns its pid; throws on failure.
pid_t spawn_detached(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);

// Asks the kernel to send sig to this process when its parent dies, then checks the parent
// is still expected_parent (it may have died before the request). Returns false if not.
bool set_parent_death_signal(int sig, pid_t expected_parent);

// What /proc says of a process: its state letter ('R', 'S', 'D' in the kernel, 'T' stopped...)
// and its start time, which tells it from a later process given the same pid.
struct ProcessStatus {
  char state = 0;
  uint64_t start_ticks = 0;
  uint64_t cpu_ticks = 0;  // user and system time so far, in clock ticks
  bool stopped() const { return state == 'T' || state == 't'; }
  // What is unusual about it, in a word or two: "stopped", "in the kernel"; "" when running.
  std::string unusual() const;
};
// nullopt: no such process, or one that has exited (a zombie). A thread's id works too.
std::optional<ProcessStatus> process_status(pid_t pid);

}  // namespace xmesh
