// LogRouter: the controller's side of remote output (DESIGN §6). It consumes the `Log`
// messages host agents send (the node's log inbox) on a thread of its own, without the GIL,
// and turns them into chunks of display text, each tagged with the cell it belongs to:
//   - every line gets its origin as a prefix ("[3] ", "[trainers 3] ");
//   - within an aggregation window, lines of several ranks collapse (LineAggregator);
//     stderr tracebacks and partial lines skip the window;
//   - lines redrawn with '\r' are progress bars: rows of boards (ProgressBoards) that the front
//     end updates in place, one row per rank;
//   - a display budget (lines per second) holds back what a flood would push into a browser,
//     and says how many lines of which ranks it held back (the log files keep them all);
//   - the marks host agents pass on make the flush barrier: wait_marks() returns once every
//     listed proc's output up to a marker has been turned into chunks.
// Chunks go to a queue that the Python side drains (a script prints them; the kernel sends
// them to the cell they belong to).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "inbox.hpp"
#include "log_aggregator.hpp"
#include "progress_boards.hpp"

namespace xmesh {

struct LogChunk {
  std::string cell;
  int stream = 1;  // 1 stdout, 2 stderr
  std::string text;
  std::vector<std::string> members;  // non-empty: text is one summary of lines alike, these its
  size_t members_left_out = 0;       // ranks' own lines (AggregatedLine), and how many more
  std::string board;          // non-empty: this chunk is that board's whole new state (no text)
  std::string label;          // the board's allocation label
  std::vector<BarRow> rows;   // the board's rows
};

struct LogRouterStats {
  uint64_t messages = 0, lines = 0, bytes = 0, shown = 0, held = 0, hidden = 0;
  uint64_t malformed = 0;  // Log messages whose body did not parse (dropped)
};

class LogRouter {
 public:
  explicit LogRouter(Inbox& logs);
  ~LogRouter();
  LogRouter(const LogRouter&) = delete;
  LogRouter& operator=(const LogRouter&) = delete;

  void start();
  void stop();

  // Where output comes from. label: shown in prefixes ("" for unnamed allocations); logs_hint:
  // how a user reads the held-back lines ("xmesh logs trainers").
  void add_alloc(const std::string& alloc, const std::string& label, const std::string& logs_hint);
  // host: the proc's host name; where an allocation's procs run on several hosts, prefixes
  // name the host too ("[3@node-b] ").
  void add_proc(const std::string& alloc, int64_t rank, const std::string& addr, const std::string& host = "");
  // Per allocation: stream_to_client false keeps its lines out of the display (log files
  // only); window_ms < 0 turns aggregation off.
  void set_options(const std::string& alloc, bool stream_to_client, int64_t window_ms);
  // For allocations without options of their own.
  void set_default_window(int64_t window_ms);
  // Display budget: lines per second (0: unlimited) with a burst allowance.
  void set_display_rate(int64_t lines_per_s, int64_t burst);

  // Flush barrier: waits until, for every (proc address, seq), both of that proc's streams
  // passed marker seq (or ended). Unknown addresses are not waited for. False on timeout.
  bool wait_marks(const std::vector<std::pair<std::string, uint64_t>>& marks, int64_t timeout_ms);
  // Waits until every message already in the log inbox has been processed.
  bool sync(int64_t timeout_ms);
  // Ends every aggregation window now and emits held-back notices.
  void flush_windows();

  // Waits up to timeout_ms for chunks to be queued (true if some are).
  bool wait_output(int64_t timeout_ms);
  // Takes every queued chunk (never waits).
  std::vector<LogChunk> take_output();
  LogRouterStats stats() const;
  // The lines of an allocation the display budget has held back since it was added, by rank
  // (the log files keep them): what the panel's logs view reports of a flood.
  std::map<int64_t, uint64_t> held_back(const std::string& alloc) const;

 private:
  struct Alloc {
    std::string label, hint;
    bool stream_to_client = true;
    int64_t window_ms = -2;  // -2: the default window
    RankHosts hosts;
    bool spans_hosts = false;  // its procs run on more than one host (by name)
    const RankHosts* prefix_hosts() const { return spans_hosts ? &hosts : nullptr; }
  };
  struct Source {  // one proc
    std::string alloc;
    int64_t rank = 0;
    uint64_t mark[3] = {0, 0, 0};  // by stream (1, 2)
    bool ended[3] = {false, false, false};
    int tb_state = 0;  // stderr traceback: 0 none, 1 inside, 2 just after its last line
    bool open[3] = {false, false, false};  // by stream: its last text did not end its line
    BarLine bar[3];                        // by stream: the line it redraws with '\r'
  };
  struct Bucket {  // one aggregation window: (cell, stream, alloc)
    std::string cell, alloc;
    int stream = 1;
    LineAggregator agg;
    int64_t deadline_ms = 0;
  };
  struct Held {  // lines kept out of the display, per cell and allocation
    std::map<int64_t, uint64_t> by_rank;
    uint64_t total = 0;
  };

  void run();
  void handle(Message& m);
  void process_line(Source& src, const Alloc& alloc, const std::string& cell, int stream, std::string_view line,
                    bool has_newline);
  void process_text_line(Source& src, const Alloc& alloc, const std::string& cell, int stream,
                         std::string_view line, bool has_newline);
  void process_bar(Source& src, const Alloc& alloc, const std::string& cell, int stream, std::string_view piece,
                   bool has_newline);
  void emit_boards(int64_t now, bool force);
  void pend_text(const std::string& cell, int stream, const std::string& text);
  void pend_summary(const std::string& cell, int stream, AggregatedLine&& summary);
  // summary: text is that one line, with members to unfold (moved into its chunk).
  void emit(const std::string& cell, int stream, const std::string& alloc_id, const std::string& text,
            const std::vector<std::vector<int64_t>>& ranks_of_lines, AggregatedLine* summary = nullptr);
  void flush_bucket(Bucket& b);
  void expire_windows(int64_t now);
  void emit_held_notices();
  bool take_token(int64_t now);
  int64_t window_of(const Alloc& a) const;
  Source& source(const std::string& alloc, int64_t rank);
  Alloc& alloc_of(const std::string& id);
  void publish_pending();

  Inbox& logs_;
  std::thread thread_;
  bool started_ = false;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // marks, syncs and output
  std::map<std::string, Alloc> allocs_;
  std::map<std::pair<std::string, int64_t>, Source> sources_;
  std::unordered_map<std::string, std::pair<std::string, int64_t>> by_addr_;
  std::map<std::tuple<std::string, int, std::string>, Bucket> buckets_;
  std::map<std::pair<std::string, std::string>, Held> held_;  // (cell, alloc), until its notice
  std::map<std::string, std::map<int64_t, uint64_t>> held_by_alloc_;  // alloc -> rank -> lines, ever
  ProgressBoards boards_;
  int64_t default_window_ms_ = -1;
  int64_t rate_ = 0, burst_ = 0;
  double tokens_ = 0;
  int64_t tokens_at_ms_ = 0, held_since_ms_ = 0;  // held_since: when held_ became non-empty
  std::vector<LogChunk> pending_;  // emitted since the last publish, in order
  std::map<std::pair<std::string, int>, bool> open_line_;  // (cell, stream) whose last text had no newline
  std::deque<LogChunk> out_;
  uint64_t sync_requested_ = 0, sync_done_ = 0;
  LogRouterStats stats_;
};

}  // namespace xmesh
