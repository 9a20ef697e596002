#include "progress_boards.hpp"

#include <algorithm>

namespace xmesh {

void BarLine::feed(std::string_view piece) {
  size_t start = 0;
  bool first = true;
  while (true) {
    size_t cr = piece.find('\r', start);
    std::string_view seg = piece.substr(start, cr == std::string_view::npos ? std::string_view::npos : cr - start);
    if (!first) at_start_ = true;
    if (!seg.empty()) {
      if (at_start_)
        text_.assign(seg);  // redrawn: bars redraw their whole line (tqdm pads to its width)
      else
        text_.append(seg);  // the rest of a piece cut mid-line
      at_start_ = false;
    }
    if (cr == std::string_view::npos) break;
    first = false;
    start = cr + 1;
  }
  if (!piece.empty() && piece.back() == '\r') at_start_ = true;
}

bool BarLine::blank() const {
  return std::all_of(text_.begin(), text_.end(), [](char c) { return c == ' ' || c == '\t'; });
}

void BarLine::end() {
  if (!blank()) ++bars;
  active_ = false;
  at_start_ = false;
  text_.clear();
}

bool ProgressBoards::set_row(const std::string& cell, const std::string& alloc, int stream, int index,
                             const std::string& label, int64_t rank, std::string text, bool done) {
  Key key{cell, alloc, stream, index};
  auto it = boards_.find(key);
  bool fresh = it == boards_.end();
  if (fresh) {
    forget_finished();
    Board b;
    b.seq = next_seq_++;
    b.id = "xmesh-bars-" + cell + "-" + std::to_string(b.seq);
    b.label = label;
    it = boards_.emplace(key, std::move(b)).first;
  }
  Board& b = it->second;
  BarRow& row = b.rows[rank];
  row.rank = rank;
  row.text = std::move(text);
  row.done = done;
  b.changed = true;
  b.urgent = b.urgent || done || fresh;
  return fresh;
}

std::vector<BoardUpdate> ProgressBoards::take_due(int64_t now, bool force) {
  std::vector<BoardUpdate> due;
  for (auto& [key, b] : boards_) {
    if (!b.changed) continue;
    if (!force && !b.urgent && b.shown_ms >= 0 && now - b.shown_ms < kUpdateMs) continue;
    BoardUpdate u;
    std::tie(u.cell, u.alloc, u.stream, std::ignore) = key;
    u.id = b.id;
    u.label = b.label;
    for (auto& [rank, row] : b.rows) u.rows.push_back(row);
    due.push_back(std::move(u));
    b.changed = b.urgent = false;
    b.shown_ms = now;
  }
  return due;
}

int64_t ProgressBoards::next_due(int64_t now) const {
  int64_t next = -1;
  for (auto& kv : boards_) {
    const Board& b = kv.second;
    if (!b.changed) continue;
    int64_t in = b.urgent || b.shown_ms < 0 ? 0 : std::max<int64_t>(0, b.shown_ms + kUpdateMs - now);
    next = next < 0 ? in : std::min(next, in);
  }
  return next;
}

// Keeps the number of boards bounded: the oldest boards whose every row ended and was shown go.
// A rank that starts such a board's bar late gets a board (a display) of its own.
void ProgressBoards::forget_finished() {
  while (boards_.size() >= kMaxBoards) {
    auto oldest = boards_.end();
    for (auto it = boards_.begin(); it != boards_.end(); ++it) {
      const Board& b = it->second;
      bool finished = !b.changed && std::all_of(b.rows.begin(), b.rows.end(), [](auto& r) { return r.second.done; });
      if (finished && (oldest == boards_.end() || b.seq < oldest->second.seq)) oldest = it;
    }
    if (oldest == boards_.end()) return;  // every board is live: they are bounded by the ranks' bars
    boards_.erase(oldest);
  }
}

}  // namespace xmesh
