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

void check_tcp_options(const HostAgentOptions& o) {
  if (o.listen.empty()) {
    if (!o.key_file.empty() || !o.advertise.empty() || o.proc_port_first)
      throw std::invalid_argument("--key-file, --advertise and --ports go with --listen tcp://ADDR:PORT");
    return;
  }
  TcpEndpoint listen = TcpEndpoint::parse(o.listen);
  if (o.key_file.empty() && !listen.loopback())
    throw std::invalid_argument("refusing to listen on " + o.listen + " without --key-file: anyone who can reach it "
                                "could run code here (write one with `xmesh keygen FILE`)");
  if (listen.wildcard() && o.advertise.empty())
    throw std::invalid_argument(o.listen + " listens on every interface: say with --advertise HOST:PORT where "
                                "controllers reach this agent");
  char buf[sizeof(in6_addr)];
  if (!listen.wildcard() && listen.host != "localhost" && inet_pton(AF_INET, listen.host.c_str(), buf) != 1 &&
      inet_pton(AF_INET6, listen.host.c_str(), buf) != 1)
    throw std::invalid_argument("--listen needs an IP address (or 0.0.0.0 with --advertise), not '" + listen.host + "'");
  if (!o.advertise.empty()) TcpEndpoint::parse(o.advertise);
  if (o.proc_port_first < 0 || o.proc_port_last > 65535 || o.proc_port_first > o.proc_port_last)
    throw std::invalid_argument("--ports needs FIRST-LAST with 1 <= FIRST <= LAST <= 65535");
}

HostAgent::HostAgent(HostAgentOptions opts) : opts_(std::move(opts)) {
  check_tcp_options(opts_);
  make_dirs(opts_.runtime_dir, 0700);
  check_private_dir(opts_.runtime_dir);
  make_dirs(opts_.runtime_dir + "/p", 0700);
  make_dirs(opts_.runtime_dir + "/logs", 0700);
  // The cookie file is the credential: whoever can read it (this user) may drive this agent.
  std::string path = layout::cookie_file(opts_.runtime_dir);
  if (!read_file(path, cookie_) || cookie_.size() < 32) {
    cookie_ = random_hex(32);
    write_file_atomic(path, cookie_, 0600);
  }
  // Signals arrive through a signalfd; block them before the node starts its thread.
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  sigfd_ = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  // What procs leave behind (a child in a session of its own, a daemon) is reparented here,
  // to be killed with its allocation (sweep_leftovers) instead of outliving it.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  if (opts_.workspace_root.empty()) opts_.workspace_root = layout::workspace_root(opts_.runtime_dir);
  sync_ = std::make_unique<SyncWorker>(std::make_unique<ws::SyncReceiver>(opts_.workspace_root, opts_.sync_timeout_ms));
  // Spaces an earlier agent left (it was killed): removed once unused for the keep time.
  if (DIR* d = opendir(opts_.workspace_root.c_str())) {
    while (dirent* de = readdir(d))
      if (layout::is_space(de->d_name)) spaces_[de->d_name] = now_ms();
    closedir(d);
  }
  node_ = std::make_unique<Node>("hostd", "ipc://" + layout::hostd_socket(opts_.runtime_dir), cookie_);
  if (!opts_.listen.empty()) {
    // Controllers on other machines: CURVE with the cluster's key, and the cookie every key
    // holder presents (keys.hpp); the unix socket keeps serving this machine's controllers. The
    // one port is the relay's; the agent's own TCP socket listens on loopback behind it.
    mux_ = std::make_unique<PortMux>(opts_.listen);
    reach_ = TcpEndpoint::parse(opts_.advertise.empty() ? opts_.listen : opts_.advertise);
    if (opts_.advertise.empty()) reach_.port = mux_->port();
    node_->transport().listen_tcp("tcp://127.0.0.1:*", opts_.key_file, reach_.str());
    if (!opts_.key_file.empty()) node_->transport().cookies().accept(node_->transport().cluster_cookie());
    mux_->start(TcpEndpoint::parse(node_->transport().tcp_bound_addr()).port);
  }
  // Heartbeats are acknowledged on the node's I/O thread: the main loop may be busy for long in
  // one request (a sync committing a million files takes it a minute), and a controller over
  // TCP that heard no ack for XMESH_HOSTD_TIMEOUT_MS would lose this host and every proc on it.
  // The main loop still hears of them (the controller's liveness).
  node_->on(Kind::Heartbeat, [this](Message& m) {
    Header ack;
    ack.kind = Kind::HeartbeatAck;
    try {
      node_->send(m.sender_addr, std::move(ack), {});  // the I/O thread's sends never wait
    } catch (const SendError&) {
    }
    node_->control().push(std::move(m));
  });
  node_->start();
  idle_since_ms_ = now_ms();
}

