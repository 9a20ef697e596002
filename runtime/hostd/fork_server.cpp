#include "fork_server.hpp"

#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "fd_passing.hpp"
#include "process.hpp"

namespace xmesh {

namespace {
constexpr int kAnswerTimeoutS = 10;  // a fork takes milliseconds; a server this slow is broken

bool is_xmesh_setting(const std::string& name) { return name.rfind("XMESH_", 0) == 0; }

// What an import may read: the environment without XMESH_* (read by the proc after the fork).
std::map<std::string, std::string> import_env(const std::map<std::string, std::string>& env) {
  std::map<std::string, std::string> out;
  for (auto& kv : env)
    if (!is_xmesh_setting(kv.first)) out.insert(kv);
  return out;
}

void write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw std::runtime_error(std::string("writing to the fork server: ") + std::strerror(errno));
    data += w;
    n -= static_cast<size_t>(w);
  }
}

void read_all(int fd, char* data, size_t n) {
  while (n > 0) {
    ssize_t r = recv(fd, data, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) throw std::runtime_error("the fork server ended");
    if (r < 0)
      throw std::runtime_error(errno == EAGAIN ? "the fork server did not answer within " +
                                                     std::to_string(kAnswerTimeoutS) + " s"
                                               : std::string("reading from the fork server: ") + std::strerror(errno));
    data += r;
    n -= static_cast<size_t>(r);
  }
}

// The 4-byte length of the request with the proc's two pipe ends attached.
void send_header(int sock, uint32_t length, int out_fd, int err_fd) {
  uint32_t be = htonl(length);
  ssize_t w = send_with_fds(sock, std::string_view(reinterpret_cast<char*>(&be), sizeof be), {out_fd, err_fd});
  if (w != static_cast<ssize_t>(sizeof be))
    throw std::runtime_error(std::string("writing to the fork server: ") + std::strerror(errno));
}
}  // namespace

ForkServer::ForkServer(const std::string& python, const std::map<std::string, std::string>& env,
                       const std::string& cwd) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw std::runtime_error(std::string("socketpair: ") + std::strerror(errno));
  unique_fd mine(sv[0]), theirs(sv[1]);  // theirs: the server's fd 3, closed here once it has it
  pid_ = spawn_with_channel({python, "-m", "xmesh._proc.worker", "--fork-server"}, import_env(env), cwd, theirs.get());
  sock_ = std::move(mine);
  timeval tv{kAnswerTimeoutS, 0};
  setsockopt(sock_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(sock_.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// Its socket closes with it: the server reads the end of its input and exits (the agent reaps it).
ForkServer::~ForkServer() = default;

// Until the server's answer starts, looking at the server every 100 ms: one that ended or is
// stopped (a SIGSTOP) is said so at once, not after the whole timeout; one that is slow is
// given kAnswerTimeoutS, and the message says in what state it was.
void ForkServer::await_answer() {
  const std::string who = "the fork server (pid " + std::to_string(pid_) + ")";
  for (int waited_ms = 0;; waited_ms += 100) {
    pollfd pf{sock_.get(), POLLIN, 0};
    if (::poll(&pf, 1, 100) > 0) return;  // something to read (or its end: read_all says which)
    auto st = process_status(pid_);
    if (!st) throw std::runtime_error(who + " ended before it answered");
    if (st->stopped()) throw std::runtime_error(who + " is stopped (SIGSTOP?): it cannot answer");
    if (waited_ms >= kAnswerTimeoutS * 1000)
      throw std::runtime_error(who + " did not answer within " + std::to_string(kAnswerTimeoutS) + " s" +
                               (st->unusual().empty() ? "" : " (it is " + st->unusual() + ")"));
  }
}

void ForkServer::fail() {
  sock_.reset();
  if (pid_ > 0) kill(pid_, SIGKILL);
}

SpawnedProc ForkServer::spawn(const std::map<std::string, std::string>& env, const std::string& cwd) {
  if (!sock_) throw std::runtime_error("the fork server is gone");
  ProcPipes pipes;
  std::string body = nlohmann::json{{"env", env}, {"cwd", cwd}}.dump();
  nlohmann::json answer;
  try {
    send_header(sock_.get(), static_cast<uint32_t>(body.size()), pipes.out[1], pipes.err[1]);
    write_all(sock_.get(), body.data(), body.size());
    await_answer();
    uint32_t be = 0;
    read_all(sock_.get(), reinterpret_cast<char*>(&be), sizeof be);
    std::string reply(ntohl(be), '\0');
    if (reply.size() > (1u << 20)) throw std::runtime_error("the fork server sent an answer of " + std::to_string(reply.size()) + " bytes");
    read_all(sock_.get(), reply.data(), reply.size());
    answer = nlohmann::json::parse(reply);
  } catch (const std::exception& e) {
    fail();  // out of step or gone: never used again
    throw std::runtime_error(e.what());
  }
  if (answer.contains("pid") && answer["pid"].is_number_integer() && answer["pid"].get<int64_t>() > 0)
    return pipes.started(static_cast<pid_t>(answer["pid"].get<int64_t>()));
  throw std::runtime_error("the fork server: " + answer.value("error", std::string("an answer without a pid")));
}

bool ForkServers::serves(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  auto off = env.find("XMESH_FORK_SERVER");
  if (off != env.end() && off->second == "0") return false;
  return argv.size() == 3 && argv[1] == "-m" && argv[2] == "xmesh._proc.worker";
}

SpawnedProc ForkServers::spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& shared_env,
                               const std::map<std::string, std::string>& env, const std::string& cwd) {
  std::string key = argv[0] + '\0' + cwd;
  for (auto& kv : shared_env)
    if (!is_xmesh_setting(kv.first)) key += '\0' + kv.first + '=' + kv.second;
  auto it = servers_.find(key);
  if (it == servers_.end() || !it->second->usable()) {
    if (it == servers_.end() && servers_.size() >= kMaxServers) {
      servers_.erase(order_.front());
      order_.erase(order_.begin());
    }
    servers_[key] = std::make_unique<ForkServer>(argv[0], shared_env, cwd);
  }
  order_.erase(std::remove(order_.begin(), order_.end(), key), order_.end());
  order_.push_back(key);
  ForkServer& server = *servers_[key];
  try {
    return server.spawn(env, cwd);
  } catch (...) {
    if (!server.usable()) {
      servers_.erase(key);
      order_.erase(std::remove(order_.begin(), order_.end(), key), order_.end());
    }
    throw;
  }
}

}  // namespace xmesh
