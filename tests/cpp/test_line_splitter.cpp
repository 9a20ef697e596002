#include <catch2/catch.hpp>

#include "line_splitter.hpp"

using namespace xmesh;

TEST_CASE("lines are released whole", "[logs]") {
  LineSplitter s;
  CHECK(s.feed("hel", 3, 0).empty());
  CHECK(s.feed("lo\nwor", 6, 1) == std::vector<std::string>{"hello\n"});
  CHECK(s.has_partial());
  CHECK(s.flush_partial(50, 100) == "");  // not waited long enough
  CHECK(s.flush_partial(200, 100) == "wor");
  CHECK_FALSE(s.has_partial());
}

TEST_CASE("long lines are cut, never dropped", "[logs]") {
  LineSplitter s(8);
  std::string big = "ok\n" + std::string(20, 'x');
  // Pieces are chunks of their own, without a newline: continuations, not lines.
  CHECK(s.feed(big.data(), big.size(), 0) == std::vector<std::string>{"ok\n", "xxxxxxxx", "xxxxxxxx"});
  CHECK(s.flush_partial(0, -1) == "xxxx");
  // Issue 16, defect 10: a line of an exact multiple of the piece size left an empty line.
  LineSplitter t(8);
  std::string exact = std::string(16, 'y') + "\nnext\n";
  // The line's own newline comes after its last piece: it ends that piece (the router shows no
  // empty line for it), whether it comes in the same read or the next.
  CHECK(t.feed(exact.data(), exact.size(), 0) == std::vector<std::string>{"yyyyyyyy", "yyyyyyyy", "\nnext\n"});
  LineSplitter u(8);
  CHECK(u.feed(exact.data(), 16, 0) == std::vector<std::string>{"yyyyyyyy", "yyyyyyyy"});
  CHECK(u.feed(exact.data() + 16, exact.size() - 16, 1) == std::vector<std::string>{"\nnext\n"});
}

TEST_CASE("carriage returns pass through", "[logs]") {
  LineSplitter s;
  std::string bar = "10%\r50%\r100%\n";
  CHECK(s.feed(bar.data(), bar.size(), 0) == std::vector<std::string>{bar});
}
