// Output markers, line aggregation and the controller's log router, without processes.
#include <catch2/catch.hpp>
#include <algorithm>
#include <functional>
#include <thread>

#include "bodies.hpp"
#include "output_bodies.hpp"
#include "layout.hpp"
#include "log_record.hpp"
#include "log_aggregator.hpp"
#include "log_router.hpp"
#include "output_marker.hpp"
#include "progress_boards.hpp"
#include "util.hpp"

using namespace xmesh;

namespace {

std::string scan_all(MarkerScanner& s, const std::string& data, std::vector<MarkerScanner::Piece>& markers,
                     size_t step) {
  std::vector<MarkerScanner::Piece> pieces;
  for (size_t i = 0; i < data.size(); i += step) s.feed(data.data() + i, std::min(step, data.size() - i), pieces);
  s.finish(pieces);
  std::string text;
  for (auto& p : pieces) {
    if (p.is_marker)
      markers.push_back(p);
    else
      text += p.text;
  }
  return text;
}

Message log_message(const std::string& alloc, int64_t rank, const std::string& stream, const std::string& cell,
                    const std::string& text, uint64_t mark = 0, bool eof = false) {
  Message m;
  m.header.kind = Kind::Log;
  m.header.body = {{"alloc", alloc}, {"rank", rank}, {"stream", stream}, {"cell", cell}, {"mark", mark}};
  if (eof) m.header.body["eof"] = true;
  m.frames.emplace_back(text.data(), text.size());
  return m;
}

// Everything the router queued, per cell, waiting up to timeout_ms for at least `until` to appear.
std::string output_of(LogRouter& r, const std::string& cell, const std::string& until = "", int timeout_ms = 3000) {
  static std::map<std::string, std::string> seen;
  int64_t deadline = now_ms() + timeout_ms;
  do {
    r.wait_output(50);
    for (auto& c : r.take_output()) seen[c.cell] += c.text;
  } while (!until.empty() && seen[cell].find(until) == std::string::npos && now_ms() < deadline);
  std::string out;
  out.swap(seen[cell]);
  return out;
}

}  // namespace

TEST_CASE("markers are stripped wherever read boundaries cut them", "[logs]") {
  OutputContext ctx{"k1.3", "trainer"};
  std::string data = "before \x1b[31mred\x1b[0m" + encode_marker(42, ctx) + "after\n" + encode_marker(43, {"", ""});
  for (size_t step : {1, 2, 3, 5, 7, 64, 1000}) {
    MarkerScanner s;
    std::vector<MarkerScanner::Piece> markers;
    CHECK(scan_all(s, data, markers, step) == "before \x1b[31mred\x1b[0mafter\n");
    REQUIRE(markers.size() == 2);
    CHECK(markers[0].seq == 42);
    CHECK(markers[0].ctx == ctx);
    CHECK(markers[1].seq == 43);
    CHECK(markers[1].ctx.cell.empty());
  }
}

TEST_CASE("what only looks like a marker stays text, and fields cannot break the format", "[logs]") {
  MarkerScanner s;
  std::vector<MarkerScanner::Piece> markers;
  std::string fake = "\x1b]xm;no-digits;a;b\x07 and \x1b]xm;" + std::string(400, 'x') + "\x07 end \x1b]x";
  CHECK(scan_all(s, fake, markers, 3) == fake);
  CHECK(markers.empty());

  std::string m = encode_marker(1, {"c;1\n", "act\x07or;" + std::string(500, 'z')});
  CHECK(m.size() <= kMaxMarkerBytes);
  MarkerScanner s2;
  CHECK(scan_all(s2, m, markers, 1).empty());
  REQUIRE(markers.size() == 1);
  CHECK(markers[0].ctx.cell == "c_1_");
  CHECK(markers[0].ctx.actor.substr(0, 7) == "act_or_");
}

