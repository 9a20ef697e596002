// The one link-upgrade state machine (runtime/transport/link.hpp) every link kind goes through,
// on a writer that records what was done to it. The real links (rings, lanes) go through it in
// test_ring_links.cpp, test_link_faults.cpp and test_resend.cpp.
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "link.hpp"

using namespace xmesh;

namespace {
constexpr LinkSpec kSpec{"test link", Kind::RingOffer, Kind::RingAccept, Kind::RingSwitch, /*breaks_allowed=*/2,
                         /*numbered=*/false};

// A writer whose readiness the test sets, recording its switch, its close and its interrupt.
struct RecordingWriter : LinkWriter {
  bool is_ready = false, was_switched = false, was_closed = false, was_interrupted = false;
  std::string failure;
  bool ready(std::string* failed) override {
    *failed = failure;
    return is_ready;
  }
  LinkWrite write(const std::vector<uint8_t>&, const std::vector<zmq::message_t>&, bool, int, uint32_t) override {
    return LinkWrite::ok;
  }
  std::string error() const override { return ""; }
  void switched() override { was_switched = true; }
  void close() override { was_closed = true; }
  void interrupt() override { was_interrupted = true; }
};
}  // namespace

TEST_CASE("a link is proposed only after a call or its answer, and only when idle", "[link_upgrade][inv:transport.2]") {
  LinkUpgrade up(kSpec);
  CHECK(up.state() == LinkUpgrade::State::idle);
  CHECK(up.due(Kind::Call));
  CHECK(up.due(Kind::Reply));
  CHECK(up.due(Kind::Replies));
  CHECK_FALSE(up.due(Kind::Configure));
  CHECK_FALSE(up.due(Kind::Hello));
  up.proposed(nullptr);
  CHECK(up.state() == LinkUpgrade::State::proposed);
  CHECK_FALSE(up.due(Kind::Call));  // one proposal at a time
}

TEST_CASE("an upgrade goes proposed, armed, active, and its writer hears the switch", "[link_upgrade][inv:transport.2]") {
  LinkUpgrade up(kSpec);
  auto made = std::make_shared<RecordingWriter>();
  up.proposed(made);  // a ring: made with the proposal
  CHECK(up.writer() == made.get());
  up.armed(made);
  CHECK(up.state() == LinkUpgrade::State::armed);
  CHECK_FALSE(up.up());
  up.switched();
  CHECK(up.state() == LinkUpgrade::State::active);
  CHECK(made->was_switched);
  CHECK(up.up());
  CHECK(up.writer_for_interrupt() == made);
}

TEST_CASE("a link that breaks is proposed again, until breaks_allowed broke: then ZeroMQ alone", "[link_upgrade][inv:transport.3]") {
  LinkUpgrade up(kSpec);
  for (int round = 1; round <= kSpec.breaks_allowed; ++round) {
    auto w = std::make_shared<RecordingWriter>();
    up.proposed(nullptr);  // a lane: its writer comes with the answer
    up.armed(w);
    up.switched();
    auto given = up.give_up(/*count_break=*/true);
    CHECK(given == w);
    CHECK(w->was_closed);
    CHECK_FALSE(up.up());
    CHECK(up.writer() == nullptr);
    CHECK(up.writer_for_interrupt() == nullptr);
    CHECK(up.breaks() == round);
    CHECK(up.state() == (round < kSpec.breaks_allowed ? LinkUpgrade::State::idle : LinkUpgrade::State::declined));
  }
  CHECK_FALSE(up.due(Kind::Call));
}

TEST_CASE("a proposal that could not be sent is not a break; a refusal declines for good", "[link_upgrade]") {
  LinkUpgrade up(kSpec);
  auto w = std::make_shared<RecordingWriter>();
  up.proposed(w);
  up.give_up(/*count_break=*/false);
  CHECK(w->was_closed);
  CHECK(up.breaks() == 0);
  CHECK(up.state() == LinkUpgrade::State::idle);
  CHECK(up.due(Kind::Call));
  auto second = std::make_shared<RecordingWriter>();
  up.proposed(second);
  up.declined();
  CHECK(second->was_closed);
  CHECK(up.state() == LinkUpgrade::State::declined);
  CHECK_FALSE(up.due(Kind::Reply));
}

TEST_CASE("closing a peer's link keeps its state but closes its writer and says it is not up", "[link_upgrade]") {
  LinkUpgrade up(kSpec);
  auto w = std::make_shared<RecordingWriter>();
  up.proposed(w);
  up.armed(w);
  up.switched();
  up.close();
  CHECK(w->was_closed);
  CHECK_FALSE(up.up());
  CHECK(link_state_name(up.state()) == std::string("active"));
}
