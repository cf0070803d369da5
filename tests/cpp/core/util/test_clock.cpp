// Specification of the session clock (ridgescope/clock.h): every event time is read on the
// steady clock, whichever way the platform reads it.
#include <chrono>
#include <cstdint>

#include "catch.h"
#include "ridgescope/clock.h"

namespace {
std::uint64_t steady_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}
}  // namespace

SCENARIO("a reading of the session clock lies between two readings of the steady clock around it",
         "[core][clock]") {
  for (int i = 0; i < 1000; ++i) {
    // Given a steady-clock reading, when the session clock is read and the steady clock again
    const std::uint64_t before = steady_ns();
    const std::uint64_t now = ridgescope::monotonic_now_ns();
    const std::uint64_t after = steady_ns();
    // Then the session clock's reading is between them: the same clock, in nanoseconds
    REQUIRE(before <= now);
    REQUIRE(now <= after);
  }
}

SCENARIO("the session clock never goes back on a thread", "[core][clock]") {
  std::uint64_t last = ridgescope::monotonic_now_ns();
  for (int i = 0; i < 100000; ++i) {
    const std::uint64_t now = ridgescope::monotonic_now_ns();
    REQUIRE(now >= last);
    last = now;
  }
}