TEST_CASE("line shapes take numbers out, but not digits inside words", "[logs]") {
  auto s = shape_of("epoch 3 loss=0.125 lr=1e-4 step -2 on cuda0 v1.2 10px");
  CHECK(s.numbers == std::vector<std::string>{"3", "0.125", "1e-4", "-2"});
  CHECK(s.key == "epoch \x01 loss=\x01 lr=\x01 step \x01 on cuda0 v1.2 10px");
  CHECK(describe_ranks({3}) == "3");
  CHECK(describe_ranks({9, 0, 1, 2, 3, 4, 5, 6, 6}) == "ranks 0-6,9");
  CHECK(rank_prefix("trainers", {1, 2}) == "[trainers ranks 1-2] ");
  RankHosts hosts{{0, "node-a"}, {1, "node-a"}, {2, "node-b"}};
  CHECK(rank_prefix("", {2}, &hosts) == "[2@node-b] ");
  CHECK(rank_prefix("trainers", {0, 1}, &hosts) == "[trainers ranks 0-1@node-a] ");
  CHECK(rank_prefix("", {1, 2}, &hosts) == "[ranks 1-2] ");  // two hosts: no one to name
  CHECK(rank_prefix("", {7}, &hosts) == "[7] ");             // not known
}

TEST_CASE("router: where an allocation spans hosts, prefixes name the host", "[logs]") {
  Inbox inbox;
  LogRouter r(inbox);
  r.add_alloc("one", "", "");
  r.add_proc("one", 0, "ipc://o0", "node-a");
  r.add_proc("one", 1, "ipc://o1", "node-a");  // one host: no host in its prefixes
  r.add_alloc("two", "", "");
  r.add_proc("two", 0, "tcp://a:7000/1", "node-a");
  r.add_proc("two", 1, "tcp://b:7000/1", "node-b");
  r.set_default_window(-1);
  r.start();
  inbox.push(log_message("one", 1, "stdout", "c1", "same host\n"));
  inbox.push(log_message("two", 1, "stdout", "c2", "other host\n"));
  REQUIRE(r.sync(3000));
  CHECK(output_of(r, "c1", "same host") == "[1] same host\n");
  CHECK(output_of(r, "c2", "other host") == "[1@node-b] other host\n");
  r.stop();
}

TEST_CASE("aggregation: same lines collapse, lines alike read as a summary, a rank's repeats stay apart", "[logs]") {
  LineAggregator agg;
  for (int r = 0; r < 8; ++r) agg.add(r, "epoch 3 done");
  for (int r = 0; r < 8; ++r) agg.add(r, "loss=0.1" + std::to_string(2 + r) + " step 7");
  for (int r = 0; r < 3; ++r) agg.add(r, "acc " + std::to_string(90 + r));
  agg.add(5, "only five");
  agg.add(5, "only five");
  std::string out = agg.render("");
  CHECK(out ==
        "[ranks 0-7] epoch 3 done\n"
        "[0] loss=0.12 step 7  [similar on ranks 1-7]\n"
        "[0] acc 90  [similar on ranks 1-2]\n"
        "[5] only five\n"
        "[5] only five\n");
  auto lines = agg.lines("");
  REQUIRE(lines.size() == 5);
  CHECK(lines[0].ranks.size() == 8);
  CHECK(lines[4].ranks == std::vector<int64_t>{5});
  // A summary of lines alike unfolds to each rank's own line, by rank; same lines and a single
  // rank's line have nothing to unfold.
  CHECK(lines[0].members.empty());
  CHECK(lines[4].members.empty());
  CHECK(lines[2].members == std::vector<std::string>{"[0] acc 90", "[1] acc 91", "[2] acc 92"});
  REQUIRE(lines[1].members.size() == 8);
  CHECK(lines[1].members[7] == "[7] loss=0.19 step 7");
  CHECK(lines[1].members_left_out == 0);
  // The k-th "tick" of each rank goes together: two lines, each with both ranks.
  LineAggregator ticks;
  for (int i = 0; i < 2; ++i)
    for (int r = 0; r < 2; ++r) ticks.add(r, "tick");
  CHECK(ticks.render("") == "[ranks 0-1] tick\n[ranks 0-1] tick\n");
  // The lowest rank's own line, whichever rank printed first; one other rank is "rank N".
  LineAggregator two;
  two.add(3, "hello from rank 3");
  two.add(1, "hello from rank 1");
  CHECK(two.render("trainers") == "[trainers 1] hello from rank 1  [similar on rank 3]\n");
  CHECK(two.lines("trainers")[0].members ==
        std::vector<std::string>{"[trainers 1] hello from rank 1", "[trainers 3] hello from rank 3"});
  // Thousands of ranks unfold to the first kMaxMembers; the rest are counted.
  LineAggregator many;
  const int64_t n = LineAggregator::kMaxMembers + 44;
  for (int64_t r = n - 1; r >= 0; --r) many.add(r, "step " + std::to_string(r));
  auto big = many.lines("");
  REQUIRE(big.size() == 1);
  CHECK(big[0].members.size() == LineAggregator::kMaxMembers);
  CHECK(big[0].members.front() == "[0] step 0");
  CHECK(big[0].members_left_out == 44);
}

