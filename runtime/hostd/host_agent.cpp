// The host agent (host_agent.hpp): made and run, its loop and the requests it answers (attach,
// stop, status, syncs and their spaces), the controllers it serves and its timers. Its procs are
// in host_agent_procs.cpp, their output in host_agent_logs.cpp.
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
  sigfd_.reset(signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
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
    // A controller this host cannot connect to opens connections for this agent here.
    mux_->set_back_adopter([this](unique_fd fd, std::string early) {
      node_->transport().adopt_back_connection(std::move(fd), std::move(early));
    });
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
        s->fd.reset();
      if (p->log) fclose(p->log);
    }
  sync_.reset();  // a step under way stops at its next file; before the node it answers through
  node_->stop();
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
    fds.push_back({sigfd_.get(), POLLIN, 0});
    std::vector<std::tuple<LocalAllocation*, Proc*, Stream*>> streams;
    for (auto& kv : allocs_)
      for (auto& p : kv.second->procs)
        for (Stream* s : {&p->out, &p->err})
          if (s->fd) {
            fds.push_back({s->fd.get(), POLLIN, 0});
            streams.emplace_back(kv.second.get(), p.get(), s);
          }
    int rc = poll(fds.data(), fds.size(), 100);
    if (rc < 0 && errno != EINTR) {
      log_diag("hostd", std::string("poll failed: ") + std::strerror(errno));
      return 1;
    }
    if (fds[1].revents & POLLIN) {
      signalfd_siginfo si;
      while (read(sigfd_.get(), &si, sizeof(si)) == sizeof(si)) {
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
          if (s->fd) pump(*p, *s, *kv.second);
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
    case Kind::Gateway:
      be_gateway(m);
      return;
    default:
      return reply_error(m, std::string("the host agent does not handle '") + kind_name(m.header.kind) + "' messages");
  }
}

// A controller outside the cluster (an authenticated key holder, as every sender here) reaches
// the other agents through this one's port: their addresses are let through the PortMux.
void HostAgent::be_gateway(const Message& m) {
  GatewayBody body;
  if (!read_request(m, body)) return;
  if (!mux_) return reply_error(m, "this host agent has no TCP port (--listen) to be a gateway on");
  for (auto& a : body.agents) {
    try {
      TcpEndpoint e = TcpEndpoint::parse(a);
      if (e.behind || e.port == 0) throw std::invalid_argument("not an agent's host:port");
      mux_->allow_remote(e.host, e.port);
    } catch (const std::exception& e) {
      return reply_error(m, "cannot be a gateway to " + a + ": " + e.what());
    }
  }
  node_->reply(m, true, json::object(), {});
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
  if (!req.by.empty() && a->stop_reason.empty()) {
    a->stop_reason = "by " + req.by;
    a->stopped_by = req.by;
  }
  stop_allocation(*a, req.immediately);
  node_->reply(m, true, StopProcsReply{a->id, a->name}, {});
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
        if (s->fd && s->lines.has_partial()) forward(*kv.second, *p, *s, s->lines.flush_partial(now, 200), false);
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
  r.python = opts_.python;
  r.python_version = opts_.python_version;
  r.runtime_dir = opts_.runtime_dir;
  r.workspace = opts_.workspace_root;
  r.sync_bytes_received = sync_->bytes_received();
  if (mux_) {
    PortMux::Stats s = mux_->stats();
    r.port = PortCounts{s.accepted,  s.relayed_to_agent, s.relayed_to_procs, s.lanes_handed_over,
                        s.refused,   s.evicted,          s.back,             s.relayed_to_remote};
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
