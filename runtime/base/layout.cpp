#include "layout.hpp"

#include <cstdint>
#include <cstdio>

#include "util.hpp"

namespace xmesh::layout {

std::string hostd_socket(const std::string& rundir) { return rundir + "/hostd.sock"; }
std::string hostd_pid_file(const std::string& rundir) { return rundir + "/hostd.pid"; }
std::string hostd_log(const std::string& rundir) { return rundir + "/hostd.log"; }
std::string hostd_lock_file(const std::string& rundir) { return rundir + "/hostd.lock"; }
std::string cookie_file(const std::string& rundir) { return rundir + "/cookie"; }
std::string proc_socket_dir(const std::string& rundir) { return rundir + "/p"; }
std::string proc_address(const std::string& rundir, const std::string& alloc, int64_t rank) {
  return "ipc://" + proc_socket_dir(rundir) + "/" + alloc + "." + std::to_string(rank);
}
std::string lane_handover_socket(const std::string& rundir, const std::string& alloc, int64_t rank) {
  return proc_socket_dir(rundir) + "/" + alloc + "." + std::to_string(rank) + ".lanes";
}
std::string controller_dir(const std::string& rundir) { return rundir + "/c"; }
std::string logs_root(const std::string& rundir) { return rundir + "/logs"; }
std::string log_dir(const std::string& rundir, const std::string& name, const std::string& alloc) {
  return logs_root(rundir) + "/" + (name.empty() ? alloc : name + "-" + alloc);
}
std::string rank_log_file(const std::string& logdir, int64_t rank) {
  return logdir + "/rank" + std::to_string(rank) + ".log";
}

std::string procs_meta_file(const std::string& logdir) { return logdir + "/procs.json"; }

std::optional<std::pair<int64_t, int>> rank_log_of(const std::string& filename) {
  // rank<digits>.log or rank<digits>.log.<digits>
  auto digits = [](const std::string& s, size_t from, size_t to) {
    if (from >= to || to - from > 9) return false;
    for (size_t i = from; i < to; ++i)
      if (s[i] < '0' || s[i] > '9') return false;
    return true;
  };
  if (filename.rfind("rank", 0) != 0) return std::nullopt;
  size_t dot = filename.find(".log", 4);
  if (dot == std::string::npos || !digits(filename, 4, dot)) return std::nullopt;
  int64_t rank = std::stoll(filename.substr(4, dot - 4));
  size_t after = dot + 4;
  if (after == filename.size()) return std::make_pair(rank, 0);
  if (filename[after] != '.' || !digits(filename, after + 1, filename.size())) return std::nullopt;
  return std::make_pair(rank, std::stoi(filename.substr(after + 1)));
}

std::string sync_cache_dir(const std::string& rundir) { return rundir + "/sync"; }
std::string workspace_root(const std::string& rundir) {
  std::string root = env_str("XMESH_WORKSPACE_ROOT");
  return root.empty() ? rundir + "/workspace" : root;
}

namespace {
uint64_t fnv1a(const std::string& s) {  // stable across builds (names outlive processes)
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// One path component from any text: safe characters kept; anything else (or a long name)
// replaced and the whole name's hash appended, so two names never meet in one space.
std::string component(const std::string& prefix, const std::string& text) {
  std::string out;
  bool changed = text.empty() || text.size() > 64 || text[0] == '.';
  for (char ch : text.substr(0, 64)) {
    bool safe = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
                ch == '_' || ch == '.';
    out += safe ? ch : '_';
    changed = changed || !safe;
  }
  if (changed) {
    char h[20];
    snprintf(h, sizeof(h), "~%016llx", static_cast<unsigned long long>(fnv1a(text)));
    out += h;
  }
  return prefix + out;
}
}  // namespace

std::string named_space(const std::string& name) { return component("n-", name); }
std::string controller_space(const std::string& controller_id) { return component("c-", controller_id); }

bool is_space(const std::string& s) {
  return s.size() > 2 && (s.compare(0, 2, "n-") == 0 || s.compare(0, 2, "c-") == 0) &&
         s.find('/') == std::string::npos;
}

}  // namespace xmesh::layout
