// SpliceLoop: one thread that joins pairs of TCP sockets, copying what either side sends to the
// other without reading it. The two ends of a relay through a host agent's one port are built on
// it: the agent's PortMux (port_mux.hpp) and every dialling process's RelayDialer
// (relay_dialer.hpp). A subclass decides what happens before a pair is spliced (a preamble,
// connecting the other side); the loop does the rest: epoll, non-blocking sockets, at most one
// read's bytes held per direction (a side whose peer cannot take more is not read, so TCP's own
// flow control holds the sender back), and either side's end closing both (each socket taken
// out of the epoll set before it is closed: one handed to another process stays open there).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace xmesh {

// Writes what fd takes now; the rest stays in `bytes`. False on a failed connection.
bool write_some(int fd, std::string& bytes);
void set_no_delay(int fd);

class SpliceLoop {
 public:
  SpliceLoop();
  virtual ~SpliceLoop();  // a subclass calls stop() first in its own destructor
  SpliceLoop(const SpliceLoop&) = delete;
  SpliceLoop& operator=(const SpliceLoop&) = delete;

 protected:
  enum Side { kClient = 0, kTarget = 1 };
  struct Conn {
    uint64_t id = 0;
    int state = 0;             // the subclass's, until spliced
    bool spliced = false;
    int fd[2] = {-1, -1};      // by Side
    std::string pending[2];    // bytes waiting to be written to that side
    std::string head;          // bytes read before the splice
    uint32_t interest[2] = {0, 0};
    int64_t deadline = 0;      // a subclass's timer for a pair not spliced yet
    int target_port = 0;
    uint64_t route = 0;        // the subclass's
    int64_t backoff_ms = 0;
  };

  void start_thread();
  void stop();
  // How often the loop woke for socket events so far (an idle loop does not).
  uint64_t event_wakes() const { return event_wakes_.load(); }
  void wake();
  // Registers a listening socket; its readiness calls on_listener(key). key < 2^62.
  void add_listener(int fd, uint64_t key);
  void remove_listener(int fd);
  // A new pair whose client side (fd) is watched with `events`.
  Conn& add_conn(int client_fd, uint32_t events);
  // The other side of c: watched with `events` (0: for errors only).
  void add_target(Conn& c, int fd, uint32_t events);
  void set_interest(Conn& c, int side, uint32_t events);
  void close_target(Conn& c);
  // c's socket on `side` out of the loop, still open: the caller owns it now (-1 if none).
  int release_fd(Conn& c, int side);
  // c's two sides are joined from now on; what `pending` holds is written first.
  bool splice(Conn& c);
  std::unordered_map<uint64_t, std::unique_ptr<Conn>>& conns() { return conns_; }
  void close_conn(uint64_t id);

  // Hooks, run on the loop's thread. A false return closes the pair.
  virtual void on_listener(uint64_t key) = 0;
  virtual bool on_event(Conn& c, Side side, uint32_t events) = 0;  // a pair not spliced yet
  virtual void on_tick(int64_t now_ms) = 0;                       // about every tick_ms
  virtual void on_wake() {}  // after wake() (from any thread): work another thread left
  int tick_ms_ = 100;

 private:
  void run();
  void dispatch(uint64_t key, uint32_t events);
  bool pump(Conn& c, Side from);
  bool flush(Conn& c, Side to);
  void watch_spliced(Conn& c);
  void forget_fd(int fd);  // out of the epoll set, then closed

  int epoll_fd_ = -1, wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> event_wakes_{0};
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;  // the loop's thread only
  std::vector<char> buffer_;                                   // one read's bytes
};

}  // namespace xmesh
