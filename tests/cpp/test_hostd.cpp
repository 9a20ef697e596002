// Runs the real xmesh-hostd binary in a private runtime directory and drives it with a
// controller node: status, spawning procs, their output, their exits, and malformed input.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <set>
#include <thread>

#include "handshake.hpp"
#include "node.hpp"
#include "process.hpp"
#include "util.hpp"

using namespace xmesh;

namespace {
struct Agent {
  std::string dir;
  pid_t pid = -1;
  std::string cookie;
  Agent() {
    dir = "/tmp/xmesh-hostd-test-" + std::to_string(getpid()) + "-" + random_hex(3);
    make_dirs(dir, 0700);
    std::map<std::string, std::string> env{{"XMESH_RUNTIME_DIR", dir}, {"PATH", "/usr/bin:/bin"},
                                           {"XMESH_HOSTD_IDLE", "30"}, {"XMESH_STOP_GRACE_MS", "500"}};
    pid = spawn_detached({XMESH_HOSTD_PATH, "--runtime-dir", dir}, env);
    for (int i = 0; i < 500 && access((dir + "/hostd.sock").c_str(), F_OK) != 0; ++i) usleep(10000);
    REQUIRE(read_file(dir + "/cookie", cookie));
  }
  ~Agent() {
    kill(pid, SIGTERM);
    for (int i = 0; i < 300; ++i) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) break;
      usleep(10000);
    }
    std::string cmd = "rm -rf " + dir;
    (void)system(cmd.c_str());
  }
  std::string addr() const { return "ipc://" + dir + "/hostd.sock"; }
};

json request(Node& n, const std::string& addr, Kind k, json body) {
  Header h;
  h.kind = k;
  h.body = std::move(body);
  auto c = n.call({{addr, ""}}, h, {}, true);
  REQUIRE(c->wait_done(5000));
  auto taken = c->take();
  auto& r = taken.at(0);
  json out = r.body;
  out["__ok"] = r.ok;
  return out;
}

json spawn_body(const Agent& a, const std::string& alloc, const std::string& script, int n) {
  json ranks = json::array();
  for (int r = 0; r < n; ++r)
    ranks.push_back({{"rank", r}, {"coords", {{"gpus", r}}}, {"env", {{"XMESH_RANK", std::to_string(r)}}}});
  (void)a;
  return {{"alloc", alloc}, {"argv", {"/bin/sh", "-c", script}}, {"env", {{"PATH", "/usr/bin:/bin"}}}, {"ranks", ranks}};
}
}  // namespace

TEST_CASE("hostd answers status and reports proc output and exit codes", "[hostd]") {
  Agent agent;
  Node ctl("controller", "ipc://" + agent.dir + "/ctl", "job");
  ctl.transport().cookies().present(agent.addr(), agent.cookie);
  ctl.start();
  auto st = request(ctl, agent.addr(), Kind::Status, json::object());
  CHECK(st["__ok"] == true);
  CHECK(st["pid"] == agent.pid);
  CHECK(st["protocol"] == protocol_version());

  // An output marker (runtime/output/output_marker.hpp) in the middle of stdout: stripped, the
  // partial line before it released, the context after it attributed, its seq passed on.
  auto sp = request(ctl, agent.addr(), Kind::SpawnProcs,
                    spawn_body(agent, "a1",
                               "echo out-$XMESH_RANK; printf 'tail\\033]xm;7;cellA;actorB\\007'; echo marked; "
                               "echo err-$XMESH_RANK >&2; exit 3",
                               2));
  REQUIRE(sp["__ok"] == true);
  REQUIRE(sp["procs"].size() == 2);

  std::map<std::string, std::string> text;  // "rank:stream" -> everything received
  std::map<std::string, uint64_t> marks;
  std::set<std::string> attributed;         // "rank:line|cell|actor"
  std::set<int64_t> exited;
  auto take_logs = [&] {
    while (auto m = ctl.logs().pop(0)) {
      auto& b = m->header.body;
      std::string key = std::to_string(b["rank"].get<int64_t>()) + ":" + b["stream"].get<std::string>();
      std::string t = m->frames.at(0).to_string();
      text[key] += t;
      marks[key] = std::max(marks[key], b["mark"].get<uint64_t>());
      if (!t.empty()) attributed.insert(key + ":" + t + "|" + b["cell"].get<std::string>() + "|" + b["actor"].get<std::string>());
    }
  };
  int64_t deadline = now_ms() + 10000;
  while (exited.size() < 2 && now_ms() < deadline) {
    take_logs();
    if (auto m = ctl.control().pop(50)) {
      if (m->header.kind == Kind::ProcExited) {
        CHECK(m->header.body["exit_code"] == 3);
        std::string why = m->header.body["text"].get<std::string>();
        CHECK(why.find("exited with code 3") != std::string::npos);
        CHECK(why.find("its last output:\n    out-") != std::string::npos);  // the crash shows its last lines
        exited.insert(m->header.body["rank"].get<int64_t>());
      }
    }
  }
  take_logs();
  CHECK(exited == std::set<int64_t>{0, 1});
  // Every byte arrived before the exit notice (pipes drained first), the marker stripped.
  for (int r : {0, 1}) {
    std::string rs = std::to_string(r);
    CHECK(text[rs + ":stdout"] == "out-" + rs + "\ntailmarked\n");
    CHECK(text[rs + ":stderr"] == "err-" + rs + "\n");
    CHECK(marks[rs + ":stdout"] == 7);
    CHECK(attributed.count(rs + ":stdout:marked\n|cellA|actorB"));
  }
  // The log file: one record per line, "time<TAB>flag<TAB>actor<TAB>text", the partial line
  // before the marker flagged upper case.
  std::string logfile;
  REQUIRE(read_file(agent.dir + "/logs/a1/rank1.log", logfile));
  std::vector<std::string> records;
  for (size_t pos = 0; pos < logfile.size();) {
    size_t nl = logfile.find('\n', pos);
    std::string line = logfile.substr(pos, nl - pos);
    records.push_back(line.substr(line.find('\t') + 1));  // without the time
    pos = nl + 1;
  }
  std::set<std::string> got(records.begin(), records.end());
  CHECK(got == std::set<std::string>{"o\t\tout-1", "O\t\ttail", "o\tactorB\tmarked", "e\t\terr-1"});
  std::string meta;
  REQUIRE(read_file(agent.dir + "/logs/a1/procs.json", meta));
  CHECK(json::parse(meta)["ranks"]["1"]["pid"] == sp["procs"][1]["pid"]);
}

