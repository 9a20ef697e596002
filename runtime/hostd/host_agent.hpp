// HostAgent: the body of xmesh-hostd. One per host and user (per runtime directory). It owns
// the procs of every allocation made through it: spawns them (forked by its fork servers,
// fork_server.hpp), reads their stdout/stderr pipes into per-rank log files and forwards the
// lines to the owning controller, reaps them and reports each exit (after its pipes are drained,
// so no line is lost), stops them on request, on the controller's goodbye, or when the
// controller's heartbeats stop for the orphan grace; as a child subreaper it also kills what a
// proc left behind once its allocation ended. Named allocations outlive their controller;
// another controller attaches to one by name and becomes its owner (logs and exits go to it from
// then on).
//
// Over TCP (--listen) the agent's one port is a PortMux (port_mux.hpp): ZMTP to the agent,
// SOCKS5 CONNECTs to its live procs' ports (chosen from --ports) and their lanes. It keeps the
// synced workspaces, one space per allocation owner (`c-<controller>`, `n-<name>`), through its
// `xmesh-sync` thread (sync_worker.hpp), removing a space XMESH_WORKSPACE_KEEP after its last
// use; it sweeps the sockets of dead controllers (XMESH_SOCKET_SWEEP_MS) and forgets their
// connections and unfinished syncs.
#pragma once
#include <sys/types.h>

#include <cstdio>
#include <deque>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "agent_bodies.hpp"
#include "bodies.hpp"
#include "line_splitter.hpp"
#include "node.hpp"
#include "output_marker.hpp"
#include "port_mux.hpp"
#include "tcp_endpoint.hpp"
#include "fork_server.hpp"
#include "receiver.hpp"
#include "sync_worker.hpp"
#include "unique_fd.hpp"

namespace xmesh {

struct HostAgentOptions {
  std::string runtime_dir;
  double idle_timeout_s = 300;   // exit after this long with no procs and no controller
  double orphan_grace_s = 60;    // unnamed allocations outlive a silent controller this long
  int64_t stop_grace_ms = 3000;  // SIGTERM, then SIGKILL after this
  int64_t log_max_bytes = 64 << 20;  // per rank log file, then rotated
  int log_keep = 3;                   // rotated files kept per rank (rank<r>.log.1 ...)
  int64_t controller_timeout_ms = 4000;   // a controller silent this long shows as detached
  std::string workspace_root;             // synced workspaces ($XMESH_WORKSPACE of every proc)
  int64_t sync_timeout_ms = 120000;       // an unfinished sync idle this long is dropped
  int64_t socket_sweep_ms = 30000;        // how often socket files of dead processes are removed
  int64_t workspace_keep_ms = 600000;     // a workspace space nobody uses is removed after this
  // Serving controllers on other machines (hosts over TCP): the address to listen on
  // ("tcp://ip:port"; "" for none), the cluster's key file (required there), the address they
  // reach it at when that is not the listening one (NAT: "host:port"), and the ports its procs
  // listen on for those controllers (0, 0: any free port).
  std::string listen, key_file, advertise;
  int proc_port_first = 0, proc_port_last = 0;
  // The Python environment this agent was installed in (XMESH_PYTHON, XMESH_PYTHON_VERSION, set
  // by `xmesh-hostd` of a wheel and by job agents): reported in Status, so that a controller on
  // another machine runs its procs with it and refuses a Python other than its own. "" when
  // started without them (the controller's interpreter is used, as it names it).
  std::string python, python_version;
};

// Checks the TCP options (a key file for a non-loopback address, an address to advertise for
// a wildcard one, a sane port range); throws std::invalid_argument naming the problem.
void check_tcp_options(const HostAgentOptions& o);

class HostAgent {
 public:
  explicit HostAgent(HostAgentOptions opts);
  ~HostAgent();
  // Runs until idle, Shutdown, or SIGTERM/SIGINT/SIGHUP. Returns the exit code.
  int run();
  const std::string& addr() const { return node_->addr(); }
  std::string tcp_addr() const { return node_->transport().tcp_addr(); }

