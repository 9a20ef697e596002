#include "log_router.hpp"

#include <algorithm>
#include <chrono>

#include "bodies.hpp"
#include "output_bodies.hpp"
#include "util.hpp"

namespace xmesh {

namespace {

constexpr std::string_view kTracebackStart = "Traceback (most recent call last):";

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

bool is_chain_line(std::string_view line) {
  return line == "During handling of the above exception, another exception occurred:" ||
         line == "The above exception was the direct cause of the following exception:";
}

std::string prefixed(const std::string& prefix, std::string_view line, bool newline) {
  std::string out;
  out.reserve(prefix.size() + line.size() + 1);
  out += prefix;
  out.append(line);
  if (newline) out.push_back('\n');
  return out;
}

std::string thousands(uint64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

}  // namespace

LogRouter::LogRouter(Inbox& logs) : logs_(logs) {}

LogRouter::~LogRouter() { stop(); }

void LogRouter::start() {
  std::lock_guard<std::mutex> g(mu_);
  if (started_) return;
  started_ = true;
  thread_ = runtime_thread([this] { run(); });
}

void LogRouter::stop() {
  logs_.close();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> g(mu_);
  started_ = false;
  cv_.notify_all();
}

void LogRouter::add_alloc(const std::string& alloc, const std::string& label, const std::string& logs_hint) {
  std::lock_guard<std::mutex> g(mu_);
  Alloc& a = allocs_[alloc];
  a.label = label;
  a.hint = logs_hint;
}

void LogRouter::add_proc(const std::string& alloc, int64_t rank, const std::string& addr, const std::string& host) {
  std::lock_guard<std::mutex> g(mu_);
  source(alloc, rank);
  by_addr_[addr] = {alloc, rank};
  if (host.empty()) return;
  Alloc& a = allocs_[alloc];
  a.hosts[rank] = host;
  a.spans_hosts = a.spans_hosts || a.hosts.begin()->second != host;
}

void LogRouter::set_options(const std::string& alloc, bool stream_to_client, int64_t window_ms) {
  std::lock_guard<std::mutex> g(mu_);
  Alloc& a = allocs_[alloc];
  a.stream_to_client = stream_to_client;
  a.window_ms = window_ms < 0 ? -1 : window_ms;
}

void LogRouter::set_default_window(int64_t window_ms) {
  std::lock_guard<std::mutex> g(mu_);
  default_window_ms_ = window_ms < 0 ? -1 : window_ms;
}

void LogRouter::set_display_rate(int64_t lines_per_s, int64_t burst) {
  std::lock_guard<std::mutex> g(mu_);
  rate_ = std::max<int64_t>(0, lines_per_s);
  burst_ = std::max<int64_t>(1, burst);
  tokens_ = static_cast<double>(burst_);
  tokens_at_ms_ = now_ms();
}

LogRouter::Source& LogRouter::source(const std::string& alloc, int64_t rank) {
  auto it = sources_.find({alloc, rank});
  if (it != sources_.end()) return it->second;
  Source& s = sources_[{alloc, rank}];
  s.alloc = alloc;
  s.rank = rank;
  return s;
}

LogRouter::Alloc& LogRouter::alloc_of(const std::string& id) { return allocs_[id]; }

int64_t LogRouter::window_of(const Alloc& a) const { return a.window_ms == -2 ? default_window_ms_ : a.window_ms; }

void LogRouter::run() {
  while (true) {
    int64_t wait = 100;
    {
      std::lock_guard<std::mutex> g(mu_);
      int64_t now = now_ms();
      for (auto& kv : buckets_)
        if (!kv.second.agg.empty()) wait = std::min(wait, std::max<int64_t>(0, kv.second.deadline_ms - now));
      int64_t board_due = boards_.next_due(now);
      if (board_due >= 0) wait = std::min(wait, board_due);
    }
    auto m = logs_.pop(static_cast<int>(wait));
    bool got = m.has_value();
    std::lock_guard<std::mutex> g(mu_);
    // Take what else is already there (up to a bound), so that one wake-up handles a burst.
    for (int i = 0; m; ++i) {
      handle(*m);
      if (i == 255) break;
      m = logs_.pop(0);
    }
    expire_windows(now_ms());
    publish_pending();
    if (!got && logs_.closed() && logs_.size() == 0) break;
  }
  std::lock_guard<std::mutex> g(mu_);
  for (auto& kv : buckets_) flush_bucket(kv.second);
  emit_boards(now_ms(), true);
  emit_held_notices();
  publish_pending();
}

void LogRouter::handle(Message& m) {
  const json& b = m.header.body;
  if (!b.is_object()) return;
  if (b.contains("sync")) {  // a marker of our own (sync()): everything before it is handled
    sync_done_ = std::max<uint64_t>(sync_done_, b.value("sync", uint64_t(0)));
    cv_.notify_all();
    return;
  }
  auto read = read_as<LogBody>(b);
  if (!read) {
    ++stats_.malformed;
    return;  // an agent of this protocol never sends one: nothing to show
  }
  const LogBody& log = *read;
  int stream = log.stream == "stderr" ? 2 : 1;
  const std::string& cell = log.cell;
  Source& src = source(log.alloc, log.rank);
  const Alloc& alloc = alloc_of(log.alloc);
  ++stats_.messages;
  for (auto& f : m.frames) {
    std::string_view text(static_cast<const char*>(f.data()), f.size());
    stats_.bytes += text.size();
    size_t pos = 0;
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      bool has_nl = nl != std::string_view::npos;
      size_t end = has_nl ? nl : text.size();
      process_line(src, alloc, cell, stream, text.substr(pos, end - pos), has_nl);
      pos = has_nl ? nl + 1 : end;
    }
  }
  src.mark[stream] = std::max(src.mark[stream], log.mark);
  if (log.eof) src.ended[stream] = true;
  cv_.notify_all();
}

void LogRouter::process_line(Source& src, const Alloc& alloc, const std::string& cell, int stream,
                             std::string_view line, bool has_newline) {
  size_t cr = line.find('\r');
  // "text\r\n" (a Windows line ending) is a line, not a redraw.
  bool crlf = has_newline && cr == line.size() - 1 && !line.empty();
  if (crlf) line.remove_suffix(1);
  bool redraws = cr != std::string_view::npos && !crlf;
  BarLine& bar = src.bar[stream];
  if (bar.active() && bar.cell != cell) bar.end();  // a call of another cell prints: that bar was left
  if (has_newline && (bar.active() || redraws)) {
    // A line printed over a bar that cleared itself (tqdm.write: "\r<blank>\r", then
    // "message\n", in one piece or two) is a line of its own; the bar goes on after it.
    size_t split = redraws ? line.rfind('\r') + 1 : 0;
    BarLine probe = bar;
    probe.feed(line.substr(0, split));
    if (probe.cleared() && (split < line.size() || !redraws)) {
      if (split > 0) process_bar(src, alloc, cell, stream, line.substr(0, split), false);
      process_text_line(src, alloc, cell, stream, line.substr(split), true);
      return;
    }
  }
  if (bar.active() || redraws) {
    process_bar(src, alloc, cell, stream, line, has_newline);
    return;
  }
  process_text_line(src, alloc, cell, stream, line, has_newline);
}

// A piece of a line redrawn with '\r': the rank's row of its current board. A bar that ends
// with text (its line's '\n') leaves that text as its final row; the rank's next bar in the
// cell goes to the next board.
void LogRouter::process_bar(Source& src, const Alloc& alloc, const std::string& cell, int stream,
                            std::string_view piece, bool has_newline) {
  BarLine& bar = src.bar[stream];
  src.open[stream] = false;
  if (!bar.active()) {
    if (bar.cell != cell) bar.bars = 0;
    bar.cell = cell;
    bar.start();
  }
  bar.feed(piece);
  ++stats_.lines;
  if (!alloc.stream_to_client) {
    ++stats_.hidden;
    if (has_newline) bar.end();
    return;
  }
  if (!bar.blank()) {
    bool fresh = boards_.set_row(bar.cell, src.alloc, stream, bar.bars, alloc.label, src.rank, bar.text(), has_newline);
    if (fresh) {  // its first display follows what the allocation printed before it
      auto it = buckets_.find(std::make_tuple(bar.cell, stream, src.alloc));
      if (it != buckets_.end()) flush_bucket(it->second);
    }
    emit_boards(now_ms(), false);
  }
  if (has_newline) bar.end();
}

void LogRouter::process_text_line(Source& src, const Alloc& alloc, const std::string& cell, int stream,
                                  std::string_view line, bool has_newline) {
  // The newline that ends a line shown open (its last piece, a prompt) is not a line of its own:
  // the open line is ended before whatever is shown next.
  const bool ends_open_line = src.open[stream] && line.empty() && has_newline;
  src.open[stream] = !has_newline;
  if (ends_open_line) return;
  ++stats_.lines;
  if (!alloc.stream_to_client) {
    ++stats_.hidden;
    return;
  }
  int64_t window = window_of(alloc);
  bool immediate = window < 0 || !has_newline;
  if (stream == 2) {
    // A traceback goes out at once, whole, whatever the window: errors are never delayed.
    bool tb_line = false;
    if (starts_with(line, kTracebackStart)) {
      src.tb_state = 1;
      tb_line = true;
    } else if (src.tb_state == 1) {
      tb_line = true;
      if (!line.empty() && line[0] != ' ' && line[0] != '\t') src.tb_state = 2;  // the exception line
    } else if (src.tb_state == 2) {
      if (line.empty()) {
        tb_line = true;
      } else if (is_chain_line(line)) {
        tb_line = true;
        src.tb_state = 1;
      } else {
        src.tb_state = 0;
      }
    }
    immediate = immediate || tb_line;
  }
  auto key = std::make_tuple(cell, stream, src.alloc);
  if (immediate) {
    auto it = buckets_.find(key);
    if (it != buckets_.end()) flush_bucket(it->second);  // keep this rank's order
    emit(cell, stream, src.alloc, prefixed(rank_prefix(alloc.label, {src.rank}, alloc.prefix_hosts()), line, has_newline),
         {{src.rank}});
    return;
  }
  Bucket& bucket = buckets_[key];
  if (bucket.agg.empty()) {
    bucket.cell = cell;
    bucket.stream = stream;
    bucket.alloc = src.alloc;
    bucket.deadline_ms = now_ms() + window;
  }
  bucket.agg.add(src.rank, line);
}

void LogRouter::flush_bucket(Bucket& b) {
  if (b.agg.empty()) return;
  const Alloc& a = alloc_of(b.alloc);
  std::vector<AggregatedLine> lines = b.agg.lines(a.label, a.prefix_hosts());
  b.agg.clear();
  for (auto& line : lines)  // the line's ranks and members move on: nothing reads them here after
    emit(b.cell, b.stream, b.alloc, line.text, {std::move(line.ranks)}, line.members.empty() ? nullptr : &line);
}

// Queues display text (one or more lines; the last may lack its newline), line by line
// through the display budget.
void LogRouter::emit(const std::string& cell, int stream, const std::string& alloc_id, const std::string& text,
                     const std::vector<std::vector<int64_t>>& ranks_of_lines, AggregatedLine* summary) {
  int64_t now = now_ms();
  size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string::npos ? text.size() : nl + 1;
    std::string_view line(text.data() + pos, end - pos);
    const auto& ranks = ranks_of_lines[std::min(line_no, ranks_of_lines.size() - 1)];
    pos = end;
    ++line_no;
    if (!take_token(now)) {
      if (held_.empty()) held_since_ms_ = now;  // the notice comes a second later, with the count
      Held& h = held_[{cell, alloc_id}];
      auto& ever = held_by_alloc_[alloc_id];
      for (auto r : ranks) {
        ++h.by_rank[r];
        ++ever[r];
      }
      h.total += ranks.size();
      stats_.held += ranks.size();
      continue;
    }
    stats_.shown += ranks.size();
    // A line left open (a progress bar without newline, a piece of a long line) is ended before
    // unrelated text.
    auto open = open_line_.find({cell, stream});
    if (summary) {  // a chunk of its own, after the open line's end
      if (open != open_line_.end()) {
        pend_text(cell, stream, "\n");
        open_line_.erase(open);
      }
      pend_summary(cell, stream, std::move(*summary));
      continue;
    }
    std::string piece;
    if (open != open_line_.end() && line[0] != '\r') piece.push_back('\n');
    piece.append(line);
    if (piece.back() != '\n')
      open_line_.insert({{cell, stream}, true});
    else if (open != open_line_.end())
      open_line_.erase(open);
    pend_text(cell, stream, piece);
  }
}