TEST_CASE("a killed proc is reported with its signal, and its address marked dead", "[hostd]") {
  Agent agent;
  Node ctl("controller", "ipc://" + agent.dir + "/ctl", "job");
  ctl.transport().cookies().present(agent.addr(), agent.cookie);
  ctl.start();
  auto sp = request(ctl, agent.addr(), Kind::SpawnProcs, spawn_body(agent, "b2", "exec sleep 30", 1));
  REQUIRE(sp["__ok"] == true);
  pid_t pid = sp["procs"][0]["pid"].get<int>();
  std::string addr = sp["procs"][0]["addr"];
  Header h;
  h.kind = Kind::Call;
  auto pending = ctl.call({{addr, "x"}}, h, {}, true);  // never answered: sleep is no proc
  kill(pid, SIGKILL);
  REQUIRE(pending->wait_done(5000));
  auto taken = pending->take();
  auto& r = taken.at(0);
  CHECK_FALSE(r.ok);
  CHECK(r.body["kind"] == "supervision");
  CHECK(r.body["text"].get<std::string>().find("was killed by SIGKILL") != std::string::npos);
}

TEST_CASE("hostd survives malformed requests and garbage", "[hostd][security][inv:protocol.2]") {
  Agent agent;
  Node ctl("controller", "ipc://" + agent.dir + "/ctl", "job");
  ctl.transport().cookies().present(agent.addr(), agent.cookie);
  ctl.start();
  auto bad = request(ctl, agent.addr(), Kind::SpawnProcs, {{"alloc", "NOT HEX"}, {"argv", 3}});
  CHECK(bad["__ok"] == false);
  // The typed body (runtime/protocol/bodies.hpp) names what is wrong.
  CHECK(bad["text"] == "malformed spawn-procs request: SpawnProcs body: 'argv' has the wrong type");
  CHECK(bad["request"] == "spawn-procs");
  auto hex = request(ctl, agent.addr(), Kind::SpawnProcs,
                     {{"alloc", "NOT HEX"}, {"argv", {"x"}}, {"env", json::object()}, {"ranks", {{{"rank", 0}}}}});
  CHECK(hex["text"].get<std::string>().find("'alloc' must be 1-16 lowercase hex digits") != std::string::npos);
  auto rank = request(ctl, agent.addr(), Kind::SpawnProcs,
                      {{"alloc", "c2"}, {"argv", {"x"}}, {"env", json::object()}, {"ranks", {{{"coords", 1}}}}});
  CHECK(rank["text"].get<std::string>().find("'ranks': SpawnProcs rank body without 'rank'") != std::string::npos);
  auto stop = request(ctl, agent.addr(), Kind::StopProcs, json::object());
  CHECK(stop["text"].get<std::string>().find("names neither 'alloc' nor 'name'") != std::string::npos);
  auto attach = request(ctl, agent.addr(), Kind::Attach, {{"name", 5}});
  CHECK(attach["text"].get<std::string>().find("Attach body: 'name' has the wrong type") != std::string::npos);
  auto gone = request(ctl, agent.addr(), Kind::StopProcs, {{"name", "nobody"}});
  CHECK(gone["kind"] == "no_allocation");
  auto none = request(ctl, agent.addr(), Kind::SpawnProcs,
                      {{"alloc", "c3"}, {"argv", {"/nonexistent/program"}}, {"env", json::object()},
                       {"ranks", {{{"rank", 0}}}}});
  CHECK(none["__ok"] == false);
  CHECK(none["text"].get<std::string>().find("/nonexistent/program") != std::string::npos);
  // The worker's command line goes to the fork server first: a directory that is not there is
  // still refused naming it (the server declines, the agent's own start says why).
  auto nodir = request(ctl, agent.addr(), Kind::SpawnProcs,
                       {{"alloc", "c4"}, {"argv", {"/usr/bin/python3", "-m", "xmesh._proc.worker"}},
                        {"env", {{"PATH", "/usr/bin:/bin"}}}, {"cwd", "/nonexistent/dir"}, {"ranks", {{{"rank", 0}}}}});
  CHECK(nodir["__ok"] == false);
  CHECK(nodir["text"].get<std::string>().find("in /nonexistent/dir") != std::string::npos);
  {
    // Raw garbage from a cookie holder (a stranger gets no frame in): ZMTP-valid frames with
    // junk, and no hello.
    zmq::context_t ctx;
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    present_credentials(s, "tester", agent.cookie);
    s.connect(agent.addr());
    for (int i = 0; i < 100; ++i) {
      std::string junk(static_cast<size_t>(i + 1), static_cast<char>(i * 7));
      zmq::message_t m(junk.data(), junk.size());
      s.send(m, zmq::send_flags::none);
    }
    usleep(100000);
  }
  auto st = request(ctl, agent.addr(), Kind::Status, json::object());
  CHECK(st["__ok"] == true);
  CHECK(kill(agent.pid, 0) == 0);
}