 private:
  // One of a proc's output pipes: markers are stripped (scanner), bytes cut into lines, and
  // each run of lines is attributed to the context the last marker named.
  struct Stream {
    unique_fd fd;  // the pipe's reading end, until its end is read
    const char* name = "stdout";
    char flag = 'o';  // in log records: o/e, upper case for a line without its newline
    MarkerScanner scanner;
    LineSplitter lines;
    OutputContext ctx;
    uint64_t mark = 0;  // last marker seq passed on
  };
  struct Proc {
    int64_t rank = 0;
    nlohmann::json coords;
    pid_t pid = -1;
    std::string addr;
    int lane_port = 0;  // its TCP lanes' listener (a port of --ports), 0: none
    std::string lane_handover;  // where its lanes' connections are handed over, "": not
    Stream out, err;
    FILE* log = nullptr;  // rank<r>.log: both streams, one record per line
    std::string log_path;
    int64_t log_bytes = 0;
    uint64_t log_lost_bytes = 0;  // what could not be written to the log file (a full disk)
    std::string log_error;        // why, the first time (the controller was told once)
    std::deque<std::string> tail;  // the last lines, shown with the exit notice
    bool exited = false, reported = false;
    int status = 0;
    int64_t exited_ms = 0;
    int64_t term_sent_ms = 0;
    bool kill_sent = false;
  };
  // This host's share of an allocation: its procs here (the controller's Python `Allocation`,
  // _api/allocation.py, spans every host).
  struct LocalAllocation {
    std::string id, name, controller_addr, controller_id;
    int64_t controller_pid = 0;
    std::string job_cookie;  // what its procs accept (named allocations: handed to attaching controllers)
    nlohmann::json shape;
    double created = 0;
    std::vector<std::unique_ptr<Proc>> procs;
    bool stopping = false;
    std::string stop_reason;  // why it was stopped not by its controller (it vanished; the panel)
    std::string stopped_by;   // who stopped it, when asked by another than its controller
    std::string space;  // its synced workspace: <workspace root>/<space> (layout.hpp)
  };
  struct Controller {
    std::string id;  // its node id
    int64_t last_seen_ms = 0;
    bool said_goodbye = false;
    int64_t pid = 0;  // its process, when it runs on this machine (then silence alone never orphans)
    std::set<std::string> syncs;  // the sync sessions it began
    uint64_t start_ticks = 0;
    bool link_closed = false;  // its process ended: the connection to it closed (it may still own allocations)
  };
  // Whether a controller is gone for good: said goodbye, or silent for the orphan grace and
  // (when it runs on this machine) its process ended.
  bool controller_gone(const Controller& c, int64_t now, int64_t grace_ms) const;
  // A controller of this machine whose process ended (known at once, without waiting for silence).
  static bool process_ended(const Controller& c);

