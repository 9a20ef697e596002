// The host agent's procs (host_agent.hpp): a SpawnProcs request's procs started (through the
// fork server where it can), their TCP ports and lane listeners chosen, procs.json written, an
// allocation stopped, children reaped and their exits reported, what dead processes left swept.
#include "host_agent.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "agent_bodies.hpp"
#include "bodies.hpp"
#include "node_bodies.hpp"
#include "output_bodies.hpp"
#include "sync_bodies.hpp"
#include "layout.hpp"
#include "log_record.hpp"
#include "util.hpp"
#include "process.hpp"
#include "tcp_endpoint.hpp"

namespace xmesh {

namespace {
std::string exit_text(int status) {
  if (WIFSIGNALED(status)) return std::string("was killed by ") + signal_name(WTERMSIG(status));
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  return "ended (status " + std::to_string(status) + ")";
}
}  // namespace

void HostAgent::spawn_procs(const Message& m) {
  SpawnProcsBody req;
  if (!read_request(m, req)) return;
  if (allocs_.count(req.alloc)) return reply_error(m, "allocation '" + req.alloc + "' already exists on this host");
  if (LocalAllocation* other = live_named(req.name)) {
    ErrorBody err;
    err.kind = error_kind_name(ErrorKind::NameTaken);
    err.text = "a live allocation named '" + req.name + "' already exists on " + hostname();
    err.shape = other->shape;  // the caller checks it against the shape it asked for
    return node_->reply(m, false, err, {});
  }
  auto a = std::make_unique<LocalAllocation>();
  a->id = req.alloc;
  a->name = req.name;
  a->controller_addr = m.sender_addr;
  a->controller_id = m.header.sender;
  a->controller_pid = req.controller_pid;
  auto cookie = req.env.find("XMESH_JOB_COOKIE");
  if (cookie != req.env.end()) a->job_cookie = cookie->second;
  a->shape = req.shape;
  a->created = wall_time();
  a->space = space_for(m, req.name);
  spaces_[a->space] = now_ms();
  std::string logdir = layout::log_dir(opts_.runtime_dir, req.name, req.alloc);
  try {
    make_dirs(logdir, 0700);
    make_dirs(opts_.workspace_root + "/" + a->space, 0700);
    std::set<int> ports = a->controller_addr.rfind("tcp://", 0) == 0 ? tcp_ports_in_use() : std::set<int>{};
    for (auto& r : req.ranks) a->procs.push_back(start_proc(req, r, *a, logdir, ports));
  } catch (const std::exception& e) {
    const bool no_fds = errno == EMFILE || errno == ENFILE;
    // The procs started so far are killed, and their pipes and log files closed now rather
    // than when they are reaped: a spawn retried at once (after running out of files) needs them.
    for (auto& p : a->procs) {
      kill(-p->pid, SIGKILL);
      for (Stream* st : {&p->out, &p->err}) {
        st->fd.reset();
      }
      if (p->log) fclose(p->log);
      p->log = nullptr;
    }
    std::string why = "cannot start proc " + std::to_string(a->procs.size()) + " of " + std::to_string(req.ranks.size()) +
                      " on " + hostname() + ": " + e.what();
    rlimit rl{};
    if (no_fds && getrlimit(RLIMIT_NOFILE, &rl) == 0)
      why += " (the host agent may open " + std::to_string(rl.rlim_cur) +
             " files, three per proc: raise `ulimit -n` where it starts, or spawn fewer procs per host)";
    a->stopping = true;
    allocs_[req.alloc] = std::move(a);  // reaped and cleaned like any other
    return reply_error(m, why);
  }
  write_procs_meta(*a, logdir);
  SpawnProcsReply reply{a->id, hostname(), {}, logdir};
  for (auto& p : a->procs) reply.procs.push_back(ProcEntry{p->rank, p->pid, p->addr, true, p->coords, "", 0, ""});
  allocs_[req.alloc] = std::move(a);
  node_->reply(m, true, reply, {});
}

// One proc of a SpawnProcs request: its address checked, its environment made, started with its
// pipes and its log file open.
std::unique_ptr<HostAgent::Proc> HostAgent::start_proc(const SpawnProcsBody& req, const SpawnRank& r,
                                                       const LocalAllocation& a, const std::string& logdir,
                                                       std::set<int>& ports_taken) {
  auto p = std::make_unique<Proc>();
  p->rank = r.rank;
  p->coords = r.coords;
  auto env = req.env;
  for (auto& [k, v] : r.env) env[k] = v;
  if (a.controller_addr.rfind("tcp://", 0) == 0) {  // a controller elsewhere: the proc listens on TCP
    if (!r.addr.empty()) throw std::runtime_error("a controller over TCP leaves the procs' addresses to the host agent");
    // A controller this host cannot connect to (back_links.hpp) reaches procs through this agent's
    // port only (its connections for them come there), whatever --ports says; the proc is told
    // its token.
    const std::string back = node_->transport().back_token_for(a.controller_addr);
    if (!back.empty()) env["XMESH_CONTROLLER_BACK"] = back;
    const bool behind = !opts_.proc_port_first || !back.empty();
    p->addr = tcp_proc_address(ports_taken, env, behind);
    p->lane_port = tcp_lane_port(ports_taken, env, static_cast<size_t>(req.ranks.data() + req.ranks.size() - &r - 1),
                                 layout::lane_handover_socket(opts_.runtime_dir, a.id, p->rank), &p->lane_handover,
                                 behind);
    if (!back.empty() && p->lane_handover.empty())
      throw std::runtime_error("the proc's hand-over socket path " +
                               layout::lane_handover_socket(opts_.runtime_dir, a.id, p->rank) +
                               " is longer than 107 bytes, and a controller this host cannot connect to reaches "
                               "its procs through it: use a shorter --runtime-dir");
    // And on a unix socket, where the procs of this host reach it (relays of cast trees).
    env["XMESH_PROC_UNIX"] = layout::proc_address(opts_.runtime_dir, a.id, p->rank);
  } else {
    std::string dir = "ipc://" + layout::proc_socket_dir(opts_.runtime_dir) + "/";
    p->addr = r.addr.empty() ? layout::proc_address(opts_.runtime_dir, a.id, p->rank) : r.addr;
    if (p->addr.rfind(dir, 0) != 0 || p->addr.find("/", dir.size()) != std::string::npos)
      throw std::runtime_error("proc address " + p->addr + " is not under " + dir);
    if (p->addr.size() - 6 > 107)
      throw std::runtime_error("proc socket path " + p->addr.substr(6) +
                               " is longer than 107 bytes; use a shorter XMESH_RUNTIME_DIR");
  }
  env["XMESH_PROC_ADDR"] = p->addr;
  env["XMESH_ALLOC"] = a.id;
  env["XMESH_HOSTD_PID"] = std::to_string(getpid());
  env["XMESH_HOST"] = hostname();
  env["XMESH_RUNTIME_DIR"] = opts_.runtime_dir;
  env["XMESH_WORKSPACE"] = opts_.workspace_root + "/" + a.space;
  auto sp = start_process(req.argv, req.env, env, req.cwd);
  p->pid = sp.pid;
  if (int behind = relayed_port(p->addr)) {  // closed again when it exits (reap)
    mux_->allow(behind);
    if (p->lane_port) mux_->allow(p->lane_port, p->lane_handover);
    if (!p->lane_handover.empty()) mux_->allow_back(behind, p->lane_handover);
  }
  p->out.fd.reset(sp.out_fd);
  p->err.fd.reset(sp.err_fd);
  p->err.name = "stderr";
  p->err.flag = 'e';
  p->log_path = layout::rank_log_file(logdir, p->rank);
  p->log = fopen(p->log_path.c_str(), "ae");
  if (p->log) p->log_bytes = ftell(p->log);
  return p;
}

// A proc's process: forked by a fork server where its command is the worker's (fast: nothing
// to import), else started from its command line; a fork server that fails is said why once and
// the proc is started the usual way.
SpawnedProc HostAgent::start_process(const std::vector<std::string>& argv,
                                     const std::map<std::string, std::string>& shared_env,
                                     const std::map<std::string, std::string>& env, const std::string& cwd) {
  if (ForkServers::serves(argv, env)) {
    try {
      return fork_servers_.spawn(argv, shared_env, env, cwd);
    } catch (const std::exception& e) {
      if (fork_server_failed_ != e.what())
        log_diag("hostd", std::string("starting procs without the fork server: ") + e.what());
      fork_server_failed_ = e.what();
    }
  }
  return spawn_proc(argv, env, cwd);
}

std::set<int> HostAgent::tcp_ports_in_use() const {
  std::set<int> taken{mux_ ? mux_->port() : 0, TcpEndpoint::parse(node_->transport().tcp_bound_addr()).port};
  for (auto& kv : allocs_)
    for (auto& q : kv.second->procs)
      if (!q->exited && q->addr.rfind("tcp://", 0) == 0) {
        TcpEndpoint e = TcpEndpoint::parse(q->addr);
        taken.insert(e.behind ? e.behind : e.port);
        if (q->lane_port) taken.insert(q->lane_port);
      }
  return taken;
}

std::string HostAgent::tcp_proc_address(std::set<int>& taken, std::map<std::string, std::string>& env,
                                        bool behind) {
  env["XMESH_KEY_FILE"] = opts_.key_file;
  if (behind) {  // behind this agent's port: a loopback port the relay opens once it runs
    auto port = free_tcp_port("127.0.0.1", 0, 0, taken);
    if (!port) throw std::runtime_error("no free TCP port on 127.0.0.1");
    taken.insert(*port);
    env["XMESH_PROC_BIND"] = "tcp://127.0.0.1:" + std::to_string(*port);
    TcpEndpoint at = reach_;
    at.behind = *port;
    return at.str();
  }
  TcpEndpoint listen = TcpEndpoint::parse(opts_.listen);
  TcpEndpoint reach = reach_;
  auto port = free_tcp_port(listen.host, opts_.proc_port_first, opts_.proc_port_last, taken);
  if (!port)
    throw std::runtime_error(opts_.proc_port_first ? "no free port left in --ports " + std::to_string(opts_.proc_port_first) +
                                                         "-" + std::to_string(opts_.proc_port_last)
                                                   : "no free TCP port on " + listen.host);
  listen.port = reach.port = *port;
  taken.insert(*port);
  env["XMESH_PROC_BIND"] = listen.str();
  return reach.str();
}

// A proc's TCP lanes' listener (tcp_lane.hpp: peers write to it directly), named in
// XMESH_LANE_LISTEN. Behind this agent's port: a loopback port, reached through the PortMux as
// the proc's own, and a unix socket at `handover` (XMESH_LANE_HANDOVER, *handover_given) where
// the PortMux hands it its lanes' connections (a path too long for a unix socket: none, the
// PortMux relays them). With --ports: a second port of the range, taken from its top and only while
// the range keeps a port for each of the `after` procs still to start (their own addresses come
// first); otherwise "off" (its peers then use ZeroMQ alone). Returns the port, 0: none.
int HostAgent::tcp_lane_port(std::set<int>& taken, std::map<std::string, std::string>& env, size_t after,
                             const std::string& handover, std::string* handover_given, bool behind) {
  env["XMESH_LANE_LISTEN"] = "off";
  env["XMESH_LANE_HANDOVER"] = "";
  std::optional<int> port;
  TcpEndpoint listen = TcpEndpoint::parse(opts_.listen);
  if (behind) {
    listen.host = "127.0.0.1";
    port = free_tcp_port(listen.host, 0, 0, taken);
    if (port && handover.size() <= 107) {
      env["XMESH_LANE_HANDOVER"] = handover;
      *handover_given = handover;
    }
  } else {
    size_t free = 0;
    for (int p = opts_.proc_port_first; p <= opts_.proc_port_last; ++p) free += !taken.count(p);
    if (free < after + 1) return 0;
    port = free_tcp_port_from_top(listen.host, opts_.proc_port_first, opts_.proc_port_last, taken);
  }
  if (!port) return 0;
  taken.insert(*port);
  listen.port = *port;
  env["XMESH_LANE_LISTEN"] = listen.str();
  return *port;
}

// What `xmesh logs` and mesh.logs() need to describe the records, also after the procs ended.
void HostAgent::write_procs_meta(const LocalAllocation& a, const std::string& logdir) {
  AllocationMeta meta;
  meta.alloc = a.id;
  meta.name = a.name;
  meta.host = hostname();
  meta.shape = a.shape;
  meta.created = a.created;
  for (auto& p : a.procs) meta.ranks[std::to_string(p->rank)] = RankMeta{p->pid, p->coords};
  try {
    write_file_atomic(layout::procs_meta_file(logdir), json(meta).dump(), 0600);
  } catch (const std::exception& e) {
    log_diag("hostd", "cannot write " + layout::procs_meta_file(logdir) + ": " + e.what());
  }
}

void HostAgent::stop_allocation(LocalAllocation& a, bool immediately) {
  a.stopping = true;
  int64_t now = now_ms();
  for (auto& p : a.procs) {
    if (p->exited) continue;
    if (immediately) {
      kill(-p->pid, SIGKILL);
      p->kill_sent = true;
    } else if (!p->term_sent_ms) {
      kill(-p->pid, SIGTERM);
      p->term_sent_ms = now;
    }
  }
}

namespace {
// This process's children, from every thread's /proc children list.
std::vector<pid_t> own_children() {
  std::vector<pid_t> out;
  DIR* tasks = opendir("/proc/self/task");
  if (!tasks) return out;
  while (dirent* t = readdir(tasks)) {
    if (t->d_name[0] == '.') continue;
    std::string list;
    if (!read_file(std::string("/proc/self/task/") + t->d_name + "/children", list)) continue;
    size_t pos = 0;
    while (pos < list.size()) {
      size_t end = list.find(' ', pos);
      if (end == std::string::npos) end = list.size();
      if (end > pos) out.push_back(static_cast<pid_t>(std::strtol(list.c_str() + pos, nullptr, 10)));
      pos = end + 1;
    }
  }
  closedir(tasks);
  return out;
}

// One variable of a process's environment ("" when unset or unreadable).
std::string environment_of(pid_t pid, const std::string& name) {
  std::string env;
  if (!read_file("/proc/" + std::to_string(pid) + "/environ", env)) return "";
  const std::string key = name + "=";
  for (size_t pos = 0; pos < env.size();) {
    size_t end = env.find('\0', pos);
    if (end == std::string::npos) end = env.size();
    if (env.compare(pos, key.size(), key) == 0) return env.substr(pos + key.size(), end - pos - key.size());
    pos = end + 1;
  }
  return "";
}
}  // namespace

// Children of this agent that are not procs were left by procs (reparented here): those of an
// allocation that has ended (all of them when `everything`) are killed with their process
// group; their own children come up at the next sweep. Returns how many were killed.
int HostAgent::sweep_leftovers(bool everything) {
  std::set<pid_t> procs;
  for (auto& kv : allocs_)
    for (auto& p : kv.second->procs) procs.insert(p->pid);
  int killed = 0;
  for (pid_t pid : own_children()) {
    if (procs.count(pid)) continue;
    std::string alloc = environment_of(pid, "XMESH_ALLOC");
    if (alloc.empty() || (!everything && allocs_.count(alloc))) continue;  // not ours, or still running
    if (getpgid(pid) == pid) kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    ++killed;
    log_diag_limited(leftover_log_, "hostd", "killed pid " + std::to_string(pid) + ", left behind by a proc of allocation " +
                                                 alloc + " that has ended");
  }
  return killed;
}

// Socket files of processes that died without removing them (SIGKILL): a controller's in c/
// ("<pid>-<tag>", "<pid>.debug") whose pid is gone, a proc's in p/ ("<alloc>.<rank>") whose
// allocation is not running here.
void HostAgent::sweep_stale_sockets() {
  for (const std::string& dir : {layout::controller_dir(opts_.runtime_dir), layout::proc_socket_dir(opts_.runtime_dir)}) {
    const bool controllers = dir == layout::controller_dir(opts_.runtime_dir);
    DIR* d = opendir(dir.c_str());
    if (!d) continue;
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name[0] == '.') continue;
      bool stale;
      if (controllers) {
        long pid = std::strtol(name.c_str(), nullptr, 10);
        stale = pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
      } else {
        stale = !allocs_.count(name.substr(0, name.find('.')));
      }
      if (stale) unlink((dir + "/" + name).c_str());
    }
    closedir(d);
  }
}

