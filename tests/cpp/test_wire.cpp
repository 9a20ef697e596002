#include <catch2/catch.hpp>
#include <random>

#include "wire.hpp"

using namespace xmesh;

TEST_CASE("header round trip keeps every field", "[wire]") {
  Header h;
  h.kind = Kind::Call;
  h.sender = "controller-host-1-abcd";
  h.incarnation = 0xdeadbeefcafeULL;
  h.seq = 42;
  h.corr = 7;
  h.index = 3;
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
  CHECK(d->corr == 7);
  CHECK(d->index == 3);
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

TEST_CASE("decoder survives 20000 random and truncated frames", "[wire][fuzz]") {
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
