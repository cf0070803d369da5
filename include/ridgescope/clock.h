// ridgescope/clock.h — the one session clock and its unit conversions.
//
// All event times are nanoseconds on std::chrono::steady_clock, relative to the session's start
// (design.md §2). Each unit change has exactly one conversion function here.
//
// Thread-safety: pure functions; safe from any thread, including allocator callbacks.
#pragma once

#include <chrono>
#include <cstdint>
#if defined(__linux__)
#include <time.h>
#endif

namespace ridgescope {

// Nanoseconds on the monotonic clock since an arbitrary, process-wide origin.
// On Linux, CLOCK_MONOTONIC read directly: the clock libstdc++'s steady_clock reads, without
// the call into libstdc++ on the way (one event = one reading, on the allocator callback's path).
inline std::uint64_t monotonic_now_ns() noexcept {
#if defined(__linux__)
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u + static_cast<std::uint64_t>(ts.tv_nsec);
#else
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
#endif
}

// Nanoseconds to microseconds (the unit of torch memory snapshots' time_us), truncating.
inline constexpr std::uint64_t ns_to_us(std::uint64_t ns) noexcept { return ns / 1000; }

// Nanoseconds to seconds, for human-facing text.
inline constexpr double ns_to_s(std::uint64_t ns) noexcept { return static_cast<double>(ns) * 1e-9; }

}  // namespace ridgescope