TEST_CASE("router: a summary of lines alike is a chunk of its own, carrying its ranks' lines", "[logs]") {
  Inbox inbox;
  LogRouter r(inbox);
  r.add_alloc("a", "", "");
  for (int rank = 0; rank < 3; ++rank) r.add_proc("a", rank, "ipc://a" + std::to_string(rank));
  r.add_alloc("b", "bar", "");
  r.add_proc("b", 0, "ipc://b0");
  r.set_default_window(60000);  // only flush_windows ends it
  r.start();
  for (int rank = 0; rank < 3; ++rank) {
    inbox.push(log_message("a", rank, "stdout", "c", "loss " + std::to_string(rank) + "\n"));
    inbox.push(log_message("a", rank, "stdout", "c", "epoch done\n"));
  }
  inbox.push(log_message("b", 0, "stdout", "c", "partial"));  // an open line, shown at once
  REQUIRE(r.sync(3000));
  r.flush_windows();
  auto chunks = r.take_output();
  REQUIRE(chunks.size() == 4);
  CHECK(chunks[0].text == "[bar 0] partial");
  CHECK(chunks[1].text == "\n");  // the open line ends before the summary, not inside it
  CHECK(chunks[2].text == "[0] loss 0  [similar on ranks 1-2]\n");
  CHECK(chunks[2].members == std::vector<std::string>{"[0] loss 0", "[1] loss 1", "[2] loss 2"});
  CHECK(chunks[3].text == "[ranks 0-2] epoch done\n");  // text after a summary: a chunk of its own
  CHECK(chunks[3].members.empty());
  r.stop();
}

