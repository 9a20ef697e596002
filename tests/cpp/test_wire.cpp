#include <catch2/catch.hpp>
#include <limits>
#include <random>

#include "bodies.hpp"
#include "node_bodies.hpp"
#include "sync_bodies.hpp"
#include "node.hpp"
#include "role.hpp"
#include "wire.hpp"

using namespace xmesh;

TEST_CASE("header round trip keeps every field", "[wire]") {
  Header h;
  h.kind = Kind::Call;
  h.sender = "controller-host-1-abcd";
  h.incarnation = 0xdeadbeefcafeULL;
  h.seq = 42;
  h.oseq = 1ULL << 33;
  h.corr = 7;
  h.index = 3;
  h.ok = true;
  h.actor = "trainer.0a1b";
  h.method = "step";
  h.ctx = {{"cell", 5}, {"call", 9}};
  h.body = {{"adverb", "call"}, {"n", 1}};
  auto bytes = encode_header(h);
  std::string err;
  auto d = decode_header(bytes.data(), bytes.size(), err);
  REQUIRE(d);
  CHECK(d->kind == Kind::Call);
  CHECK(d->sender == h.sender);
  CHECK(d->incarnation == h.incarnation);
  CHECK(d->seq == 42);
  CHECK(d->oseq == 1ULL << 33);
  CHECK(d->corr == 7);
  CHECK(d->index == 3);
  CHECK(d->ok);
  CHECK(d->actor == "trainer.0a1b");
  CHECK(d->method == "step");
  CHECK(d->ctx == h.ctx);
  CHECK(d->body == h.body);
}

TEST_CASE("optional fields are omitted and decode as defaults", "[wire]") {
  Header h;
  h.kind = Kind::Heartbeat;
  h.sender = "x";
  auto bytes = encode_header(h);
  std::string err;
  auto d = decode_header(bytes.data(), bytes.size(), err);
  REQUIRE(d);
  CHECK(d->index == -1);
  CHECK(d->corr == 0);
  CHECK(d->body.is_null());
}

TEST_CASE("decoder rejects malformed headers with a reason", "[wire]") {
  std::string err;
  CHECK_FALSE(decode_header("", 0, err));
  CHECK(err == "empty header frame");
  auto not_map = json::to_cbor(json::array({1, 2}));
  CHECK_FALSE(decode_header(not_map.data(), not_map.size(), err));
  CHECK(err == "header is not a map");
  auto bad_kind = json::to_cbor(json{{"k", 999}, {"s", "x"}});
  CHECK_FALSE(decode_header(bad_kind.data(), bad_kind.size(), err));
  CHECK(err.find("unknown message kind 999") != std::string::npos);
  auto no_sender = json::to_cbor(json{{"k", 10}});
  CHECK_FALSE(decode_header(no_sender.data(), no_sender.size(), err));
  auto bad_seq = json::to_cbor(json{{"k", 10}, {"s", "x"}, {"q", "seven"}});
  CHECK_FALSE(decode_header(bad_seq.data(), bad_seq.size(), err));
  CHECK(err.find("'q'") != std::string::npos);
  auto bad_body = json::to_cbor(json{{"k", 10}, {"s", "x"}, {"b", 3}});
  CHECK_FALSE(decode_header(bad_body.data(), bad_body.size(), err));
  auto neg_index = json::to_cbor(json{{"k", 10}, {"s", "x"}, {"r", -4}});
  CHECK_FALSE(decode_header(neg_index.data(), neg_index.size(), err));
}

TEST_CASE("decoder survives 20000 random and truncated frames", "[wire][fuzz][inv:protocol.1]") {
  std::mt19937_64 rng(12345);
  Header h;
  h.kind = Kind::Reply;
  h.sender = "proc-a";
  h.corr = 99;
  h.body = {{"ok", true}, {"text", std::string(100, 'x')}, {"list", {1, 2, 3}}};
  auto good = encode_header(h);
  size_t decoded = 0, rejected = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> buf;
    switch (i % 4) {
      case 0: {  // pure noise
        buf.resize(rng() % 512);
        for (auto& b : buf) b = static_cast<uint8_t>(rng());
        break;
      }
      case 1:  // truncation of a valid header
        buf.assign(good.begin(), good.begin() + static_cast<long>(rng() % good.size()));
        break;
      case 2: {  // bit flips in a valid header
        buf = good;
        for (int k = 0; k < 3; ++k) buf[rng() % buf.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      }
      default: {  // CBOR-looking prefixes with random lengths (huge declared sizes)
        buf = {0xbf, 0x61, 0x6b, 0x1b};
        for (int k = 0; k < 8; ++k) buf.push_back(static_cast<uint8_t>(rng()));
        break;
      }
    }
    std::string err;
    auto d = decode_header(buf.data(), buf.size(), err);
    if (d) {
      ++decoded;
      CHECK(kind_known(static_cast<int>(d->kind)));
      CHECK_FALSE(d->sender.empty());
    } else {
      ++rejected;
      CHECK_FALSE(err.empty());
    }
  }
  CHECK(decoded + rejected == 20000);
  CHECK(rejected > 15000);
}