HostAgent::~HostAgent() {
  for (auto& kv : allocs_)
    for (auto& p : kv.second->procs) {
      if (!p->exited && p->pid > 0) kill(-p->pid, SIGKILL);
      for (Stream* s : {&p->out, &p->err})
        if (s->fd >= 0) close(s->fd);
      if (p->log) fclose(p->log);
    }
  sync_.reset();  // a step under way stops at its next file; before the node it answers through
  node_->stop();
  if (sigfd_ >= 0) close(sigfd_);
}

int HostAgent::live_procs() const {
  int n = 0;
  for (auto& kv : allocs_)
    for (auto& p : kv.second->procs)
      if (!p->exited) ++n;
  return n;
}

int HostAgent::run() {
  while (!quit_) {
    std::vector<pollfd> fds;
    fds.push_back({node_->control().fd(), POLLIN, 0});
    fds.push_back({sigfd_, POLLIN, 0});
    std::vector<std::tuple<LocalAllocation*, Proc*, Stream*>> streams;
    for (auto& kv : allocs_)
      for (auto& p : kv.second->procs)
        for (Stream* s : {&p->out, &p->err})
          if (s->fd >= 0) {
            fds.push_back({s->fd, POLLIN, 0});
            streams.emplace_back(kv.second.get(), p.get(), s);
          }
    int rc = poll(fds.data(), fds.size(), 100);
    if (rc < 0 && errno != EINTR) {
      log_diag("hostd", std::string("poll failed: ") + std::strerror(errno));
      return 1;
    }
    if (fds[1].revents & POLLIN) {
      signalfd_siginfo si;
      while (read(sigfd_, &si, sizeof(si)) == sizeof(si)) {
        if (si.ssi_signo == SIGCHLD) continue;
        quit_ = true;
        // Procs that end from now on are said to end with the agent, and why (a job ending).
        const char* job = std::getenv("XMESH_JOB_DESCRIPTION");
        if (ending_.empty())
          ending_ = std::string("its host agent got ") + signal_name(static_cast<int>(si.ssi_signo)) +
                    (job && *job ? std::string(": ") + job + " is ending" : "");
      }
    }
    // Pipes first, then reaping: an exit is reported only after its output was read.
    for (size_t i = 0; i < streams.size(); ++i)
      if (fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) {
        auto [a, p, s] = streams[i];
        pump(*p, *s, *a);
      }
    reap();
    while (auto m = node_->control().pop(0)) handle(std::move(*m));
    report_exits();
    check_timers();
  }
  for (auto& kv : allocs_) stop_allocation(*kv.second, true);
  // Give the last exits a moment to be reported and logs drained.
  int64_t deadline = now_ms() + 2000;
  while (live_procs() > 0 && now_ms() < deadline) {
    for (auto& kv : allocs_)
      for (auto& p : kv.second->procs)
        for (Stream* s : {&p->out, &p->err})
          if (s->fd >= 0) pump(*p, *s, *kv.second);
    reap();
    report_exits();
    usleep(20000);
  }
  for (int i = 0; i < 20 && sweep_leftovers(true) > 0; ++i) {  // their children come up in turn
    usleep(20000);
    reap();
  }
  // Every proc is gone with this agent: so is the use of every synced workspace (removed here,
  // once the syncs' thread has stopped).
  sync_->stop();
  std::vector<std::string> spaces;
  for (auto& kv : spaces_) spaces.push_back(kv.first);
  for (auto& sp : spaces) drop_space(sp, "the host agent exits");
  return 0;
}

