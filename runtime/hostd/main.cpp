// xmesh-hostd: the per-user host agent. Pure C++, no Python.
//   xmesh-hostd [--daemon] [--runtime-dir DIR]
//               [--listen tcp://ADDR:PORT --key-file FILE [--advertise HOST:PORT] [--ports FIRST-LAST]]
// With --daemon it detaches (fork, setsid, fork) before creating any ZeroMQ context, so a
// kernel's Ctrl-C or restart (signals to its whole process group) never reaches it. One
// agent per runtime directory: a second one exits at once (the lock is held).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>

#include "keys.hpp"
#include "layout.hpp"
#include "util.hpp"
#include "wire.hpp"
#include "host_agent.hpp"

namespace {

double env_seconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  return (end && *end == '\0' && x >= 0) ? x : fallback;
}

std::string absolute(const std::string& path) {
  char buf[4096];
  return path.empty() || path[0] == '/' || !getcwd(buf, sizeof buf) ? path : std::string(buf) + "/" + path;
}

void usage() {
  std::cerr << "usage: xmesh-hostd [--daemon] [--runtime-dir DIR]\n"
               "                   [--listen tcp://ADDR:PORT --key-file FILE [--advertise HOST:PORT] [--ports A-B]]\n"
               "  Runs the xmesh host agent for this user. Normally started by xmesh itself; with\n"
               "  --listen it also serves controllers on other machines holding the key file (written\n"
               "  by `xmesh keygen FILE`), in the foreground unless --daemon (systemd, srun). Its procs\n"
               "  for those controllers are reached through that one port (the agent relays to them),\n"
               "  or, with --ports A-B, listen on ports of that range, reached directly (one hop less;\n"
               "  a second port of the range, while it has ports to spare, takes their TCP lanes);\n"
               "  --advertise says where controllers reach it when that is not ADDR:PORT (NAT).\n"
               "  environment: XMESH_RUNTIME_DIR, XMESH_HOSTD_IDLE (s), XMESH_ORPHAN_GRACE (s),\n"
               "  XMESH_STOP_GRACE_MS, XMESH_HEARTBEAT_MS, XMESH_LOG_MAX_BYTES,\n"
               "  XMESH_LOG_KEEP (rotated log files kept per rank), XMESH_WORKSPACE_ROOT (synced\n"
               "  workspaces; default RUNTIME_DIR/workspace), XMESH_SYNC_TIMEOUT_MS\n";
}

// " (pid N)" from a pid file, or "" while it is not written yet (the other agent is starting).
// The lock of the runtime directory. A controller starts an agent only when the previous one is
// gone, but a killed agent's lock outlives it until the kernel has torn the process down (and
// its procs, which die with it): wait a little for that rather than fail the start.
bool take_lock(int fd) {
  for (int i = 0; i < 150; ++i) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
    if (errno != EWOULDBLOCK && errno != EINTR) return false;
    usleep(20000);
  }
  return false;
}

std::string read_pid(const std::string& path) {
  std::string text;
  if (!xmesh::read_file(path, text)) return "";
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text.empty() ? "" : " (pid " + text + ")";
}

// Why this agent did not start, for a daemon whose stderr is /dev/null: at the end of
// hostd.log, where a controller that waits for the agent looks when it gives up.
void log_not_started(const std::string& dir, const std::string& why) {
  int fd = open(xmesh::layout::hostd_log(dir).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return;
  std::string line = "[xmesh hostd] pid " + std::to_string(getpid()) + " not started: " + why + "\n";
  ssize_t n = write(fd, line.data(), line.size());
  (void)n;
  close(fd);
}

void daemonize(const std::string& logfile) {
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    exit(1);
  }
  if (pid > 0) _exit(0);
  setsid();
  pid = fork();
  if (pid < 0) _exit(1);
  if (pid > 0) _exit(0);
  if (chdir("/") != 0) _exit(1);
  int devnull = open("/dev/null", O_RDWR);
  int log = open(logfile.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  dup2(devnull, 0);
  dup2(devnull, 1);
  dup2(log >= 0 ? log : devnull, 2);
  if (devnull > 2) close(devnull);
  if (log > 2) close(log);
}

// The command line into o (and *daemon, *dir): an exit code when the program ends here
// (--version, a bad argument), else nullopt.
std::optional<int> parse_args(int argc, char** argv, xmesh::HostAgentOptions& o, bool* daemon, std::string* dir) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--daemon") {
      *daemon = true;
    } else if (a == "--runtime-dir" && i + 1 < argc) {
      *dir = argv[++i];
    } else if (a == "--listen" && i + 1 < argc) {
      o.listen = argv[++i];
      if (o.listen.rfind("tcp://", 0) != 0) o.listen = "tcp://" + o.listen;
    } else if (a == "--key-file" && i + 1 < argc) {
      o.key_file = argv[++i];
    } else if (a == "--advertise" && i + 1 < argc) {
      o.advertise = argv[++i];
    } else if (a == "--ports" && i + 1 < argc) {
      std::string range = argv[++i];
      auto dash = range.find('-');
      try {
        o.proc_port_first = std::stoi(range.substr(0, dash));
        o.proc_port_last = dash == std::string::npos ? o.proc_port_first : std::stoi(range.substr(dash + 1));
      } catch (const std::exception&) {
        std::cerr << "xmesh-hostd: --ports needs FIRST-LAST, got '" << range << "'\n";
        return 2;
      }
    } else if (a == "--version") {
      std::cout << "xmesh-hostd " << xmesh::version_string() << " (protocol " << xmesh::protocol_version()
                << ", build " << xmesh::build_id() << ")\n";
      return 0;
    } else {
      usage();
      return 2;
    }
  }
  return std::nullopt;
}

