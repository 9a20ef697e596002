// Round trip of a small message over TCP lanes (runtime/transport/tcp_lane.hpp: encrypted records on plain
// TCP) between two processes on loopback, beside ZeroMQ REQ/REP over TCP (plaintext, its I/O
// thread on each side) in the same run: the design check of "TCP lanes between hosts" in docs/architecture/03-transport-and-links.md.
// Each side listens for one lane and writes the other's. `direct`: the thread that waits reads
// its lane itself; `hop` (as a node does): a reading thread takes each message and hands it to
// the waiting thread (a condition variable), which writes the answer.
//
//   build/bench/xmesh_bench_lane_pingpong [n]
// Prints the median round trip in us of: lane direct, lane hop, zmq REQ/REP.
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "tcp_lane.hpp"
#include "util.hpp"

using namespace xmesh;

namespace {
// One side's two lanes: `in` read (by this thread or a reading thread), `out` written.
struct Side {
  std::unique_ptr<LaneIn> in;
  std::unique_ptr<LaneWriter> out;
  bool hop = false;
  std::thread reader;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Message> got;
  bool closed = false;
  bool primed = false;

  std::optional<Message> next() {  // nullopt: the lane ended
    if (hop) {
      std::unique_lock<std::mutex> g(mu);
      cv.wait(g, [&] { return !got.empty() || closed; });
      if (got.empty()) return std::nullopt;
      Message m = std::move(got.front());
      got.pop_front();
      return m;
    }
    std::vector<Message> out_msgs;
    while (out_msgs.empty()) {
      if (read_some(out_msgs) != LaneIn::Status::open) return std::nullopt;
    }
    return std::move(out_msgs.front());  // one at a time in a ping-pong
  }
  LaneIn::Status read_some(std::vector<Message>& out_msgs) {
    std::vector<LaneIn::TooLarge> too_large;
    std::string error;
    if (!primed) {  // first: records may have come with the token
      primed = true;
      auto s = in->read(out_msgs, too_large, &error);
      if (s != LaneIn::Status::open || !out_msgs.empty()) return s;
    }
    pollfd p{in->fd(), POLLIN, 0};
    ::poll(&p, 1, 1000);
    return in->read(out_msgs, too_large, &error);
  }
  void start_reader() {
    hop = true;
    reader = std::thread([this] {
      while (true) {
        std::vector<Message> batch;
        auto s = read_some(batch);
        std::lock_guard<std::mutex> g(mu);
        for (auto& m : batch) got.push_back(std::move(m));
        if (s != LaneIn::Status::open) closed = true;
        cv.notify_one();
        if (closed) return;
      }
    });
  }
  void send(const std::vector<uint8_t>& header) {
    std::vector<zmq::message_t> none;
    if (out->write(header, none, true, 10000) != LaneWriter::Result::ok) std::abort();
  }
};

// Connects a's writer to b's listener and back, with the secrets made here (shared by fork).
struct Pair {
  LaneListener parent_l{"127.0.0.1", 0}, child_l{"127.0.0.1", 0};
  LaneSecret to_child = make_lane_secret(), to_parent = make_lane_secret();
};

std::unique_ptr<LaneIn> accept_lane(LaneListener& l, const LaneSecret& s) {
  l.expect(s, "peer", now_ms(), 10000);
  for (int i = 0; i < 10000; ++i) {
    std::vector<int> fds;
    l.fds(fds);
    std::vector<pollfd> p;
    for (int fd : fds) p.push_back(pollfd{fd, POLLIN, 0});
    ::poll(p.data(), p.size(), 1);
    auto got = l.poll(now_ms(), nullptr);
    if (!got.empty()) return std::make_unique<LaneIn>(std::move(got.front()), 1 << 20);
  }
  std::abort();
}

void connect_side(Side& side, LaneListener& mine, const LaneSecret& in_secret, int their_port, const LaneSecret& out_secret) {
  side.out = std::make_unique<LaneWriter>("127.0.0.1", their_port, out_secret);
  while (side.out->state() == LaneWriter::State::connecting) usleep(100);
  side.in = accept_lane(mine, in_secret);
}

double lane_round_trips(bool hop, int n) {
  Pair pair;
  std::vector<uint8_t> header;
  {
    Header h;
    h.kind = Kind::Call;
    h.sender = "bench";
    header = encode_header(h);
  }
  pid_t child = fork();
  if (child == 0) {
    Side side;
    connect_side(side, pair.child_l, pair.to_child, pair.parent_l.port(), pair.to_parent);
    if (hop) side.start_reader();
    while (true) {
      if (!side.next()) break;
      side.send(header);
    }
    side.out->close();
    if (side.reader.joinable()) side.reader.join();
    _exit(0);
  }
  Side side;
  connect_side(side, pair.parent_l, pair.to_parent, pair.child_l.port(), pair.to_child);
  if (hop) side.start_reader();
  std::vector<double> us;
  for (int i = 0; i < n + 200; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    side.send(header);
    side.next();
    if (i >= 200) us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  side.out->close();  // the child's reading ends
  waitpid(child, nullptr, 0);
  if (side.reader.joinable()) side.reader.join();
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

double zmq_round_trips(int n) {
  int report[2];
  if (pipe(report) != 0) std::abort();
  pid_t child = fork();
  if (child == 0) {  // binds any port and says which through the pipe
    zmq::context_t c(1);
    zmq::socket_t s(c, zmq::socket_type::rep);
    s.bind("tcp://127.0.0.1:*");
    std::string bound = s.get(zmq::sockopt::last_endpoint);
    if (write(report[1], bound.data(), bound.size()) != static_cast<ssize_t>(bound.size())) _exit(1);
    close(report[1]);
    while (true) {
      zmq::message_t m;
      if (!s.recv(m)) continue;
      bool stop = m.size() == 4 && m.to_string() == "stop";
      s.send(m, zmq::send_flags::none);
      if (stop) _exit(0);
    }
  }
  close(report[1]);
  char buf[256];
  ssize_t got = read(report[0], buf, sizeof buf);
  close(report[0]);
  if (got <= 0) std::abort();
  std::string addr(buf, static_cast<size_t>(got));
  zmq::context_t c(1);
  zmq::socket_t s(c, zmq::socket_type::req);
  s.connect(addr);
  std::vector<double> us;
  for (int i = 0; i < n + 200; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    zmq::message_t m("ping", 4), r;
    s.send(m, zmq::send_flags::none);
    (void)s.recv(r);
    if (i >= 200) us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  zmq::message_t stop("stop", 4);
  s.send(stop, zmq::send_flags::none);  // the server exits on it (its answer may never leave)
  waitpid(child, nullptr, 0);
  s.set(zmq::sockopt::linger, 0);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 3000;
  double direct = lane_round_trips(false, n), hop = lane_round_trips(true, n), zmq_rtt = zmq_round_trips(n);
  std::printf("lane direct %.1f us, lane hop %.1f us, zmq REQ/REP %.1f us (lane hop / zmq %.2f)\n", direct, hop, zmq_rtt,
              hop / zmq_rtt);
}