void HostAgent::reply_error(const Message& m, const std::string& text) {
  ErrorBody body;
  body.kind = error_kind_name(ErrorKind::Hostd);
  body.text = text;
  body.request = kind_name(m.header.kind);
  node_->reply(m, false, body, {});
}

void HostAgent::handle(Message m) {
  auto& c = controllers_[m.sender_addr];
  c.last_seen_ms = now_ms();
  if (c.id != m.header.sender) {  // a controller seen for the first time: its process, if local
    c.id = m.header.sender;
    c.pid = m.sender_addr.rfind("ipc://", 0) == 0 ? node_->transport().peer(m.peer_identity).pid : 0;
    auto st = c.pid > 0 ? process_status(static_cast<pid_t>(c.pid)) : std::nullopt;
    c.start_ticks = st ? st->start_ticks : 0;
    if (!st) c.pid = 0;
  }
  switch (m.header.kind) {
    case Kind::Heartbeat:  // acknowledged on the I/O thread already; its coming is the liveness above
      return;
    case Kind::SpawnProcs:
      spawn_procs(m);
      return;
    case Kind::StopProcs:
      stop_procs(m);
      return;
    case Kind::Attach:
      attach(m);
      return;
    case Kind::Goodbye: {
      c.said_goodbye = true;
      for (auto& kv : allocs_)
        if (kv.second->controller_addr == m.sender_addr && kv.second->name.empty())
          stop_allocation(*kv.second, true);
      return;
    }
    case Kind::Status:
      node_->reply(m, true, status(), {});
      return;
    case Kind::Shutdown:
      quit_ = true;
      return;
    case Kind::Sync:
      sync_step(m);
      return;
    case Kind::ReadLog:
      read_log(m);
      return;
    default:
      return reply_error(m, std::string("the host agent does not handle '") + kind_name(m.header.kind) + "' messages");
  }
}