void HostAgent::reap() {
  while (true) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (auto& kv : allocs_)
      for (auto& p : kv.second->procs)
        if (p->pid == pid && !p->exited) {
          p->exited = true;
          if (int behind = relayed_port(p->addr)) {
            mux_->forbid(behind);
            if (p->lane_port) mux_->forbid(p->lane_port);
          }
          p->status = status;
          p->exited_ms = now_ms();
        }
  }
}

void HostAgent::report_exits() {
  int64_t now = now_ms();
  for (auto it = allocs_.begin(); it != allocs_.end();) {
    LocalAllocation& a = *it->second;
    for (auto& p : a.procs) {
      if (!p->exited || p->reported) continue;
      // Wait for both pipes to reach end of file (a grandchild may hold them: not forever).
      bool drained = !p->out.fd && !p->err.fd;
      if (!drained && now - p->exited_ms < 500) continue;
      for (Stream* s : {&p->out, &p->err}) {
        if (s->fd) pump(*p, *s, a);
        if (s->fd) end_stream(a, *p, *s);
      }
      if (p->log) {
        fclose(p->log);
        p->log = nullptr;
      }
      p->reported = true;
      if (p->addr.rfind("ipc://", 0) == 0) unlink(p->addr.substr(6).c_str());  // if it could not
      std::string why = a.stop_reason.empty() ? exit_text(p->status) : "was stopped: " + a.stop_reason;
      if (a.stop_reason.empty() && !ending_.empty()) why += " (" + ending_ + ")";
      if (!a.stopping && !p->tail.empty()) {
        why += "; its last output:";
        for (auto& line : p->tail) why += "\n    " + line;
      }
      ProcExitedBody body;
      body.alloc = a.id;
      body.rank = p->rank;
      body.pid = p->pid;
      body.addr = p->addr;
      body.host = hostname();
      body.coords = p->coords;
      body.stopping = a.stopping;
      body.stopped_by = a.stopped_by;
      body.text = "proc rank " + std::to_string(p->rank) + " (pid " + std::to_string(p->pid) + " on " + hostname() +
                  ") " + why;
      if (WIFSIGNALED(p->status)) body.signal = signal_name(WTERMSIG(p->status));
      if (WIFEXITED(p->status)) body.exit_code = WEXITSTATUS(p->status);
      try {
        node_->send(a.controller_addr, body);
      } catch (const SendError&) {
      }
    }
    bool all_done = true;
    for (auto& p : a.procs) all_done = all_done && p->reported;
    if (all_done)
      it = allocs_.erase(it);
    else
      ++it;
  }
}


}  // namespace xmesh
