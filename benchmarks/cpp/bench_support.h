// What every C++ microbenchmark under benchmarks/cpp shares: the build description its JSON
// names, a deterministic generator for pre-generated work lists, and the median of repetitions.
// Header-only; single-threaded use (each benchmark owns its generator).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#ifndef RIDGESCOPE_BENCH_COMPILER
#define RIDGESCOPE_BENCH_COMPILER "unknown"
#endif
#ifndef RIDGESCOPE_BENCH_BUILD_TYPE
#define RIDGESCOPE_BENCH_BUILD_TYPE "unknown"
#endif

namespace ridgescope::bench {

using Clock = std::chrono::steady_clock;

// xorshift64*: a fast, deterministic generator for the pre-generated work lists.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
};

// The median of the repetitions' figures (the middle two averaged for an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  if (n == 0) return 0;
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace ridgescope::bench
