// The debugger's C++ core: rank selectors (Monarch's grammar) and stack grouping.
#include <catch2/catch.hpp>

#include "rank_selector.hpp"
#include "stack_groups.hpp"

using namespace xmesh;
using V = std::vector<int64_t>;

TEST_CASE("rank selectors pick ranks by number, slice or dimension", "[debugger]") {
  std::vector<std::string> labels{"hosts", "gpus"};
  V sizes{3, 8};
  CHECK(select_ranks("ranks(3)", labels, sizes) == V{3});
  CHECK(select_ranks("ranks(1,4,6)", labels, sizes) == V{1, 4, 6});
  CHECK(select_ranks("ranks(6, 1, 4, 4)", labels, sizes) == V{1, 4, 6});
  CHECK(select_ranks("ranks(2:8:2)", labels, sizes) == V{2, 4, 6});
  CHECK(select_ranks("ranks(:3)", labels, sizes) == V{0, 1, 2});
  CHECK(select_ranks("ranks(22:)", labels, sizes) == V{22, 23});
  CHECK(select_ranks("ranks(-1)", labels, sizes) == V{23});
  CHECK(select_ranks("ranks(::-10)", labels, sizes) == V{3, 13, 23});
  CHECK(select_ranks("ranks(0, 20:22)", labels, sizes) == V{0, 20, 21});
  CHECK(select_ranks("ranks(gpus=0:4, hosts=(0,2))", labels, sizes) == V{0, 1, 2, 3, 16, 17, 18, 19});
  CHECK(select_ranks("ranks(hosts=1)", labels, sizes) == V{8, 9, 10, 11, 12, 13, 14, 15});
  CHECK(select_ranks("ranks(gpus=7)", labels, sizes) == V{7, 15, 23});
  CHECK(select_ranks(" ranks ( gpus = ( 1 , ) ) ", labels, sizes) == V{1, 9, 17});
  CHECK(select_ranks("ranks(gpus=::4, hosts=-1)", labels, sizes) == V{16, 20});

  // the end of the selector in a command line
  std::string line = "ranks(gpus=(0,2), hosts=1) p x + (1, 2)";
  CHECK(line.substr(0, rank_selector_end(line, 0)) == "ranks(gpus=(0,2), hosts=1)");
}

TEST_CASE("rank selector errors name the problem", "[debugger]") {
  std::vector<std::string> labels{"hosts", "gpus"};
  V sizes{2, 4};
  auto error_of = [&](const std::string& s) {
    try {
      select_ranks(s, labels, sizes);
    } catch (const RankSelectorError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error_of("ranks(8)"), Catch::Contains("rank 8 is out of range: there are 8 (0-7)"));
  CHECK_THAT(error_of("ranks(gpus=4)"), Catch::Contains("index of 'gpus' 4 is out of range: there are 4 (0-3)"));
  CHECK_THAT(error_of("ranks(gpu=1)"), Catch::Contains("no dimension 'gpu' (its dimensions: hosts, gpus)"));
  CHECK_THAT(error_of("ranks(gpus=1, gpus=2)"), Catch::Contains("'gpus' is given twice"));
  CHECK_THAT(error_of("ranks(1, gpus=2)"), Catch::Contains("mixes plain ranks and dimensions"));
  CHECK_THAT(error_of("ranks(0:4:0)"), Catch::Contains("step cannot be zero"));
  CHECK_THAT(error_of("ranks(5:5)"), Catch::Contains("selects no rank"));
  CHECK_THAT(error_of("ranks()"), Catch::Contains("no ranks given"));
  CHECK_THAT(error_of("ranks(1"), Catch::Contains("malformed rank selector"));
  CHECK_THAT(error_of("ranks(1) x"), Catch::Contains("unexpected text after the selector"));
  CHECK_THAT(error_of("ranks(a b)"), Catch::Contains("malformed"));
  CHECK_THAT(error_of("ranks(gpus=())"), Catch::Contains("an empty tuple selects nothing"));
  CHECK_THAT(error_of("ranks(99999999999999999999)"), Catch::Contains("number too large"));
  CHECK_THROWS_WITH(rank_selector_end("rank(1) p x", 0), Catch::Contains("expected a rank selector"));
  CHECK_THROWS_WITH(rank_selector_end("ranks(1 p x", 0), Catch::Contains("no closing parenthesis"));
}

TEST_CASE("thread dumps parse into outermost-first stacks", "[debugger]") {
  std::string dump =
      "Thread 0x00007f0e4a3fe6c0 (most recent call first):\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 320 in wait\n"
      "  File \"/w/train.py\", line 12 in step\n"
      "  File \"/w/it's \"quoted\".py\", line 3 in <module>\n"
      "\n"
      "Current thread 0x0000000000000010 (most recent call first):\n"
      "  <no Python frame>\n"
      "garbage line\n"
      "Thread 0x20 (most recent call first):\n"
      "  File \"/w/x.py\", line ??? in f\n";
  auto threads = parse_thread_dump(dump);
  REQUIRE(threads.size() == 3);
  CHECK(threads[0].ident == 0x00007f0e4a3fe6c0ULL);
  CHECK_FALSE(threads[0].current);
  REQUIRE(threads[0].frames.size() == 3);
  CHECK(threads[0].frames[0].file == "/w/it's \"quoted\".py");
  CHECK(threads[0].frames[1] == StackFrame{"/w/train.py", 12, "step"});
  CHECK(threads[0].frames[2].function == "wait");
  CHECK(threads[1].current);
  CHECK(threads[1].frames.empty());
  REQUIRE(threads[2].frames.size() == 1);
  CHECK(threads[2].frames[0].line == 0);
}

TEST_CASE("stacks of many ranks merge into groups, largest first", "[debugger]") {
  std::vector<StackFrame> a{{"t.py", 1, "main"}, {"t.py", 9, "step"}};
  std::vector<StackFrame> b{{"t.py", 1, "main"}, {"t.py", 20, "allreduce"}};
  std::vector<RankStack> stacks;
  for (int64_t r = 0; r < 16; ++r) stacks.push_back({r, "running", r == 11 ? b : a});
  stacks.push_back({16, "stopped", a});
  auto groups = group_stacks(stacks);
  REQUIRE(groups.size() == 3);
  CHECK(groups[0].ranks.size() == 15);
  CHECK(groups[0].state == "running");
  CHECK(groups[1].ranks == V{11});  // the odd rank out comes after the big group
  CHECK(groups[1].frames == b);
  CHECK(groups[2].state == "stopped");  // same frames, another state: a group of its own
  CHECK(groups[2].ranks == V{16});
}