// A controller reads the per-rank log files kept here (they stay on this host): a listing of
// one log directory, or up to max_bytes of one of its files (procs.json or a rank's log).
void HostAgent::read_log(const Message& m) {
  ReadLogBody req;
  if (!read_request(m, req)) return;
  const std::string dir = layout::logs_root(opts_.runtime_dir) + (req.dir.empty() ? "" : "/" + req.dir);
  constexpr int64_t kMaxPiece = 16 << 20;
  ReadLogReply reply;
  if (req.file.empty()) {  // a listing: of the log directories, or of one's files
    DIR* d = opendir(dir.c_str());
    if (!d) return reply_error(m, "no log directory '" + req.dir + "' on " + hostname());
    while (dirent* de = readdir(d)) {
      std::string name = de->d_name;
      struct stat st {};
      if (name == "." || name == ".." || stat((dir + "/" + name).c_str(), &st) != 0) continue;
      if (req.dir.empty() ? S_ISDIR(st.st_mode) : (name == "procs.json" || layout::rank_log_of(name)))
        reply.files.push_back(LogFileEntry{name, req.dir.empty() ? 0 : static_cast<int64_t>(st.st_size)});
    }
    closedir(d);
    return node_->reply(m, true, reply, {});
  }
  if (req.file != "procs.json" && !layout::rank_log_of(req.file))
    return reply_error(m, "'" + req.file + "' is not a log file");
  int fd = open((dir + "/" + req.file).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return reply_error(m, "cannot read " + req.dir + "/" + req.file + " on " + hostname() + ": " + strerror(errno));
  struct stat st {};
  fstat(fd, &st);
  reply.size = st.st_size;
  int64_t n = std::max<int64_t>(0, std::min<int64_t>({req.max_bytes, kMaxPiece, reply.size - req.offset}));
  zmq::message_t data(static_cast<size_t>(n));
  ssize_t got = n ? pread(fd, data.data(), static_cast<size_t>(n), req.offset) : 0;
  close(fd);
  if (got < 0) return reply_error(m, "cannot read " + req.dir + "/" + req.file + ": " + strerror(errno));
  std::vector<zmq::message_t> frames;
  frames.emplace_back(data.data(), static_cast<size_t>(got));
  node_->reply(m, true, reply, std::move(frames));
}

// One step of a workspace sync from an authenticated controller (the node dropped anything
// from a peer that did not pass Hello with this agent's cookie), handed to the syncs' thread
// after the bookkeeping of this loop (spaces, the controller's sessions). The sessions of a
// controller that is gone are dropped with what they staged (check_timers).
void HostAgent::sync_step(Message& m) {
  SyncStepBody step;
  if (!read_request(m, step)) return;
  try {
    if (step.op == "begin") {
      // Whose workspace: a named allocation's ("for": its name), else the sender's own.
      step.space = space_for(m, step.for_alloc);
      make_dirs(opts_.workspace_root + "/" + step.space, 0700);
      spaces_[step.space] = now_ms();
      controllers_[m.sender_addr].syncs.insert(step.sid);
    }
    if (step.op == "commit" || step.op == "abort") controllers_[m.sender_addr].syncs.erase(step.sid);
  } catch (const std::exception& e) {
    return node_->reply(m, false, error_body(ErrorKind::Sync, e.what()), {});
  }
  auto msg = std::make_shared<Message>(std::move(m));
  Node* node = node_.get();
  sync_->post([node, msg, step = std::move(step)](ws::SyncReceiver& receiver) {
    std::vector<std::string_view> frames;
    for (auto& f : msg->frames) frames.emplace_back(static_cast<const char*>(f.data()), f.size());
    try {
      auto r = receiver.handle_step(step, frames, now_ms());
      std::vector<zmq::message_t> out;
      for (auto& f : r.frames) out.emplace_back(f.data(), f.size());
      node->reply(*msg, true, std::move(r.body), std::move(out));
    } catch (const std::exception& e) {
      node->reply(*msg, false, error_body(ErrorKind::Sync, e.what()), {});
    }
  });
}

std::string HostAgent::space_for(const Message& m, const std::string& alloc_name) {
  return alloc_name.empty() ? layout::controller_space(m.header.sender) : layout::named_space(alloc_name);
}

bool HostAgent::space_in_use(const std::string& space) const {
  for (auto& kv : allocs_)
    if (kv.second->space == space) return true;
  for (auto& kv : controllers_)
    if (!kv.second.said_goodbye && layout::controller_space(kv.second.id) == space) return true;
  return false;
}

void HostAgent::expire_spaces(int64_t now) {
  std::vector<std::string> idle;
  for (auto& [space, last] : spaces_) {
    if (space_in_use(space))
      last = now;
    else if (now - last > opts_.workspace_keep_ms)
      idle.push_back(space);
  }
  for (auto& sp : idle)
    drop_space(sp, "unused for " + std::to_string(opts_.workspace_keep_ms / 1000) + " s (XMESH_WORKSPACE_KEEP)");
}

void HostAgent::drop_space(const std::string& space, const std::string& why) {
  spaces_.erase(space);
  sync_->post([space, why](ws::SyncReceiver& receiver) {  // after any step of it already queued
    try {
      receiver.forget_space(space);
      log_diag("hostd", "removed the synced workspace " + receiver.root() + "/" + space + ": " + why);
    } catch (const std::exception& e) {
      log_diag("hostd", "cannot remove the synced workspace " + space + ": " + e.what());
    }
  });
}

HostAgent::LocalAllocation* HostAgent::live_named(const std::string& name) {
  if (name.empty()) return nullptr;
  for (auto& kv : allocs_)
    if (kv.second->name == name && !kv.second->stopping) return kv.second.get();
  return nullptr;
}

bool HostAgent::controller_attached(const LocalAllocation& a, int64_t now) const {
  auto c = controllers_.find(a.controller_addr);
  return c != controllers_.end() && !c->second.said_goodbye && !c->second.link_closed &&
         now - c->second.last_seen_ms < opts_.controller_timeout_ms && !process_ended(c->second);
}

template <class Body>
bool HostAgent::read_request(const Message& m, Body& out) {
  std::string why;
  auto read = read_as<Body>(m.header.body, &why);
  if (!read) {
    reply_error(m, std::string("malformed ") + kind_name(m.header.kind) + " request: " + why);
    return false;
  }
  out = std::move(*read);
  return true;
}

// A controller takes over a live named allocation: it gets what it needs to talk to the procs
// (their addresses and the cookie they accept) and becomes the owner.
void HostAgent::attach(const Message& m) {
  AttachBody req;
  if (!read_request(m, req)) return;
  LocalAllocation* a = live_named(req.name);
  if (!a)
    return node_->reply(m, false,
                        error_body(ErrorKind::NoAllocation, "no live allocation named '" + req.name + "' on " + hostname()),
                        {});
  AttachReply r;
  r.alloc = a->id;
  r.name = a->name;
  r.shape = a->shape;
  r.created = a->created;
  r.host = hostname();
  r.job_cookie = a->job_cookie;
  for (auto& p : a->procs) r.procs.push_back(ProcEntry{p->rank, p->pid, p->addr, !p->exited, p->coords, "", 0, ""});
  r.previous = PreviousOwner{a->controller_addr, a->controller_id, a->controller_pid,
                             controller_attached(*a, now_ms()) && a->controller_addr != m.sender_addr};
  // observe: what `xmesh sync --reload` needs to reach the procs, without taking them over.
  if (!req.observe) {
    a->controller_addr = m.sender_addr;
    a->controller_id = m.header.sender;
    a->controller_pid = req.controller_pid;
  }
  node_->reply(m, true, r, {});
}

void HostAgent::stop_procs(const Message& m) {
  StopProcsBody req;
  if (!read_request(m, req)) return;
  LocalAllocation* a = nullptr;
  if (!req.alloc.empty()) {
    auto it = allocs_.find(req.alloc);
    if (it == allocs_.end())
      return node_->reply(m, false, error_body(ErrorKind::NoAllocation, "no allocation '" + req.alloc + "' on this host"), {});
    a = it->second.get();
  } else if (!(a = live_named(req.name))) {
    return node_->reply(
        m, false, error_body(ErrorKind::NoAllocation, "no live allocation named '" + req.name + "' on this host"), {});
  }
  stop_allocation(*a, req.immediately);
  node_->reply(m, true, StopProcsReply{a->id, a->name}, {});
}

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
        if (st->fd >= 0) close(st->fd);
        st->fd = -1;
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
    p->addr = tcp_proc_address(ports_taken, env);
    p->lane_port = tcp_lane_port(ports_taken, env, static_cast<size_t>(req.ranks.data() + req.ranks.size() - &r - 1),
                                 layout::lane_handover_socket(opts_.runtime_dir, a.id, p->rank), &p->lane_handover);
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
  }
  p->out.fd = sp.out_fd;
  p->err.fd = sp.err_fd;
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

