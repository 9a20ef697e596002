#include "process.hpp"

#include "util.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <stdexcept>

namespace xmesh {

namespace {
// Spawn attributes that give the child an empty signal mask and every signal's default
// disposition (masks and ignored signals survive exec), plus the extra flags.
void init_clean_attr(posix_spawnattr_t& attr, short extra_flags) {
  posix_spawnattr_init(&attr);
  sigset_t empty, all;
  sigemptyset(&empty);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, static_cast<short>(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | extra_flags));
}

// posix_spawnp with clean signals and the file actions given (destroyed here). Throws naming the
// program, `where` it was to start and why.
pid_t spawn_with(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                 posix_spawn_file_actions_t& fa, short flags, const std::string& where) {
  posix_spawnattr_t attr;
  init_clean_attr(attr, flags);
  if (flags & POSIX_SPAWN_SETPGROUP) posix_spawnattr_setpgroup(&attr, 0);
  std::vector<std::string> envs;
  for (auto& kv : env) envs.push_back(kv.first + "=" + kv.second);
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (auto& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, argv[0].c_str(), &fa, &attr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + where + ": " + std::strerror(rc));
  return pid;
}
}  // namespace

ProcPipes::ProcPipes() {
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));  // the destructor closes any made
}

ProcPipes::~ProcPipes() {
  for (int fd : {out[0], out[1], err[0], err[1]})
    if (fd >= 0) close(fd);
}

SpawnedProc ProcPipes::started(pid_t pid) {
  close(out[1]);
  close(err[1]);
  fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
  fcntl(err[0], F_SETFL, fcntl(err[0], F_GETFL) | O_NONBLOCK);
  SpawnedProc sp{pid, out[0], err[0]};
  out[0] = out[1] = err[0] = err[1] = -1;
  return sp;
}

SpawnedProc spawn_proc(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                       const std::string& cwd) {
  if (argv.empty()) throw std::runtime_error("cannot start a proc: empty command line");
  ProcPipes pipes;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, pipes.out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, pipes.err[1], 2);
  if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&fa, cwd.c_str());
  return pipes.started(spawn_with(argv, env, fa, POSIX_SPAWN_SETPGROUP, cwd.empty() ? "" : " in " + cwd));
}

pid_t spawn_with_channel(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                         const std::string& cwd, int channel) {
  if (argv.empty()) throw std::runtime_error("cannot start a helper: empty command line");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, channel, 3);
  if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&fa, cwd.c_str());
  return spawn_with(argv, env, fa, 0, cwd.empty() ? "" : " in " + cwd);
}

pid_t spawn_detached(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  if (argv.empty()) throw std::runtime_error("cannot start a daemon: empty command line");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  // Nothing else of the starter's: a pipe it inherited (a test harness's result pipe, a parent's
  // stdout) held open by a long-lived daemon would keep whoever reads its other end waiting.
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  return spawn_with(argv, env, fa, POSIX_SPAWN_SETSID, "");
}

bool set_parent_death_signal(int sig, pid_t expected_parent) {
  if (prctl(PR_SET_PDEATHSIG, sig) != 0) return false;
  return expected_parent <= 0 || getppid() == expected_parent;
}

std::string ProcessStatus::unusual() const {
  if (stopped()) return "stopped";
  if (state == 'D') return "in the kernel";
  return "";
}

std::optional<ProcessStatus> process_status(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  std::string stat;
  if (!read_file("/proc/" + std::to_string(pid) + "/stat", stat)) return std::nullopt;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so count from the last ')'.
  auto close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::vector<std::string> fields;
  size_t pos = close + 2;
  while (pos < stat.size() && fields.size() < 20) {
    size_t space = stat.find(' ', pos);
    if (space == std::string::npos) space = stat.size();
    fields.push_back(stat.substr(pos, space - pos));
    pos = space + 1;
  }
  if (fields.size() < 20 || fields[0].empty() || fields[0][0] == 'Z' || fields[0][0] == 'X') return std::nullopt;
  ProcessStatus s;
  s.state = fields[0][0];
  s.start_ticks = std::strtoull(fields[19].c_str(), nullptr, 10);  // field 22 of stat
  s.cpu_ticks = std::strtoull(fields[11].c_str(), nullptr, 10) + std::strtoull(fields[12].c_str(), nullptr, 10);
  return s;
}

}  // namespace xmesh
