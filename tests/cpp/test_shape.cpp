#include <catch2/catch.hpp>

#include "shape.hpp"

using namespace xmesh;
using V = std::vector<int64_t>;

TEST_CASE("dense shapes enumerate ranks row-major", "[shape]") {
  auto s = Shape::dense({"hosts", "gpus"}, {2, 4});
  CHECK(s.size() == 8);
  CHECK(s.ranks() == V{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(s.coords_of(5) == V{1, 1});
  CHECK(s.slice().rank_at({1, 3}) == 7);
  CHECK(s.to_string() == "{'hosts': 2, 'gpus': 4}");
}

TEST_CASE("select keeps a dimension, at drops it", "[shape]") {
  auto s = Shape::dense({"hosts", "gpus"}, {2, 4});
  auto a = s.select("gpus", 1, 4, 2);
  CHECK(a.labels() == std::vector<std::string>{"hosts", "gpus"});
  CHECK(a.ranks() == V{1, 3, 5, 7});
  auto b = s.at("hosts", 1);
  CHECK(b.labels() == std::vector<std::string>{"gpus"});
  CHECK(b.ranks() == V{4, 5, 6, 7});
  auto c = b.select("gpus", 2, 100, 1);  // stop clamps
  CHECK(c.ranks() == V{6, 7});
  CHECK(c.local_index_of(7) == 1);
  CHECK(c.local_index_of(0) == -1);
}

TEST_CASE("bad selections raise the right error types", "[shape]") {
  auto s = Shape::dense({"gpus"}, {4});
  try {
    s.at("hosts", 0);
    FAIL("expected an error");
  } catch (const ShapeError& e) {
    CHECK(e.type == ShapeError::TypeErr);
    CHECK(std::string(e.what()).find("'hosts'") != std::string::npos);
  }
  try {
    s.at("gpus", 4);
    FAIL("expected an error");
  } catch (const ShapeError& e) {
    CHECK(e.type == ShapeError::IndexErr);
  }
  CHECK_THROWS_AS(s.select("gpus", 3, 2, 1), ShapeError);
  CHECK_THROWS_AS(s.select("gpus", 0, 4, 0), ShapeError);
  CHECK_THROWS_AS(Shape::dense({"a", "a"}, {1, 2}), ShapeError);
  CHECK_THROWS_AS(Shape::dense({"a"}, {0}), ShapeError);
}

TEST_CASE("flatten needs a dense mesh", "[shape]") {
  auto s = Shape::dense({"hosts", "gpus"}, {2, 4});
  auto f = s.flatten("all");
  CHECK(f.labels() == std::vector<std::string>{"all"});
  CHECK(f.ranks() == V{0, 1, 2, 3, 4, 5, 6, 7});
  auto row = s.at("hosts", 1).flatten("g");
  CHECK(row.ranks() == V{4, 5, 6, 7});
  CHECK_THROWS_AS(s.select("gpus", 0, 4, 2).flatten("x"), ShapeError);
}

TEST_CASE("split infers one size and keeps the ranks", "[shape]") {
  auto s = Shape::dense({"hosts", "gpus"}, {2, 8});
  auto t = s.split({{"gpus", {"dp", "tp"}}}, {{"tp", 2}});
  CHECK(t.labels() == std::vector<std::string>{"hosts", "dp", "tp"});
  CHECK(t.slice().sizes == V{2, 4, 2});
  CHECK(t.ranks() == s.ranks());
  CHECK(t.at("dp", 1).at("hosts", 1).ranks() == V{10, 11});
  CHECK_THROWS_AS(s.split({{"gpus", {"a", "b"}}}, {}), ShapeError);          // two unknowns
  CHECK_THROWS_AS(s.split({{"gpus", {"a", "b"}}}, {{"b", 3}}), ShapeError);  // not divisible
  CHECK_THROWS_AS(s.split({{"gpus", {"a"}}}, {{"zz", 3}}), ShapeError);      // unused constraint
  CHECK_THROWS_AS(s.split({{"nope", {"a"}}}, {}), ShapeError);
  auto r = s.rename({{"gpus", "workers"}});
  CHECK(r.labels() == std::vector<std::string>{"hosts", "workers"});
  CHECK(r.ranks() == s.ranks());
}

TEST_CASE("shapes survive a json round trip", "[shape]") {
  auto s = Shape::dense({"hosts", "gpus"}, {2, 4}).select("gpus", 1, 3, 1);
  CHECK(Shape::from_json(s.to_json()) == s);
  CHECK_THROWS_AS(Shape::from_json(nlohmann::json{{"labels", 3}}), ShapeError);
}
