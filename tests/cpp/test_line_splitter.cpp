#include <catch2/catch.hpp>

#include "line_splitter.hpp"

using namespace xmesh;

TEST_CASE("lines are released whole", "[logs]") {
  LineSplitter s;
  CHECK(s.feed("hel", 3, 0) == "");
  CHECK(s.feed("lo\nwor", 6, 1) == "hello\n");
  CHECK(s.has_partial());
  CHECK(s.flush_partial(50, 100) == "");  // not waited long enough
  CHECK(s.flush_partial(200, 100) == "wor");
  CHECK_FALSE(s.has_partial());
}

TEST_CASE("long lines are cut, never dropped", "[logs]") {
  LineSplitter s(8);
  std::string big(20, 'x');
  std::string out = s.feed(big.data(), big.size(), 0);
  CHECK(out == "xxxxxxxx\nxxxxxxxx\n");
  CHECK(s.flush_partial(0, -1) == "xxxx");
}

TEST_CASE("carriage returns pass through", "[logs]") {
  LineSplitter s;
  std::string bar = "10%\r50%\r100%\n";
  CHECK(s.feed(bar.data(), bar.size(), 0) == bar);
}
