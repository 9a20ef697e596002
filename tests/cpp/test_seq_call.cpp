#include <catch2/catch.hpp>
#include <thread>

#include "call.hpp"
#include "seq.hpp"
#include "waker.hpp"

using namespace xmesh;

TEST_CASE("sequence tracker classifies arrivals", "[seq]") {
  SeqTracker t;
  CHECK(t.accept(7, 1) == SeqTracker::InOrder);
  CHECK(t.accept(7, 2) == SeqTracker::InOrder);
  CHECK(t.accept(7, 2) == SeqTracker::Duplicate);
  CHECK(t.accept(7, 1) == SeqTracker::Duplicate);
  CHECK(t.accept(7, 5) == SeqTracker::Gap);
  CHECK(t.last() == 5);
  // A restarted sender (new incarnation) starts again from 1 without being a duplicate.
  CHECK(t.accept(8, 1) == SeqTracker::NewIncarnation);
  CHECK(t.accept(8, 2) == SeqTracker::InOrder);
}

static CallResult ok_result(int64_t i) {
  CallResult r;
  r.index = i;
  r.ok = true;
  return r;
}

TEST_CASE("a call completes when every target answered, once each", "[call]") {
  Call c(1, {"a", "b", "a"});
  CHECK_FALSE(c.done());
  CHECK(c.deliver(ok_result(1)));
  CHECK_FALSE(c.deliver(ok_result(1)));  // late duplicate
  CHECK_FALSE(c.deliver(ok_result(7)));  // no such target
  CHECK(c.missing() == std::vector<int64_t>{0, 2});
  CHECK_FALSE(c.wait_done(10));
  auto first = c.take();
  REQUIRE(first.size() == 1);
  CHECK(first[0].index == 1);
  // Supervision fails both targets at address "a".
  CHECK(c.fail_addr("a", {{"kind", "supervision"}}) == 2);
  CHECK(c.done());
  CHECK(c.wait_done(0));
  auto rest = c.take();
  REQUIRE(rest.size() == 2);
  CHECK_FALSE(rest[0].ok);
  CHECK(rest[0].body["kind"] == "supervision");
}

TEST_CASE("a cancelled call is done at once, its targets running until their own answer comes", "[call]") {
  Call c(2, {"a", "b", "c"});
  CHECK(c.deliver(ok_result(0)));
  CHECK(c.cancel_all({{"kind", "cancelled"}}) == 2);
  CHECK(c.done());  // its waiters return now
  CHECK_FALSE(c.settled());  // but the node keeps it: targets 1 and 2 still run
  CHECK(c.lingering() == std::vector<int64_t>{1, 2});
  CHECK(c.running() == std::vector<int64_t>{1, 2});
  CHECK(c.missing().empty());
  auto got = c.take();
  REQUIRE(got.size() == 3);
  CHECK_FALSE(got[2].ok);
  CHECK_FALSE(c.deliver(ok_result(1)));  // its own answer: dropped (the caller cancelled), but it ended
  CHECK(c.lingering() == std::vector<int64_t>{2});
  CHECK(c.take().empty());
  CHECK(c.fail_addr("c", {{"kind", "supervision"}}) == 0);  // a dead proc runs nothing on
  CHECK(c.lingering().empty());
  CHECK(c.settled());
  // A target whose answer came while the cancel was on its way is not failed, and not running.
  Call d(3, {"a"});
  CHECK(d.deliver(ok_result(0)));
  CHECK(d.cancel_all({{"kind", "cancelled"}}) == 0);
  CHECK(d.settled());
}

TEST_CASE("a port takes results from anyone in order until closed, a once port only one", "[call][port]") {
  Call port(9, Call::PortTag{}, false);
  CHECK(port.is_port());
  CHECK(port.size() == 0);
  CHECK(port.missing().empty());
  CHECK_FALSE(port.done());
  CHECK(port.wait_for(true, 0) == WaitOutcome::Timeout);
  CHECK(port.deliver(ok_result(3)));
  CHECK(port.deliver(ok_result(3)));   // the same rank twice: both kept (a stream of sends)
  CHECK(port.deliver(ok_result(-1)));  // an unranked send
  CHECK_FALSE(port.done());
  CHECK(port.wait_for(true, 0) == WaitOutcome::Ready);
  auto got = port.take();
  REQUIRE(got.size() == 3);
  CHECK(got[0].index == 3);
  CHECK(got[2].index == -1);
  CHECK_THROWS_AS(port.target_addr(0), std::out_of_range);

  Call once(10, Call::PortTag{}, true);
  CHECK(once.deliver(ok_result(0)));
  CHECK(once.done());
  CHECK_FALSE(once.deliver(ok_result(1)));  // a second send to a once port is dropped
  CHECK(once.take().size() == 1);
}

TEST_CASE("waiters wake on delivery from another thread", "[call]") {
  Call c(2, {"a", "b"});
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    c.deliver(ok_result(0));
    c.deliver(ok_result(1));
  });
  CHECK(c.wait_for(true, 5000) == WaitOutcome::Ready);
  CHECK(c.wait_done(5000));
  t.join();
  CHECK(c.received() == 2);
}

TEST_CASE("the one wait: a wake ends it without a result, and one that came first is kept", "[call]") {
  Call c(3, {"a"});
  CHECK(c.wait_for(false, 0) == WaitOutcome::Timeout);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    c.wake();
  });
  CHECK(c.wait_for(false, 5000) == WaitOutcome::Woken);  // not a timeout: it came at once
  t.join();
  // The main thread's waker: a notify while nobody waits is kept and wakes the next wait.
  Waker w;
  w.notify();
  auto waiting = std::make_shared<Call>(5, std::vector<std::string>{"b"});
  w.enter(waiting);
  CHECK(waiting->wait_for(false, 5000) == WaitOutcome::Woken);
  CHECK(w.take());
  CHECK_FALSE(w.take());
  w.leave();
  // A result wins over a wake.
  c.deliver(ok_result(0));
  c.wake();
  CHECK(c.wait_for(false, 5000) == WaitOutcome::Ready);
}