// Text joins the pending chunk before it when that is text of the same cell and stream.
void LogRouter::pend_text(const std::string& cell, int stream, const std::string& text) {
  if (!pending_.empty() && pending_.back().cell == cell && pending_.back().stream == stream &&
      pending_.back().board.empty() && pending_.back().members.empty()) {
    pending_.back().text += text;
    return;
  }
  LogChunk c;
  c.cell = cell;
  c.stream = stream;
  c.text = text;
  pending_.push_back(std::move(c));
}

// A summary is a chunk of its own: nothing joins it.
void LogRouter::pend_summary(const std::string& cell, int stream, AggregatedLine&& summary) {
  LogChunk c;
  c.cell = cell;
  c.stream = stream;
  c.text = summary.text;  // copied: emit still reads it (the line it walks)
  c.members = std::move(summary.members);
  c.members_left_out = summary.members_left_out;
  pending_.push_back(std::move(c));
}

// Boards due to be shown go out in order with the text (an update replaces one still pending).
void LogRouter::emit_boards(int64_t now, bool force) {
  for (auto& u : boards_.take_due(now, force)) {
    auto same = std::find_if(pending_.begin(), pending_.end(), [&](const LogChunk& c) { return c.board == u.id; });
    if (same != pending_.end()) {
      same->rows = std::move(u.rows);
      continue;
    }
    open_line_.erase({u.cell, u.stream});  // a board is a display of its own: text after it starts anew
    LogChunk c;
    c.cell = u.cell;
    c.stream = u.stream;
    c.board = u.id;
    c.label = u.label;
    c.rows = std::move(u.rows);
    pending_.push_back(std::move(c));
  }
}

