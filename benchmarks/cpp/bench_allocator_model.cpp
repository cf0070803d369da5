// bench_allocator_model.cpp — throughput of the CUDA caching allocator model
// (ridgescope/allocator_model.h): nanoseconds per malloc + free pair while a training-like set
// of blocks stays live. This bounds how fast `rs.estimate` and `ridgescope whatif` replay.
//
// Build and run (from the repository root; no torch, no Python):
//   cmake -S . -B build/bench -DRIDGESCOPE_BUILD_TORCH=OFF -DRIDGESCOPE_BUILD_BENCHMARKS=ON -DCMAKE_BUILD_TYPE=Release -G Ninja && cmake --build build/bench --target ridgescope_bench_allocator_model && build/bench/benchmarks/cpp/ridgescope_bench_allocator_model
//
// Flags (all optional):
//   --iterations N    malloc+free pairs per repetition (default 1000000)
//   --repetitions R   timed repetitions; the median is reported (default 5)
//   --live-blocks N   blocks live throughout (default 10000)
//
// Workload: request sizes drawn from a skewed mix (80 % small: 1 B .. 1 MiB; 20 % large:
// 1 MiB .. 64 MiB, log-uniform), each pair frees a randomly chosen live block and requests a
// new one, on one stream. Settings: torch's defaults, expandable_segments:True, and
// max_split_size_mb:32. Output: ONE JSON object on stdout; the checksum keeps the work live.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_support.h"
#include "ridgescope/allocator_model.h"


namespace {

using ridgescope::bench::Clock;
using ridgescope::bench::median;
using ridgescope::bench::Rng;

std::uint64_t request_bytes(Rng& rng) {
  const std::uint64_t r = rng.next();
  if (r % 5 != 0) {  // small: 1 B .. 1 MiB, log-uniform
    const unsigned shift = static_cast<unsigned>((r >> 8) % 20);
    return ((r >> 16) % (1ull << shift)) + 1;
  }
  const unsigned shift = 20 + static_cast<unsigned>((r >> 8) % 6);  // 1 MiB .. 64 MiB
  return (1ull << shift) + ((r >> 16) % (1ull << shift));
}

struct Measurement {
  std::string name;
  double median_ns = 0;
  double min_ns = 0;
  std::uint64_t peak_reserved = 0;
  std::uint64_t peak_allocated = 0;
  std::uint64_t segments = 0;
};

Measurement measure(const char* name, const char* conf, std::uint64_t iterations, int reps,
                    std::uint64_t live_blocks, std::uint64_t* checksum) {
  ridgescope::AllocatorSettings s;
  std::string error;
  if (!ridgescope::parse_allocator_settings(conf, &s, &error)) {
    std::fprintf(stderr, "%s\n", error.c_str());
    std::exit(2);
  }
  // Pre-generated work so that the timed loop is the model only.
  Rng rng{0x1234567ull};
  std::vector<std::uint64_t> sizes(iterations);
  std::vector<std::uint32_t> victims(iterations);
  for (std::uint64_t i = 0; i < iterations; ++i) {
    sizes[i] = request_bytes(rng);
    victims[i] = static_cast<std::uint32_t>(rng.next() % live_blocks);
  }
  std::vector<double> ns;
  Measurement m;
  m.name = name;
  for (int rep = 0; rep < reps; ++rep) {
    ridgescope::AllocatorModel model(s);
    std::vector<std::uint64_t> live(live_blocks);
    Rng warm{0x9876ull};
    std::uint64_t next_id = 1;
    for (auto& id : live) {
      id = next_id++;
      model.malloc(id, request_bytes(warm));
    }
    const auto t0 = Clock::now();
    for (std::uint64_t i = 0; i < iterations; ++i) {
      std::uint64_t& slot = live[victims[i]];
      model.free(slot);
      slot = next_id++;
      *checksum += model.malloc(slot, sizes[i]).block_bytes;
    }
    const auto t1 = Clock::now();
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() /
                 static_cast<double>(iterations));
    m.peak_reserved = model.peak_reserved_bytes();
    m.peak_allocated = model.peak_allocated_bytes();
    m.segments = model.segment_count();
  }
  m.median_ns = median(ns);
  m.min_ns = *std::min_element(ns.begin(), ns.end());
  std::fprintf(stderr, "%-24s %8.1f ns per malloc+free (median of %d)\n", name, m.median_ns, reps);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t iterations = 1000000;
  int reps = 5;
  std::uint64_t live_blocks = 10000;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(a, "--iterations") && has_value) {
      iterations = std::strtoull(argv[++i], nullptr, 10);
    } else if (!std::strcmp(a, "--repetitions") && has_value) {
      reps = std::atoi(argv[++i]);
    } else if (!std::strcmp(a, "--live-blocks") && has_value) {
      live_blocks = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--iterations N] [--repetitions R] [--live-blocks N]\n", argv[0]);
      return 2;
    }
  }
  if (iterations == 0 || reps <= 0 || live_blocks == 0) {
    std::fprintf(stderr, "iterations, repetitions and live-blocks must be positive\n");
    return 2;
  }
  std::uint64_t checksum = 0;
  const Measurement results[] = {
      measure("defaults", "", iterations, reps, live_blocks, &checksum),
      measure("expandable_segments", "expandable_segments:True", iterations, reps, live_blocks,
              &checksum),
      measure("max_split_size_mb_32", "max_split_size_mb:32", iterations, reps, live_blocks,
              &checksum),
  };
  std::printf("{\"benchmark\": \"allocator_model\", \"schema_version\": 1, "
              "\"compiler\": \"%s\", \"build_type\": \"%s\", \"iterations\": %llu, "
              "\"repetitions\": %d, \"live_blocks\": %llu, \"results\": [",
              RIDGESCOPE_BENCH_COMPILER, RIDGESCOPE_BENCH_BUILD_TYPE,
              static_cast<unsigned long long>(iterations), reps,
              static_cast<unsigned long long>(live_blocks));
  bool first = true;
  for (const Measurement& m : results) {
    std::printf("%s{\"settings\": \"%s\", \"ns_per_malloc_free_median\": %.1f, "
                "\"ns_per_malloc_free_min\": %.1f, \"peak_allocated_bytes\": %llu, "
                "\"peak_reserved_bytes\": %llu, \"segments_at_end\": %llu}",
                first ? "" : ", ", m.name.c_str(), m.median_ns, m.min_ns,
                static_cast<unsigned long long>(m.peak_allocated),
                static_cast<unsigned long long>(m.peak_reserved),
                static_cast<unsigned long long>(m.segments));
    first = false;
  }
  std::printf("], \"checksum\": %llu}\n", static_cast<unsigned long long>(checksum));
  return 0;
}
