// Small helpers shared by every xmesh process: environment knobs, ids, clocks, paths.
#pragma once
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace xmesh {

// Integer environment knob with a default; a malformed value falls back to the default.
int64_t env_int(const char* name, int64_t fallback);
std::string env_str(const char* name, const std::string& fallback = "");

// Milliseconds on a monotonic clock.
int64_t now_ms();
// Seconds since the epoch, as a double (for log records and ages).
double wall_time();

// While it lives, the calling thread blocks SIGINT; its old mask comes back after.
class SignalsBlocked {
 public:
  SignalsBlocked();
  ~SignalsBlocked();
  SignalsBlocked(const SignalsBlocked&) = delete;
  SignalsBlocked& operator=(const SignalsBlocked&) = delete;

 private:
  sigset_t old_;
};

// A thread of the runtime: it starts with SIGINT blocked, so the kernel delivers a
// process-directed one to a thread that takes it (a Python program's main thread: its input(),
// the debugger's prompt, is cut short by Ctrl-C only when the signal lands there). Only SIGINT,
// and only threads that run no user code: a child process inherits its parent thread's mask
// (Python's subprocess does not reset it; runtime/base/process.cpp's spawns do).
template <class F>
std::thread runtime_thread(F&& fn) {
  SignalsBlocked blocked;  // the new thread inherits the mask
  return std::thread(std::forward<F>(fn));
}

// Hex string of n random bytes from the kernel's CSPRNG.
std::string random_hex(size_t nbytes);
std::string random_bytes(size_t nbytes);  // keys and tokens
uint64_t random_token();  // a random number, never 0 (names that must not be guessed)
std::string to_hex(const std::string& bytes);  // lowercase, two digits a byte
bool from_hex(const std::string& text, std::string* bytes);  // false (bytes untouched) when not hex
std::string hostname();
// Which machine and which process namespace this process is in: two processes with the same key
// may copy each other's memory by pid. Namespace "hosts" of one machine (their own UTS names)
// differ, as real hosts do. "hostname|boot id|pid namespace".
const std::string& host_key();

// The per-user runtime directory (XMESH_RUNTIME_DIR, else $XDG_RUNTIME_DIR/xmesh, else
// ~/.local/state/xmesh/run), created 0700. Throws std::runtime_error naming the problem when
// the directory exists but belongs to another user or is open to others.
std::string runtime_dir();
// mkdir -p with a mode; throws std::runtime_error on failure.
void make_dirs(const std::string& path, unsigned mode);
// Checks that path is a directory owned by this user with no group/other access.
void check_private_dir(const std::string& path);

// Reads a whole small file; returns false if it does not exist.
bool read_file(const std::string& path, std::string& out);
// Writes a file atomically (temp file + rename) with the given mode.
void write_file_atomic(const std::string& path, const std::string& data, unsigned mode);

// "512 B", "4.0 KiB", "1.5 MiB", "2.0 GiB": the one way sizes are written (Python asks too).
std::string format_bytes(uint64_t n);

// Name of a signal ("SIGKILL"), or "signal N".
std::string signal_name(int sig);

// Raises this process's soft limit on open files to its hard limit (once): a controller keeps a
// connection per proc, an agent two pipes per proc, and 1024 is a common default.
void raise_fd_limit();
// "" while this process has at least `spare` file descriptors left; else what it has and may.
// libzmq aborts when it cannot create a socket's fds: check before creating sockets.
std::string fd_shortage(size_t spare);

// Logs one line to stderr with a prefix naming the process role; used for runtime diagnostics.
void log_diag(const std::string& who, const std::string& text);

// Lets a repeated diagnostic through `per_window` times per window and counts the rest, so
// that a flood of one event (refused connections, say) cannot flood a user's console; the
// count held back is reported with the next line let through. Thread-safe.
class LogBudget {
 public:
  LogBudget(int per_window, int64_t window_ms) : per_window_(per_window), window_ms_(window_ms) {}
  // True when this occurrence may be logged; *held_back: how many were not, before it.
  bool take(uint64_t* held_back);

 private:
  std::mutex mu_;
  int per_window_;
  int64_t window_ms_, window_start_ = 0;
  int used_ = 0;
  uint64_t held_back_ = 0;
};
// log_diag through a budget: "text (N more like it were not shown)".
void log_diag_limited(LogBudget& budget, const std::string& who, const std::string& text);

}  // namespace xmesh