bool LogRouter::take_token(int64_t now) {
  if (rate_ <= 0) return true;
  tokens_ = std::min<double>(static_cast<double>(burst_),
                             tokens_ + static_cast<double>(now - tokens_at_ms_) * static_cast<double>(rate_) / 1000.0);
  tokens_at_ms_ = now;
  if (tokens_ < 1.0) return false;
  tokens_ -= 1.0;
  return true;
}

void LogRouter::expire_windows(int64_t now) {
  for (auto& kv : buckets_)
    if (!kv.second.agg.empty() && kv.second.deadline_ms <= now) flush_bucket(kv.second);
  for (auto it = buckets_.begin(); it != buckets_.end();)
    it = it->second.agg.empty() ? buckets_.erase(it) : std::next(it);
  emit_boards(now, false);
  if (!held_.empty() && now - held_since_ms_ >= 1000) emit_held_notices();
}

// "[xmesh] held back 12,000 lines (display limit 1000 lines/s): ranks 0-3: 3,000 each; every
// line is in the log files: xmesh logs NAME" (on stderr, into the cell the lines belong to).
void LogRouter::emit_held_notices() {
  for (auto& kv : held_) {
    const Held& h = kv.second;
    const Alloc& a = alloc_of(kv.first.second);
    std::map<uint64_t, std::vector<int64_t>> by_count;
    for (auto& rc : h.by_rank) by_count[rc.second].push_back(rc.first);
    std::string text = "[xmesh] held back " + thousands(h.total) + " lines (display limit " + std::to_string(rate_) +
                       " lines/s):";
    bool first = true;
    for (auto& cr : by_count) {
      text += first ? " " : ", ";
      first = false;
      text += (cr.second.size() == 1 ? "rank " : "") + describe_ranks(cr.second) + ": " + thousands(cr.first) +
              (cr.second.size() > 1 ? " each" : "");
    }
    text += "; every line is in the log files";
    if (!a.hint.empty()) text += ": " + a.hint;
    text += "\n";
    pend_text(kv.first.first, 2, text);
  }
  held_.clear();
}