TEST_CASE("router: prefixes, cells, windows, tracebacks, progress bars", "[logs]") {
  Inbox inbox;
  LogRouter r(inbox);
  r.add_alloc("a1", "", "xmesh logs a1");
  r.add_alloc("a2", "trainers", "xmesh logs trainers");
  r.set_default_window(-1);
  r.start();

  inbox.push(log_message("a1", 3, "stdout", "c1", "hello\nworld\n"));
  inbox.push(log_message("a2", 0, "stdout", "c2", "named\n"));
  CHECK(output_of(r, "c1", "world") == "[3] hello\n[3] world\n");
  CHECK(output_of(r, "c2", "named") == "[trainers 0] named\n");

  // A line redrawn with '\r' is a progress bar (a board, below), never text; a Windows line
  // ending is a line.
  inbox.push(log_message("a1", 1, "stdout", "c3", "\r 10%\r 20%"));
  inbox.push(log_message("a1", 2, "stdout", "c3", "done\r\n"));
  CHECK(output_of(r, "c3", "done") == "[2] done\n");

  // With a window, lines wait for it; a traceback on stderr does not.
  r.set_options("a1", true, 60000);
  for (int rank = 0; rank < 4; ++rank) inbox.push(log_message("a1", rank, "stdout", "c4", "step 5\n"));
  inbox.push(log_message("a1", 2, "stderr", "c4",
                         "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                         "ValueError: boom\n"));
  CHECK(output_of(r, "c4", "boom") ==
        "[2] Traceback (most recent call last):\n[2]   File \"x.py\", line 1, in <module>\n[2] ValueError: boom\n");
  r.flush_windows();
  CHECK(output_of(r, "c4", "step") == "[ranks 0-3] step 5\n");

  // Lines of an allocation not streamed to the client are counted, not shown.
  r.set_options("a1", false, -1);
  inbox.push(log_message("a1", 0, "stdout", "c5", "quiet\n"));
  REQUIRE(r.sync(3000));
  CHECK(output_of(r, "c5").empty());
  CHECK(r.stats().hidden == 1);
  r.stop();
}

TEST_CASE("router: the flush barrier waits for both streams' marks or their end", "[logs]") {
  Inbox inbox;
  LogRouter r(inbox);
  r.add_alloc("a", "", "");
  r.add_proc("a", 0, "ipc://p0");
  r.start();
  CHECK_FALSE(r.wait_marks({{"ipc://p0", 5}}, 50));
  inbox.push(log_message("a", 0, "stdout", "c", "out\n", 5));
  CHECK_FALSE(r.wait_marks({{"ipc://p0", 5}}, 50));  // stderr has not passed mark 5 yet
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    inbox.push(log_message("a", 0, "stderr", "c", "", 0, true));  // stderr ended
  });
  CHECK(r.wait_marks({{"ipc://p0", 5}}, 5000));
  late.join();
  CHECK(output_of(r, "c", "out") == "[0] out\n");  // the text before the mark is out already
  CHECK(r.wait_marks({{"ipc://unknown", 9}}, 0));     // not ours: nothing to wait for
  r.stop();
}

TEST_CASE("router: a flood is held back past the display budget, every line accounted for", "[logs]") {
  Inbox inbox;
  LogRouter r(inbox);
  r.add_alloc("a", "", "xmesh logs a");
  r.set_display_rate(10, 20);  // 20 lines at once, then 10 per second
  r.start();
  for (int rank = 0; rank < 2; ++rank) {
    std::string text;
    for (int i = 0; i < 500; ++i) text += "line " + std::to_string(i) + "\n";
    inbox.push(log_message("a", rank, "stdout", "c", text));
  }
  REQUIRE(r.sync(3000));
  r.flush_windows();  // publishes every notice still due
  std::string out = output_of(r, "c");
  auto st = r.stats();
  CHECK(st.lines == 1000);
  CHECK(st.shown + st.held == 1000);
  CHECK(st.held >= 900);
  // The notices (one per second of holding: one here, two on a loaded machine) count every held
  // line and say where the lines are.
  uint64_t noticed = 0;
  const std::string tag = "[xmesh] held back ";
  for (size_t at = out.find(tag); at != std::string::npos; at = out.find(tag, at + 1))
    noticed += std::stoull(out.substr(at + tag.size()));
  CHECK(noticed == st.held);
  CHECK(out.find("every line is in the log files: xmesh logs a") != std::string::npos);
  r.stop();
}

TEST_CASE("router: Log bodies are typed and a malformed one is dropped and counted", "[logs]") {
  Inbox inbox;
  LogRouter r(inbox);
  r.add_alloc("a1", "", "xmesh logs a1");
  r.set_default_window(-1);
  r.start();
  // What an agent writes (LogBody), read back the same.
  LogBody body;
  body.alloc = "a1";
  body.rank = 2;
  body.pid = 77;
  body.stream = "stderr";
  body.cell = "c9";
  body.mark = 5;
  json j = body;
  auto back = j.get<LogBody>();
  CHECK((back.alloc == "a1" && back.rank == 2 && back.stream == "stderr" && back.mark == 5 && !back.eof));
  Message good;
  good.header.kind = Kind::Log;
  good.header.body = body;
  std::string text = "typed\n";
  good.frames.emplace_back(text.data(), text.size());
  // No alloc, a rank that is text, a stream that is neither: dropped, counted, nothing shown.
  for (json bad : {json{{"rank", 1}, {"stream", "stdout"}}, json{{"alloc", "a1"}, {"rank", "1"}, {"stream", "stdout"}},
                   json{{"alloc", "a1"}, {"rank", 1}, {"stream", "stdlog"}}}) {
    Message m;
    m.header.kind = Kind::Log;
    m.header.body = bad;
    std::string junk = "junk\n";
    m.frames.emplace_back(junk.data(), junk.size());
    inbox.push(std::move(m));
  }
  inbox.push(std::move(good));
  CHECK(output_of(r, "c9", "typed") == "[2] typed\n");
  CHECK(r.stats().malformed == 3);
  r.stop();
}