TEST_CASE("the fast decoder and the general one agree", "[wire]") {
  std::vector<json> headers = {
      {{"k", 10}, {"s", "a"}, {"q", 3}, {"m", "f"}, {"a", "x.1"}, {"c", 99}, {"r", 0}},
      {{"k", 10}, {"s", "a"}, {"u", 12}, {"q", 3}},
      {{"k", 10}, {"s", "a"}, {"u", "x"}},      // 'u' not an unsigned integer: both refuse
      {{"s", "b"}, {"k", 11}, {"o", true}, {"c", 1ULL << 40}, {"r", 70000}, {"i", 18446744073709551615ULL}},
      {{"k", 11}, {"s", "c"}, {"o", false}, {"b", {{"kind", "actor"}, {"text", "boom"}}}},
      {{"k", 25}, {"s", std::string(300, 'z')}},
      {{"k", 10}, {"s", "d"}, {"x", {{"cell", 3}}}},
      {{"k", 10}, {"s", "d"}, {"x", "cell-7"}, {"m", "f"}},  // a cell's id: read by hand
      {{"k", 10}, {"s", "d"}, {"x", 7}},                     // any other ctx: the general decoder
      {{"k", 10}, {"s", "e"}, {"zz", 1}},      // unknown key: general decoder (ignored there)
      {{"k", 10}, {"s", "f"}, {"q", -1}},      // bad field: both refuse
      {{"k", 10}, {"s", "g"}, {"o", 1}},       // 'o' not a boolean: both refuse
      {{"k", 10}},                             // no sender: both refuse
  };
  for (auto& j : headers) {
    auto bytes = json::to_cbor(j);
    std::string e1, e2;
    auto fast = decode_header(bytes.data(), bytes.size(), e1);
    auto general = decode_header_general(bytes.data(), bytes.size(), e2);
    INFO(j.dump());
    REQUIRE(fast.has_value() == general.has_value());
    if (!fast) continue;
    CHECK(fast->kind == general->kind);
    CHECK(fast->sender == general->sender);
    CHECK(fast->incarnation == general->incarnation);
    CHECK(fast->seq == general->seq);
    CHECK(fast->oseq == general->oseq);
    CHECK(fast->corr == general->corr);
    CHECK(fast->index == general->index);
    CHECK(fast->ok == general->ok);
    CHECK(fast->actor == general->actor);
    CHECK(fast->method == general->method);
    CHECK(fast->ctx == general->ctx);
    CHECK(fast->body == general->body);
  }
  // What the encoder writes is what nlohmann would read back.
  Header h;
  h.kind = Kind::Reply;
  h.sender = "s";
  h.corr = 5;
  h.ok = true;
  h.body = {{"n", 1}};
  auto bytes = encode_header(h);
  json j = json::from_cbor(bytes);
  CHECK(j["k"] == 11);
  CHECK(j["o"] == true);
  CHECK(j["b"]["n"] == 1);
}

// A header whose body holds `depth` nested arrays: {"k": Configure, "s": "x", "b": {"d": [[...[0]...]]}}.
static std::string nested_header(size_t depth) {
  std::string out;
  out += '\xa3';  // map of 3
  out += "\x61k";
  out += static_cast<char>(0x18);  // uint8 follows
  out += static_cast<char>(static_cast<int>(Kind::Configure));
  out += "\x61s\x61x";
  out += "\x61" "b";
  out += '\xa1';  // map of 1
  out += "\x61" "d";
  out.append(depth, '\x81');  // array of 1, nested
  out += '\x00';
  return out;
}

