// The host agent's fork servers (issue 23): a proc whose command line is the worker's
// (`PYTHON -m xmesh._proc.worker`) is forked from a Python that imported xmesh once
// (python/xmesh/_proc/forkserver.py) instead of started from nothing, which saves Python's start-up
// and xmesh's imports, most of a proc's start. One fork server per distinct (command, working
// directory, environment outside XMESH_* of the spawn request): what an import could depend on;
// XMESH_* and each rank's own variables are set in the proc after the fork (no module of xmesh
// reads them at import). A proc forked so is reparented to the agent (a child subreaper) and
// is waited for, piped and logged like any other.
#pragma once
#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "unique_fd.hpp"
#include "process.hpp"

namespace xmesh {

class ForkServer {
 public:
  // Starts `python -m xmesh._proc.worker --fork-server` (python/xmesh/_proc/forkserver.py) with the part of
  // the environment that imports can read.
  ForkServer(const std::string& python, const std::map<std::string, std::string>& env, const std::string& cwd);
  ~ForkServer();  // closing its socket ends it
  ForkServer(const ForkServer&) = delete;
  ForkServer& operator=(const ForkServer&) = delete;

  // A proc forked with this environment and directory; throws std::runtime_error naming why
  // it could not (the server is broken then: `usable()` turns false).
  SpawnedProc spawn(const std::map<std::string, std::string>& env, const std::string& cwd);
  bool usable() const { return bool(sock_); }
  pid_t pid() const { return pid_; }

 private:
  void fail();
  void await_answer();  // throws naming why the server cannot answer
  pid_t pid_ = -1;
  unique_fd sock_;  // the agent's end of the socket pair; the server has the other as fd 3
};

class ForkServers {
 public:
  // Whether a proc with this command line is one a fork server can start (the worker's).
  static bool serves(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);
  // The proc, forked by the fork server for its command, directory and its request's
  // environment (`shared_env`: what its allocation's procs have in common; started first where
  // there is none yet), then given its own `env`. Throws naming why it could not; the caller
  // then starts the proc itself.
  SpawnedProc spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& shared_env,
                    const std::map<std::string, std::string>& env, const std::string& cwd);
  size_t size() const { return servers_.size(); }

 private:
  static constexpr size_t kMaxServers = 4;  // a few controllers' worth; the oldest goes first
  std::map<std::string, std::unique_ptr<ForkServer>> servers_;
  std::vector<std::string> order_;  // keys, least recently used first
};

}  // namespace xmesh