// The agent's knobs from the environment (relative paths against cwd).
void options_from_env(xmesh::HostAgentOptions& o, const std::string& dir, const std::string& cwd) {
  o.runtime_dir = dir;
  o.idle_timeout_s = env_seconds("XMESH_HOSTD_IDLE", 300);
  o.orphan_grace_s = env_seconds("XMESH_ORPHAN_GRACE", 60);
  o.stop_grace_ms = xmesh::env_int("XMESH_STOP_GRACE_MS", 3000);
  o.log_max_bytes = xmesh::env_int("XMESH_LOG_MAX_BYTES", 64 << 20);
  o.log_keep = static_cast<int>(xmesh::env_int("XMESH_LOG_KEEP", 3));
  o.controller_timeout_ms = xmesh::env_int("XMESH_HOSTD_TIMEOUT_MS", 4000);
  if (const char* w = std::getenv("XMESH_WORKSPACE_ROOT")) o.workspace_root = w;
  if (!o.workspace_root.empty() && o.workspace_root[0] != '/') o.workspace_root = cwd + "/" + o.workspace_root;
  o.sync_timeout_ms = xmesh::env_int("XMESH_SYNC_TIMEOUT_MS", 120000);
  o.socket_sweep_ms = xmesh::env_int("XMESH_SOCKET_SWEEP_MS", 30000);
  o.workspace_keep_ms = xmesh::env_int("XMESH_WORKSPACE_KEEP", 600) * 1000;
  o.python = xmesh::env_str("XMESH_PYTHON");
  o.python_version = xmesh::env_str("XMESH_PYTHON_VERSION");
}

}  // namespace

int main(int argc, char** argv) {
  bool daemon = false;
  std::string dir;
  xmesh::HostAgentOptions o;
  if (auto done = parse_args(argc, argv, o, &daemon, &dir)) return *done;
  try {
    xmesh::check_tcp_options(o);
    if (!o.key_file.empty()) {
      o.key_file = absolute(o.key_file);
      xmesh::read_key_file(o.key_file);  // a bad key file is said here, in the foreground
    }
    if (!dir.empty()) setenv("XMESH_RUNTIME_DIR", dir.c_str(), 1);
    dir = xmesh::runtime_dir();
  } catch (const std::exception& e) {
    std::cerr << "xmesh-hostd: " << e.what() << "\n";
    if (daemon && !dir.empty()) log_not_started(dir, e.what());
    return 1;
  }
  umask(077);
  // One agent per runtime directory.
  std::string lockpath = xmesh::layout::hostd_lock_file(dir);
  int lockfd = open(lockpath.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lockfd < 0 || !take_lock(lockfd)) {
    std::string text = lockfd < 0 ? "cannot open " + lockpath + ": " + strerror(errno)
                                  : "another host agent" + read_pid(xmesh::layout::hostd_pid_file(dir)) + " holds " + lockpath;
    std::cerr << "xmesh-hostd: " << text << "\n";
    if (daemon) log_not_started(dir, text);
    return 0;
  }
  char cwd_buf[4096];
  std::string cwd = getcwd(cwd_buf, sizeof(cwd_buf)) ? cwd_buf : "/";
  if (daemon) daemonize(xmesh::layout::hostd_log(dir));
  std::string pidline = std::to_string(getpid()) + "\n";
  xmesh::write_file_atomic(xmesh::layout::hostd_pid_file(dir), pidline, 0600);
  try {
    options_from_env(o, dir, cwd);
    xmesh::HostAgent agent(o);
    xmesh::log_diag("hostd", "pid " + std::to_string(getpid()) + " serving " + agent.addr() +
                                 (o.listen.empty() ? "" : " and " + agent.tcp_addr()));
    int rc = agent.run();
    unlink(xmesh::layout::hostd_pid_file(dir).c_str());
    return rc;
  } catch (const std::exception& e) {
    xmesh::log_diag("hostd", std::string("fatal: ") + e.what());
    return 1;
  }
}
