// Progress bars of several ranks (DESIGN §6, issue 17). A rank that redraws a line with '\r'
// (tqdm, a hand-written "\r 45%") draws a progress bar; shown as text, the bars of several ranks
// would take turns on one line. Instead each bar is a row of a board: the k-th bar of every rank
// of an allocation in one cell shares board k, whose display the front end updates in place
// (a notebook display updated by id; a script prints each row's final state as a line).
//   BarLine: what one rank's line shows now, by terminal rules (a '\r' lets the next text
//            redraw the line).
//   ProgressBoards: the boards, their rows, and when each is due to be shown again (at most
//            every interval; at once when a row ends, so that a bar's end is shown before the
//            rank's next line).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace xmesh {

struct BarRow {
  int64_t rank = 0;
  std::string text;
  bool done = false;
};

// A display of bars that the front end updates in place (LogChunk::board names it).
struct BoardUpdate {
  std::string cell, alloc, id, label;
  int stream = 1;
  std::vector<BarRow> rows;  // by rank
};

class BarLine {
 public:
  bool active() const { return active_; }
  // The line was cleared (blank) and the cursor is at its start: a line printed now is a line
  // of its own above the bar (tqdm.write), not the bar's end.
  bool cleared() const { return at_start_ && blank(); }
  // Applies a piece of the line (no '\n'): the first segment continues the line (unless a '\r'
  // came last), each later one redraws it.
  void feed(std::string_view piece);
  const std::string& text() const { return text_; }
  bool blank() const;
  // The line ended ('\n'): forget it; bars counts the rank's bars that ended with text.
  void end();
  void start() { active_ = true; }

  std::string cell;  // the cell of the bar's board
  int bars = 0;      // bars this rank ended in that cell

 private:
  bool active_ = false;
  bool at_start_ = false;
  std::string text_;
};

class ProgressBoards {
 public:
  static constexpr int64_t kUpdateMs = 100;  // a board is shown again at most this often
  static constexpr size_t kMaxBoards = 256;  // finished boards forgotten beyond this

  // Sets a rank's row of board (cell, alloc, stream, index). Returns true when the board is new
  // (its first display must follow the output before it).
  bool set_row(const std::string& cell, const std::string& alloc, int stream, int index, const std::string& label,
               int64_t rank, std::string text, bool done);
  // Boards due to be shown (every changed one with force), marked shown at now.
  std::vector<BoardUpdate> take_due(int64_t now, bool force);
  // Milliseconds until the next board is due (from now), or -1 when none changed.
  int64_t next_due(int64_t now) const;

 private:
  using Key = std::tuple<std::string, std::string, int, int>;  // cell, alloc, stream, index
  struct Board {
    std::string id, label;
    std::map<int64_t, BarRow> rows;
    bool changed = false, urgent = false;
    int64_t shown_ms = -1;  // -1: never shown
    uint64_t seq = 0;
  };
  void forget_finished();

  std::map<Key, Board> boards_;
  uint64_t next_seq_ = 0;
};

}  // namespace xmesh