  void handle(Message m);
  // The requests controllers send; a malformed one is answered with an error naming the field.
  void spawn_procs(const Message& m);
  // ports_taken: the TCP ports of live procs and of those started so far (a proc for a controller
  // over TCP adds its own).
  // shared_env: the spawn request's environment (a fork server's); env: this proc's own.
  SpawnedProc start_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& shared_env,
                            const std::map<std::string, std::string>& env, const std::string& cwd);
  std::unique_ptr<Proc> start_proc(const SpawnProcsBody& req, const SpawnRank& r, const LocalAllocation& a,
                                   const std::string& logdir, std::set<int>& ports_taken);
  void write_procs_meta(const LocalAllocation& a, const std::string& logdir);
  // Where a proc of a controller over TCP listens and is reached: by default a free loopback port
  // reached through this agent's one port ("tcp://host:port/N", relayed by mux_); with --ports, a
  // port of that range on this agent's TCP host, reached directly. Not one in `taken` (then added
  // there). Sets XMESH_PROC_BIND and the key file in env.
  // behind: reached through this agent's port (tcp://host:port/N), else a port of --ports.
  std::string tcp_proc_address(std::set<int>& taken, std::map<std::string, std::string>& env, bool behind);
  int tcp_lane_port(std::set<int>& taken, std::map<std::string, std::string>& env, size_t after,
                    const std::string& handover, std::string* handover_given, bool behind);
  std::set<int> tcp_ports_in_use() const;  // the listening port and every live proc's
  void attach(const Message& m);
  void stop_procs(const Message& m);
  template <class Body>
  bool read_request(const Message& m, Body& out);  // false: answered with the error
  LocalAllocation* live_named(const std::string& name);
  bool controller_attached(const LocalAllocation& a, int64_t now) const;
  void stop_allocation(LocalAllocation& a, bool immediately);
  void reap();
  void pump(Proc& p, Stream& s, LocalAllocation& a);
  void consume(LocalAllocation& a, Proc& p, Stream& s, const char* data, size_t n);
  void end_stream(LocalAllocation& a, Proc& p, Stream& s);
  void forward(LocalAllocation& a, Proc& p, Stream& s, const std::string& text, bool carries_news);
  // Writes text's records; false when some could not be written (counted in p.log_lost_bytes).
  bool write_log(Proc& p, const Stream& s, const std::string& text);
  void rotate_log(Proc& p);
  void report_exits();
  void check_timers();
  void reply_error(const Message& m, const std::string& text);
  void sync_step(Message& m);
  void read_log(const Message& m);
  void be_gateway(const Message& m);  // Gateway: let a controller through to other agents' ports
  // Workspace spaces (layout.hpp): one per allocation owner, removed once nobody used them
  // for workspace_keep_ms, and all at exit.
  std::string space_for(const Message& m, const std::string& alloc_name);
  bool space_in_use(const std::string& space) const;
  void expire_spaces(int64_t now);
  void drop_space(const std::string& space, const std::string& why);
  StatusReply status() const;
  int live_procs() const;

  HostAgentOptions opts_;
  std::string cookie_;
  std::unique_ptr<Node> node_;
  // --listen: the one TCP port (the agent's socket and the procs behind it) and the address
  // controllers elsewhere reach it at (--advertise, or the listening address).
  std::unique_ptr<PortMux> mux_;
  ForkServers fork_servers_;  // the worker's procs are forked from a Python that imported xmesh
  std::string fork_server_failed_;  // why the last fork failed (said once per distinct reason)
  TcpEndpoint reach_;
  std::unique_ptr<SyncWorker> sync_;  // the syncs' own thread (sync_worker.hpp)
  unique_fd sigfd_;
  std::map<std::string, std::unique_ptr<LocalAllocation>> allocs_;
  std::map<std::string, Controller> controllers_;
  std::map<std::string, int64_t> spaces_;  // space -> last use (ms)
  int64_t idle_since_ms_ = 0;
  int64_t last_timers_ms_ = 0, last_sweep_ms_ = 0;
  LogBudget leftover_log_{5, 60000};
  int sweep_leftovers(bool everything);
  void sweep_stale_sockets();
  int64_t last_socket_sweep_ms_ = 0;  // 0: the first check sweeps what an earlier agent left
  static constexpr int64_t kStallMs = 2000;  // a gap between timer checks this long is a stall
  static constexpr int64_t kEndedLookMs = 1000;  // a controller silent this long is looked at (ended?)
  bool quit_ = false;
  std::string ending_;  // why the agent is stopping on a signal (XMESH_JOB_DESCRIPTION names its job)
};

// Reads a request's body; a malformed one is answered with the error naming why.
template <class Body>
inline bool HostAgent::read_request(const Message& m, Body& out) {
  std::string why;
  auto read = read_as<Body>(m.header.body, &why);
  if (!read) {
    reply_error(m, std::string("malformed ") + kind_name(m.header.kind) + " request: " + why);
    return false;
  }
  out = std::move(*read);
  return true;
}


}  // namespace xmesh