TEST_CASE("a header nested too deep is refused before it is decoded", "[wire][security][inv:protocol.1]") {
  // Issue 16, defect 1: a header nested 40,000 levels deep (40 KB) overflowed the stack of the
  // node that decoded it (any node, before any Hello).
  std::string err;
  auto deep = nested_header(40000);
  CHECK_FALSE(decode_header(deep.data(), deep.size(), err));
  CHECK(err == "header frame nests deeper than 32 levels");
  auto fine = nested_header(25);
  auto h = decode_header(fine.data(), fine.size(), err);
  REQUIRE(h);
  CHECK(h->body["d"].is_array());
  // Declared sizes beyond the frame, indefinite lengths and trailing bytes are refused as well.
  std::string huge_array = std::string("\xa1\x61k\x9b") + std::string(8, '\xff');
  CHECK_FALSE(decode_header(huge_array.data(), huge_array.size(), err));
  CHECK(err == "header frame declares more items than it has bytes");
  std::string indefinite = "\xa1\x61k\x9f\xff";
  CHECK_FALSE(decode_header(indefinite.data(), indefinite.size(), err));
  CHECK(err == "header frame holds an indefinite-length or reserved item");
  auto ok = json::to_cbor(json{{"k", 10}, {"s", "x"}});
  ok.push_back(0x00);
  CHECK_FALSE(decode_header(ok.data(), ok.size(), err));
}

TEST_CASE("numbers that do not fit a body's integer fields are refused, naming the field", "[wire][security][inv:protocol.2]") {
  // Found by fuzz_wire: a NaN (or 1e30, or -1 into an unsigned) for an integer field was converted
  // with undefined behaviour.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const json& rank : {json(nan), json(1e30), json(-1e30), json(std::numeric_limits<double>::infinity())}) {
    std::string why;
    CHECK_FALSE(read_as<ProcExitedBody>({{"alloc", "a1"}, {"rank", rank}, {"addr", "ipc:///x"}, {"text", "t"}}, &why));
    CHECK(why == "ProcExited body: 'rank' is out of range");
  }
  std::string why;
  CHECK_FALSE(read_as<SyncStepBody>({{"op", "data"}, {"sid", "ab"}, {"pieces", {{0, -1, 2, 2, 0}}}}, &why));
  CHECK(why == "Sync body: 'pieces' is out of range");
  CHECK_FALSE(read_as<SyncStepBody>({{"op", "data"}, {"sid", "ab"}, {"pieces", {{0, nan, 2, 2, 0}}}}, &why));
  // What fits still reads, floats of integral value included (as before).
  auto ok = read_as<ProcExitedBody>({{"alloc", "a1"}, {"rank", 3.0}, {"addr", "ipc:///x"}, {"text", "t"}}, &why);
  REQUIRE(ok);
  CHECK(ok->rank == 3);
  CHECK(read_as<SyncStepBody>({{"op", "data"}, {"sid", "ab"}, {"pieces", {{0, 1, 2, 2, 0}}}}));
}

TEST_CASE("a Call body names its extent and reply port consistently, or is refused", "[wire][security]") {
  std::string why;
  auto ok = read_as<CallBody>({{"labels", {"hosts", "gpus"}}, {"sizes", {2, 3}}, {"rank", 5}}, &why);
  REQUIRE(ok);
  CHECK(ok->sizes->at(1) == 3);
  CHECK(read_as<CallBody>(json::object()));  // the fast path's empty body
  CHECK(read_as<CallBody>({{"reply_addr", "ipc:///x"}, {"reply_corr", 4}}));
  CHECK_FALSE(read_as<CallBody>({{"labels", {"gpus"}}}, &why));
  CHECK(why == "Call body: labels and sizes come together");
  CHECK_FALSE(read_as<CallBody>({{"labels", {"gpus"}}, {"sizes", {2, 3}}}, &why));
  CHECK_FALSE(read_as<CallBody>({{"labels", {"gpus"}}, {"sizes", {4}}, {"rank", 4}}, &why));
  CHECK(why == "Call body: rank is outside the extent");
  CHECK_FALSE(read_as<CallBody>({{"labels", {"a", "b", "c"}}, {"sizes", {1 << 20, 1 << 20, 1 << 20}}}, &why));
  CHECK_FALSE(read_as<CallBody>({{"reply_addr", "ipc:///x"}}, &why));
  CHECK(why == "Call body: reply_addr and reply_corr come together");
  CHECK_FALSE(read_as<CallBody>({{"rank", -2}}, &why));
}

TEST_CASE("a node's role is one of three, named as node ids name it; another is refused naming them", "[wire]") {
  for (Role r : {Role::controller, Role::proc, Role::hostd}) CHECK(parse_role(role_name(r)) == r);
  CHECK(takes_fast_links(Role::proc));
  CHECK_FALSE(takes_fast_links(Role::hostd));
  CHECK_THROWS_WITH(parse_role("relay"), Catch::Contains("a controller, a proc or a hostd"));
  CHECK_THROWS_WITH(Node("worker", "ipc:///tmp/xmesh-test-role", "k"), Catch::Contains("unknown node role 'worker'"));
}