std::string HostAgent::tcp_proc_address(std::set<int>& taken, std::map<std::string, std::string>& env) {
  env["XMESH_KEY_FILE"] = opts_.key_file;
  if (!opts_.proc_port_first) {  // behind this agent's port: a loopback port the relay opens once it runs
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
                             const std::string& handover, std::string* handover_given) {
  env["XMESH_LANE_LISTEN"] = "off";
  env["XMESH_LANE_HANDOVER"] = "";
  std::optional<int> port;
  TcpEndpoint listen = TcpEndpoint::parse(opts_.listen);
  if (!opts_.proc_port_first) {
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

// Log records, one per line: "<epoch seconds>\t<flag>\t<actor>\t<text>\n", flag o/e (O/E when
// the text had no newline of its own: a partial line or a piece of a long one).
bool HostAgent::write_log(Proc& p, const Stream& s, const std::string& text) {
  if (!p.log) return true;
  double now = wall_time();
  size_t pos = 0, bytes = 0;
  bool written = true;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    bool whole = nl != std::string::npos;
    size_t end = whole ? nl : text.size();
    std::string record = format_record(now, s.flag, whole, s.ctx.actor, std::string_view(text).substr(pos, end - pos));
    written = fwrite(record.data(), 1, record.size(), p.log) == record.size() && written;
    bytes += record.size();
    p.log_bytes += static_cast<int64_t>(record.size());
    // The last lines, for the exit notice of a proc that dies.
    p.tail.push_back(text.substr(pos, std::min<size_t>(end - pos, 1000)));
    if (p.tail.size() > 20) p.tail.pop_front();
    pos = whole ? nl + 1 : end;
  }
  written = fflush(p.log) == 0 && written;
  if (!written) {  // a full disk, say: the lines are still forwarded; what the file lacks is counted
    if (p.log_error.empty()) p.log_error = std::strerror(errno ? errno : EIO);
    p.log_lost_bytes += bytes;
    clearerr(p.log);
  }
  if (p.log_bytes > opts_.log_max_bytes) rotate_log(p);
  return written;
}

// rank<r>.log -> rank<r>.log.1 -> ... -> rank<r>.log.<keep>; the oldest is dropped.
void HostAgent::rotate_log(Proc& p) {
  fclose(p.log);
  for (int i = opts_.log_keep; i >= 1; --i) {
    std::string from = i == 1 ? p.log_path : p.log_path + "." + std::to_string(i - 1);
    std::string to = p.log_path + "." + std::to_string(i);
    rename(from.c_str(), to.c_str());
  }
  if (opts_.log_keep < 1) unlink(p.log_path.c_str());
  p.log = fopen(p.log_path.c_str(), "we");
  p.log_bytes = 0;
}

// Sends text (whole lines, or a partial one) to the owning controller with the stream's
// current context, and the last marker passed (carries_news: send even without text, so the
// controller learns the new mark or the end of the stream).
void HostAgent::forward(LocalAllocation& a, Proc& p, Stream& s, const std::string& text, bool carries_news) {
  if (text.empty() && !carries_news) return;
  const bool first_loss = p.log_lost_bytes == 0;
  if (!write_log(p, s, text) && first_loss) {
    // Said once, in the output of the cell or program the lines go to; `xmesh logs` says it too.
    LogBody notice;
    notice.alloc = a.id;
    notice.rank = p.rank;
    notice.pid = p.pid;
    notice.stream = "stderr";
    notice.time = wall_time();
    notice.cell = s.ctx.cell;
    notice.mark = p.err.mark;  // no marker passed: the flush barrier is where it was
    Header nh;
    nh.kind = Kind::Log;
    nh.body = notice;
    std::string warn = "[xmesh] the log file " + p.log_path + " cannot be written (" + p.log_error +
                       "): its lines are shown but not kept; `xmesh logs` will say how much is missing\n";
    std::vector<zmq::message_t> wf;
    wf.emplace_back(warn.data(), warn.size());
    try {
      node_->send(a.controller_addr, std::move(nh), std::move(wf));
    } catch (const SendError&) {
    }
  }
  LogBody body;
  body.alloc = a.id;
  body.rank = p.rank;
  body.pid = p.pid;
  body.stream = s.name;
  body.time = wall_time();
  body.cell = s.ctx.cell;
  body.actor = s.ctx.actor;
  body.mark = s.mark;
  body.eof = s.fd < 0;
  std::vector<zmq::message_t> frames;
  frames.emplace_back(text.data(), text.size());
  try {
    node_->send(a.controller_addr, body, std::move(frames));
  } catch (const SendError&) {
    // The controller is gone; the log file keeps the lines.
  }
}

// Bytes read from a pipe: markers switch the context (and are passed on as the stream's mark
// after the text written before them); a partial line is released at a marker, so that what
// a call printed without a newline still arrives before its reply's barrier.
void HostAgent::consume(LocalAllocation& a, Proc& p, Stream& s, const char* data, size_t n) {
  std::vector<MarkerScanner::Piece> pieces;
  if (data) {
    s.scanner.feed(data, n, pieces);
  } else {
    s.scanner.finish(pieces);
  }
  int64_t now = now_ms();
  std::string batch;
  for (auto& piece : pieces) {
    if (!piece.is_marker) {
      for (auto& chunk : s.lines.feed(piece.text.data(), piece.text.size(), now)) {
        batch += chunk;
        if (chunk.back() != '\n') {  // a piece of a long line: a message of its own, open-ended
          forward(a, p, s, batch, false);
          batch.clear();
        }
      }
      continue;
    }
    batch += s.lines.flush_partial(now, -1);
    s.mark = piece.seq;
    forward(a, p, s, batch, true);
    batch.clear();
    s.ctx = std::move(piece.ctx);
  }
  forward(a, p, s, batch, false);
}

// End of a stream: the rest (a held-back marker prefix, a partial line) goes out, flagged eof.
void HostAgent::end_stream(LocalAllocation& a, Proc& p, Stream& s) {
  consume(a, p, s, nullptr, 0);
  if (s.fd >= 0) close(s.fd);
  s.fd = -1;
  forward(a, p, s, s.lines.flush_partial(now_ms(), -1), true);
}

void HostAgent::pump(Proc& p, Stream& s, LocalAllocation& a) {
  char buf[65536];
  for (int i = 0; i < 16; ++i) {
    ssize_t n = read(s.fd, buf, sizeof(buf));
    if (n > 0) {
      consume(a, p, s, buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    end_stream(a, p, s);  // end of file (or error)
    return;
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
      bool drained = p->out.fd < 0 && p->err.fd < 0;
      if (!drained && now - p->exited_ms < 500) continue;
      for (Stream* s : {&p->out, &p->err}) {
        if (s->fd >= 0) pump(*p, *s, a);
        if (s->fd >= 0) end_stream(a, *p, *s);
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

bool HostAgent::process_ended(const Controller& c) {
  if (c.pid <= 0) return false;
  auto st = process_status(static_cast<pid_t>(c.pid));
  return !st || st->start_ticks != c.start_ticks;
}

bool HostAgent::controller_gone(const Controller& c, int64_t now, int64_t grace_ms) const {
  if (c.said_goodbye) return true;
  if (now - c.last_seen_ms <= grace_ms) return false;
  if (c.pid > 0) return process_ended(c);  // silent past the grace: gone only if its process ended (not merely stopped)
  return true;
}

void HostAgent::check_timers() {
  int64_t now = now_ms();
  // Time this agent itself did not run (stopped, or busy spawning) is no controller's silence:
  // it could not hear them meanwhile, and their heartbeats may still be queued.
  if (last_timers_ms_ && now - last_timers_ms_ > kStallMs)
    for (auto& kv : controllers_) kv.second.last_seen_ms += now - last_timers_ms_;
  last_timers_ms_ = now;
  if (now - last_sweep_ms_ >= 1000) {
    last_sweep_ms_ = now;
    sweep_leftovers(false);
  }
  if (now - last_socket_sweep_ms_ >= opts_.socket_sweep_ms) {
    last_socket_sweep_ms_ = now;
    sweep_stale_sockets();
  }
  expire_spaces(now);
  // Partial lines (prompts, progress bars without newline) go out after a short wait.
  for (auto& kv : allocs_)
    for (auto& p : kv.second->procs)
      for (Stream* s : {&p->out, &p->err})
        if (s->fd >= 0 && s->lines.has_partial()) forward(*kv.second, *p, *s, s->lines.flush_partial(now, 200), false);
  // Escalate stops that SIGTERM did not finish.
  for (auto& kv : allocs_)
    for (auto& p : kv.second->procs)
      if (!p->exited && p->term_sent_ms && !p->kill_sent && now - p->term_sent_ms > opts_.stop_grace_ms) {
        kill(-p->pid, SIGKILL);
        p->kill_sent = true;
      }
  // Orphans: unnamed allocations whose controller is gone.
  int64_t grace_ms = static_cast<int64_t>(opts_.orphan_grace_s * 1000);
  for (auto& kv : allocs_) {
    LocalAllocation& a = *kv.second;
    if (a.stopping || !a.name.empty()) continue;
    auto c = controllers_.find(a.controller_addr);
    if (c != controllers_.end() && !controller_gone(c->second, now, grace_ms)) continue;
    int64_t last = c == controllers_.end() ? 0 : c->second.last_seen_ms;
    a.stop_reason = c != controllers_.end() && c->second.pid
                        ? "its controller (pid " + std::to_string(c->second.pid) + ") ended"
                        : "its controller was silent for " + std::to_string((now - last) / 1000) +
                              " s (XMESH_ORPHAN_GRACE)";
    log_diag("hostd", "stopping allocation " + a.id + " of controller " + a.controller_id + ": " + a.stop_reason);
    stop_allocation(a, false);
  }
  // Forget controllers that are gone and own nothing here any more: their connections too (one
  // merely silent is kept: it may come back, and would not say Hello again on its connection).
  for (auto it = controllers_.begin(); it != controllers_.end();) {
    bool owns = false;
    for (auto& kv : allocs_) owns = owns || kv.second->controller_addr == it->first;
    Controller& c = it->second;
    bool gone = controller_gone(c, now, grace_ms);
    if (gone)
      for (auto& sid : c.syncs)  // what a killed sync staged goes now
        sync_->post([sid](ws::SyncReceiver& receiver) { receiver.abandon(sid); });
    // A controller of this machine whose process ended (a SIGKILL) needs no connection, even
    // while it owns named allocations: closed once a second of silence says to look.
    const bool ended = !c.link_closed && c.pid > 0 && now - c.last_seen_ms > kEndedLookMs && process_ended(c);
    if ((gone && !owns && (c.said_goodbye || c.pid) && !c.link_closed) || ended) {
      node_->forget_peer(it->first);
      c.link_closed = true;
    }
    it = (gone && !owns) ? controllers_.erase(it) : std::next(it);
  }
  // Idle exit.
  bool controller_recent = false;
  for (auto& kv : controllers_)
    if (!kv.second.said_goodbye && now - kv.second.last_seen_ms < grace_ms) controller_recent = true;
  if (!allocs_.empty() || controller_recent) idle_since_ms_ = now;
  // 0: never (an agent that lives as long as its job: SlurmJob, SSHJob).
  if (opts_.idle_timeout_s > 0 && now - idle_since_ms_ > static_cast<int64_t>(opts_.idle_timeout_s * 1000)) quit_ = true;
}

StatusReply HostAgent::status() const {
  StatusReply r;
  r.pid = getpid();
  r.host = hostname();
  r.version = version_string();
  r.build = build_id();
  r.protocol = protocol_version();
  r.runtime_dir = opts_.runtime_dir;
  r.workspace = opts_.workspace_root;
  r.sync_bytes_received = sync_->bytes_received();
  if (mux_) {
    PortMux::Stats s = mux_->stats();
    r.port = PortCounts{s.accepted, s.relayed_to_agent, s.relayed_to_procs, s.lanes_handed_over, s.refused, s.evicted};
  }
  int64_t now = now_ms();
  for (auto& kv : allocs_) {
    const LocalAllocation& a = *kv.second;
    AllocationStatus st{a.id, a.name, a.controller_id, a.controller_pid, controller_attached(a, now),
                        a.shape, a.created, a.stopping, {}};
    for (auto& p : a.procs) {
      auto ps = p->exited ? std::nullopt : process_status(p->pid);
      st.procs.push_back(ProcEntry{p->rank, p->pid, p->addr, !p->exited, p->coords, ps ? ps->unusual() : "",
                                   p->log_lost_bytes, p->log_error});
    }
    r.allocations.push_back(std::move(st));
  }
  return r;
}

}  // namespace xmesh
