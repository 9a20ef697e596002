// In-band output markers: how a proc tells its host agent which call the bytes on its
// stdout/stderr belong to, and how the flush barrier knows that everything written before a
// point has arrived (DESIGN §6).
//
// A marker is an OSC escape sequence (terminals ignore unknown ones), written to fds 1 and 2
// after C stdio and Python's streams were flushed:
//     ESC ] x m ; <seq> ; <cell> ; <actor> BEL
// <seq> increases per proc; <cell> is the causal context (the controller's cell token) and
// <actor> the actor's name for the bytes that follow. The host agent strips markers from what
// it forwards and logs (MarkerScanner), and reports the last <seq> it passed on each stream;
// a controller that got a reply carrying seq S knows the proc's output up to that call is in
// once both streams reported S.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace xmesh {

struct OutputContext {
  std::string cell;   // controller's cell token ("" outside any cell: scripts, idle)
  std::string actor;  // actor name ("" for output outside any actor call)
  bool operator==(const OutputContext& o) const { return cell == o.cell && actor == o.actor; }
  bool operator!=(const OutputContext& o) const { return !(*this == o); }
};

// The bytes of one marker. Fields are sanitized: ';' and control characters become '_',
// each is cut at 120 bytes, so a marker is never longer than kMaxMarkerBytes.
std::string encode_marker(uint64_t seq, const OutputContext& ctx);
constexpr size_t kMaxMarkerBytes = 280;

// Proc side. Flushes C stdio, writes one marker (next seq) to fds 1 and 2 and returns its seq.
// Each write is shorter than PIPE_BUF, so concurrent writers never split it.
uint64_t write_output_marker(const OutputContext& ctx);
// True when fd 1 or 2 is a pipe with bytes its reader has not taken yet.
bool output_pending();
// Bytes this process (all its threads, and its children once reaped) passed to write(2) so
// far: /proc/self/io's wchar. A call whose span leaves it unchanged wrote nothing to fds 1
// and 2 at the C level (other writes only make the check err on the safe side).
uint64_t written_bytes();

// Proc side: which call the output written now belongs to. Calls begin and end (from any
// thread); a marker is written when the context the host agent should attribute bytes to
// changes, and at the end of a call that wrote something (Python said so, the process's
// write(2) count moved since the last call ended, or bytes are still in the pipes), so that
// calls which wrote nothing cost no marker and no barrier. After the last running call ends, output
// (threads it left behind) still goes to its context until another call begins.
class OutputTracker {
 public:
  void enable() { enabled_ = true; }
  bool enabled() const { return enabled_; }
  // Returns a token for end() (0 when disabled).
  uint64_t begin(const OutputContext& ctx);
  // Returns the seq of the marker written after the call's output, or 0 if none was needed.
  uint64_t end(uint64_t token, bool python_wrote);
  // A marker now (the controller's flush barrier); 0 when disabled.
  uint64_t mark_now();

 private:
  struct Active {
    uint64_t token;
    OutputContext ctx;
    uint64_t written_at_begin;
  };
  const OutputContext& effective() const { return active_.empty() ? written_ : active_.back().ctx; }
  uint64_t mark_locked();
  std::mutex mu_;
  bool enabled_ = false;
  std::vector<Active> active_;
  OutputContext written_;  // what the host agent was last told
  uint64_t next_token_ = 0;
  // written_bytes() when a call last ended: a call begins from it rather than reading /proc
  // again (a few microseconds a read). It is never more than the count at any later begin, so
  // a write between two calls makes the next call write its end marker: on the safe side.
  uint64_t written_seen_ = 0;
};
OutputTracker& output_tracker();  // the process's

// Host agent side: splits a stream into text and markers, holding back a possible marker cut
// by a read boundary. Bytes that look like the start of a marker but do not complete one
// within kMaxMarkerBytes are text.
class MarkerScanner {
 public:
  struct Piece {
    bool is_marker = false;
    std::string text;  // !is_marker
    uint64_t seq = 0;  // is_marker
    OutputContext ctx;
  };
  void feed(const char* data, size_t n, std::vector<Piece>& out);
  // End of stream: whatever is held back is text.
  void finish(std::vector<Piece>& out);

 private:
  void emit_text(const char* p, size_t n, std::vector<Piece>& out);
  std::string held_;
};

}  // namespace xmesh
