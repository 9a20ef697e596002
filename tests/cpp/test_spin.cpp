// The short spin before a sleep (runtime/base/spin.hpp): it never takes a core that another
// thread waits for.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "spin.hpp"

using namespace xmesh;

TEST_CASE("the runnable count is read from a /proc/loadavg line, anything else refused", "[base]") {
  CHECK(runnable_threads("0.52 0.58 0.59 3/412 12345\n") == 3);
  CHECK(runnable_threads("12.00 9.10 8.00 17/2048 99") == 17);
  CHECK(runnable_threads("0.52 0.58 0.59") == -1);
  CHECK(runnable_threads("0.52 0.58 0.59 x/412 1") == -1);
  CHECK(runnable_threads("") == -1);
}

TEST_CASE("a waiter does not spin while every core is taken by threads with work", "[base]") {
  REQUIRE(spin_budget_us() > 0);  // the default budget: spinning is on
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (int i = 0; i < usable_cores() + 1; ++i)
    busy.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  // Past the 5 ms for which a look at the machine is kept.
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  SpinGauge gauge;
  int looks = 0;
  const bool came = gauge.spin([&] {
    ++looks;
    return false;
  });
  const bool spare = spare_core();
  stop = true;
  for (auto& t : busy) t.join();
  CHECK_FALSE(came);
  CHECK_FALSE(spare);
  CHECK(looks == 1);  // one look, no spin: it sleeps at once
}