TEST_CASE("log file records read back as written, and what is not a record is refused", "[logs]") {
  // The one definition of the per-rank log files (log_record.hpp, layout.hpp): the agent writes
  // with format_record, mesh.logs() and `xmesh logs` read with parse_record.
  std::string whole = format_record(1700000000.25, 'o', true, "Trainer 'trainers'", "step 3: loss 0.5");
  CHECK(whole == "1700000000.250000\to\tTrainer 'trainers'\tstep 3: loss 0.5\n");
  auto r = parse_record(whole);
  REQUIRE(r);
  CHECK((r->time == 1700000000.25 && r->stream == "stdout" && !r->partial && r->actor == "Trainer 'trainers'" &&
         r->text == "step 3: loss 0.5"));
  auto piece = parse_record(format_record(1.5, 'e', false, "", "no newline\twith a tab"));
  REQUIRE(piece);
  CHECK((piece->stream == "stderr" && piece->partial && piece->actor.empty() && piece->text == "no newline\twith a tab"));
  for (const char* bad : {"", "garbage", "1.5\tx\tactor\ttext", "1.5\to\tno text field", "nan-ish\to\ta\tb",
                          "\to\ta\tb", "1.5\too\ta\tb"})
    CHECK_FALSE(parse_record(bad));
  CHECK(layout::rank_log_file("/r/logs/job-1f", 3) == "/r/logs/job-1f/rank3.log");
  CHECK(layout::rank_log_of("rank3.log") == std::make_pair(int64_t(3), 0));
  CHECK(layout::rank_log_of("rank12.log.4") == std::make_pair(int64_t(12), 4));
  for (const char* other : {"procs.json", "rank.log", "rankx.log", "rank3.log.", "rank3.logs", "rank3.log.1a", "xrank3.log"})
    CHECK_FALSE(layout::rank_log_of(other));
}

TEST_CASE("a line redrawn with carriage returns shows what a terminal would", "[logs]") {
  BarLine bar;
  bar.feed("\r  0%|");
  CHECK(bar.text() == "  0%|");
  bar.feed("   | 0/9");  // the rest of a piece cut mid-line
  CHECK(bar.text() == "  0%|   | 0/9");
  bar.feed("\r 50%|#  | 4/9\r100%|###| 9/9");
  CHECK(bar.text() == "100%|###| 9/9");
  CHECK_FALSE(bar.cleared());
  bar.feed("\r        \r");  // tqdm clearing its bar before a message
  CHECK(bar.cleared());
  bar.feed(" 60%");
  CHECK(bar.text() == " 60%");
  BarLine trailing;  // print(f"{p}%", end="\r")
  trailing.feed("10%\r");
  trailing.feed("20%\r");
  CHECK(trailing.text() == "20%");
  trailing.feed("done");
  CHECK(trailing.text() == "done");
  trailing.end();
  CHECK(trailing.bars == 1);
  CHECK(trailing.text().empty());
}

namespace {

std::vector<LogChunk> chunks_until(LogRouter& r, const std::function<bool(const std::vector<LogChunk>&)>& done) {
  std::vector<LogChunk> all;
  int64_t deadline = now_ms() + 5000;
  while (!done(all) && now_ms() < deadline) {
    r.wait_output(50);
    for (auto& c : r.take_output()) all.push_back(std::move(c));
  }
  return all;
}

std::string rows_of(const LogChunk& c) {
  std::string s;
  for (auto& row : c.rows) s += std::to_string(row.rank) + "=" + row.text + (row.done ? "." : "") + ";";
  return s;
}

}  // namespace

