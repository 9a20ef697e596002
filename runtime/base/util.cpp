#include "util.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <sys/random.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "spin.hpp"
#include "unique_fd.hpp"
#include <stdexcept>

namespace xmesh {

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0') return fallback;
  return x;
}

std::string env_str(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

double wall_time() {
  using namespace std::chrono;
  return duration_cast<duration<double>>(system_clock::now().time_since_epoch()).count();
}

namespace {
void random_fill(char* out, size_t nbytes) {
  size_t got = 0;
  while (got < nbytes) {
    ssize_t n = getrandom(out + got, nbytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("getrandom failed: ") + std::strerror(errno));
    }
    got += static_cast<size_t>(n);
  }
}
}  // namespace

std::string random_bytes(size_t nbytes) {
  std::string raw(nbytes, '\0');
  random_fill(raw.data(), nbytes);
  return raw;
}

std::string random_hex(size_t nbytes) { return to_hex(random_bytes(nbytes)); }

uint64_t random_token() {
  uint64_t t = 0;
  while (t == 0) random_fill(reinterpret_cast<char*>(&t), sizeof t);
  return t;
}

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

bool from_hex(const std::string& text, std::string* bytes) {
  if (text.size() % 2) return false;
  auto digit = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  std::string out;
  out.reserve(text.size() / 2);
  for (size_t i = 0; i < text.size(); i += 2) {
    int hi = digit(text[i]), lo = digit(text[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  *bytes = std::move(out);
  return true;
}

std::string hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

const std::string& host_key() {
  static const std::string key = [] {
    struct stat st {};
    const std::string pidns = stat("/proc/self/ns/pid", &st) == 0 ? std::to_string(st.st_ino) : "?";
    std::string boot;
    read_file("/proc/sys/kernel/random/boot_id", boot);
    while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) boot.pop_back();
    return hostname() + "|" + boot + "|" + pidns;
  }();
  return key;
}

void make_dirs(const std::string& path, unsigned mode) {
  if (path.empty()) return;
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  if (path[0] == '/') cur = "";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += "/" + part;
    if (mkdir(cur.c_str(), mode) != 0 && errno != EEXIST)
      throw std::runtime_error("cannot create directory " + cur + ": " + std::strerror(errno));
  }
}

void check_private_dir(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0)
    throw std::runtime_error("runtime directory " + path + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) throw std::runtime_error("runtime directory " + path + " is not a directory");
  if (st.st_uid != geteuid()) {
    struct passwd* pw = getpwuid(st.st_uid);
    throw std::runtime_error("runtime directory " + path + " belongs to another user (" +
                             (pw ? pw->pw_name : std::to_string(st.st_uid)) +
                             "); set XMESH_RUNTIME_DIR to a directory of your own");
  }
  if (st.st_mode & 077) {
    if (chmod(path.c_str(), 0700) != 0)
      throw std::runtime_error("runtime directory " + path + " is open to other users and cannot be fixed: " +
                               std::strerror(errno));
  }
}

std::string runtime_dir() {
  std::string dir = env_str("XMESH_RUNTIME_DIR");
  if (dir.empty()) {
    std::string xdg = env_str("XDG_RUNTIME_DIR");
    if (!xdg.empty()) {
      dir = xdg + "/xmesh";
    } else {
      std::string home = env_str("HOME");
      if (home.empty()) {
        struct passwd* pw = getpwuid(geteuid());
        home = pw ? pw->pw_dir : "/tmp";
      }
      dir = home + "/.local/state/xmesh/run";
    }
  }
  make_dirs(dir, 0700);
  check_private_dir(dir);
  return dir;
}

bool read_file(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

void write_file_atomic(const std::string& path, const std::string& data, unsigned mode) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  unique_fd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
  if (!fd) throw std::runtime_error("cannot write " + tmp + ": " + std::strerror(errno));
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = write(fd.get(), data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("cannot write " + tmp + ": " + std::strerror(errno));
    }
    off += static_cast<size_t>(n);
  }
  fchmod(fd.get(), mode);
  fd.reset();
  if (rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error("cannot rename " + tmp + ": " + std::strerror(errno));
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  if (abbrev) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

void log_diag(const std::string& who, const std::string& text) {
  std::string line = "[xmesh " + who + "] " + text + "\n";
  ssize_t ignored = write(2, line.data(), line.size());
  (void)ignored;
}

void raise_fd_limit() {
  static std::once_flag once;
  std::call_once(once, [] {
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
  });
}

std::string fd_shortage(size_t spare) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return "";
  size_t open = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d)) ++open;
    closedir(d);
  }
  if (open + spare <= rl.rlim_cur) return "";
  return std::to_string(open) + " of its " + std::to_string(rl.rlim_cur) + " file descriptors are open";
}

bool LogBudget::take(uint64_t* held_back) {
  std::lock_guard<std::mutex> g(mu_);
  int64_t now = now_ms();
  if (window_start_ == 0 || now - window_start_ >= window_ms_) {
    window_start_ = now;
    used_ = 0;
  }
  if (used_ >= per_window_) {
    ++held_back_;
    return false;
  }
  ++used_;
  *held_back = held_back_;
  held_back_ = 0;
  return true;
}

void log_diag_limited(LogBudget& budget, const std::string& who, const std::string& text) {
  uint64_t held_back = 0;
  if (!budget.take(&held_back)) return;
  log_diag(who, held_back ? text + " (" + std::to_string(held_back) + " more like it were not shown)" : text);
}

std::string format_bytes(uint64_t n) {
  char buf[32];
  if (n >= (uint64_t(1) << 30))
    snprintf(buf, sizeof(buf), "%.1f GiB", n / 1073741824.0);
  else if (n >= (1u << 20))
    snprintf(buf, sizeof(buf), "%.1f MiB", n / 1048576.0);
  else if (n >= 1024)
    snprintf(buf, sizeof(buf), "%.1f KiB", n / 1024.0);
  else
    snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(n));
  return buf;
}

SignalsBlocked::SignalsBlocked() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, &old_);
}

SignalsBlocked::~SignalsBlocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

}  // namespace xmesh