void LogRouter::publish_pending() {
  if (pending_.empty()) return;
  for (auto& c : pending_) out_.push_back(std::move(c));
  pending_.clear();
  cv_.notify_all();
}

bool LogRouter::wait_marks(const std::vector<std::pair<std::string, uint64_t>>& marks, int64_t timeout_ms) {
  std::unique_lock<std::mutex> g(mu_);
  auto satisfied = [&] {
    if (!started_) return true;
    for (auto& am : marks) {
      auto it = by_addr_.find(am.first);
      if (it == by_addr_.end()) continue;
      auto s = sources_.find(it->second);
      if (s == sources_.end()) continue;
      for (int st : {1, 2})
        if (!s->second.ended[st] && s->second.mark[st] < am.second) return false;
    }
    return true;
  };
  return cv_.wait_for(g, std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)), satisfied);
}

bool LogRouter::sync(int64_t timeout_ms) {
  uint64_t n;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!started_) return false;
    n = ++sync_requested_;
  }
  Message m;
  m.header.kind = Kind::Log;
  m.header.body = {{"sync", n}};
  if (!logs_.push(std::move(m))) return false;
  std::unique_lock<std::mutex> g(mu_);
  return cv_.wait_for(g, std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)),
                      [&] { return sync_done_ >= n || !started_; });
}

void LogRouter::flush_windows() {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& kv : buckets_) flush_bucket(kv.second);
  buckets_.clear();
  emit_boards(now_ms(), true);
  if (!held_.empty()) emit_held_notices();
  publish_pending();
}

bool LogRouter::wait_output(int64_t timeout_ms) {
  std::unique_lock<std::mutex> g(mu_);
  return cv_.wait_for(g, std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)),
                      [&] { return !out_.empty() || (!started_ && logs_.closed()); }) &&
         !out_.empty();
}

std::vector<LogChunk> LogRouter::take_output() {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<LogChunk> chunks(std::make_move_iterator(out_.begin()), std::make_move_iterator(out_.end()));
  out_.clear();
  return chunks;
}

LogRouterStats LogRouter::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

std::map<int64_t, uint64_t> LogRouter::held_back(const std::string& alloc) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = held_by_alloc_.find(alloc);
  return it == held_by_alloc_.end() ? std::map<int64_t, uint64_t>{} : it->second;
}

}  // namespace xmesh