TEST_CASE("router: the bars of several ranks are rows of one board, in place of text", "[logs]") {
  Inbox inbox;
  LogRouter r(inbox);
  r.add_alloc("a", "", "");
  r.set_default_window(-1);
  r.start();
  auto last_board = [](const std::vector<LogChunk>& cs, size_t nth) {
    std::vector<std::string> ids;
    const LogChunk* last = nullptr;
    for (auto& c : cs) {
      if (c.board.empty()) continue;
      if (std::find(ids.begin(), ids.end(), c.board) == ids.end()) ids.push_back(c.board);
      if (ids.size() > nth && c.board == ids[nth]) last = &c;
    }
    return last;
  };
  inbox.push(log_message("a", 0, "stderr", "c", "before\n\r 10%"));
  inbox.push(log_message("a", 1, "stderr", "c", "\r 50%"));
  inbox.push(log_message("a", 1, "stderr", "c", "\r      \rnote\n"));  // tqdm.write over a bar
  inbox.push(log_message("a", 0, "stderr", "c", "\r100%"));
  inbox.push(log_message("a", 0, "stderr", "c", "\n"));  // tqdm's close: the bar's end
  inbox.push(log_message("a", 0, "stderr", "c", "\r 1/3"));  // the rank's next bar: the next board
  inbox.push(log_message("a", 1, "stderr", "c", "\r 90%"));
  r.flush_windows();
  auto cs = chunks_until(r, [&](auto& all) {
    auto b0 = last_board(all, 0);
    auto b1 = last_board(all, 1);
    return b0 && b1 && rows_of(*b0) == "0=100%.;1= 90%;" && rows_of(*b1) == "0= 1/3;";
  });
  REQUIRE(last_board(cs, 1));
  CHECK(rows_of(*last_board(cs, 0)) == "0=100%.;1= 90%;");
  CHECK(rows_of(*last_board(cs, 1)) == "0= 1/3;");
  std::string text;
  for (auto& c : cs) text += c.text;
  CHECK(text == "[0] before\n[1] note\n");  // no redraw, no empty line: the bars are boards
  // The board's first chunk comes after the text printed before it.
  auto first = std::find_if(cs.begin(), cs.end(), [](auto& c) { return !c.board.empty(); });
  REQUIRE(first != cs.end());
  CHECK(std::find_if(cs.begin(), first, [](auto& c) { return c.text.find("before") != std::string::npos; }) != first);
  // A bar in another cell starts that cell's first board.
  inbox.push(log_message("a", 0, "stderr", "d", "\r 5%"));
  r.flush_windows();
  auto ds = chunks_until(r, [](auto& all) { return !all.empty(); });
  REQUIRE(ds.size() == 1);
  CHECK(ds[0].cell == "d");
  CHECK(ds[0].board.find("xmesh-bars-d-") == 0);
  r.stop();
}

TEST_CASE("progress boards: shown at once when new or when a bar ends, else at most every interval", "[logs]") {
  ProgressBoards boards;
  CHECK(boards.set_row("c", "a", 2, 0, "", 0, " 1%", false));  // new
  CHECK(boards.next_due(1000) == 0);
  auto due = boards.take_due(1000, false);
  REQUIRE(due.size() == 1);
  CHECK_FALSE(boards.set_row("c", "a", 2, 0, "", 1, " 2%", false));
  CHECK(boards.next_due(1010) == ProgressBoards::kUpdateMs - 10);
  CHECK(boards.take_due(1010, false).empty());
  CHECK(boards.take_due(1010, true).size() == 1);  // forced (a flush)
  boards.set_row("c", "a", 2, 0, "", 1, "100%", true);  // a bar's end is not held back
  CHECK(boards.take_due(1020, false).size() == 1);
  CHECK(boards.next_due(1020) == -1);
}
