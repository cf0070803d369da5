// allocator_workload.h — a fixed pseudo-random malloc/free/empty_cache workload on ridgescope's
// allocator model (a simulation of torch's CUDA caching allocator), for specifications that
// compare another component (the trace translator, the snapshot reader) with the model.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ridgescope/allocator_model.h"

namespace ridgescope::testing {

// What the workload reports, in the order torch's trace would record it. Each callback may
// return a non-empty message to stop the workload (a disagreement); absent callbacks are skipped.
struct AllocatorWorkloadCallbacks {
  // A segment change (segment_alloc/free/map/unmap), before the alloc or free that caused it.
  std::function<std::string(const AllocatorSegmentEvent&)> segment;
  // An allocation of `requested` bytes and what the model handed out.
  std::function<std::string(int op, std::uint64_t requested, const MallocResult&)> alloc;
  // A free of a live block (its address, block and requested bytes, as before the free).
  std::function<std::string(int op, const AllocatorBlockInfo&)> free;
  // After every operation (segment, alloc and free callbacks done).
  std::function<std::string(int op)> after;
};

// `operations` steps: 55 % mallocs (half 1 B - 1 MiB, 30 % 1-10 MiB, 20 % 10-200 MiB), 42 %
// frees of a random live allocation, 3 % empty_cache(). The sizes exercise the small pool, the
// 20 MiB segments of 1-10 MiB requests (where unsplit remainders happen) and large segments.
// Returns the first callback message, or "" when the workload ran to the end.
inline std::string run_allocator_workload(AllocatorModel& model, int operations, std::uint64_t seed,
                                          const AllocatorWorkloadCallbacks& cb) {
  constexpr std::uint64_t MiB = 1ull << 20;
  model.record_segment_events(true);
  std::size_t seen = model.segment_events().size();
  std::uint64_t state = seed;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  auto segments = [&]() -> std::string {
    const auto& events = model.segment_events();
    for (; seen < events.size(); ++seen) {
      if (cb.segment) {
        if (std::string m = cb.segment(events[seen]); !m.empty()) return m;
      }
    }
    return "";
  };
  std::vector<std::uint64_t> live;
  std::uint64_t next_id = 1;
  for (int op = 0; op < operations; ++op) {
    std::string m;
    const std::uint64_t r = next() % 100;
    if (r < 55 || live.empty()) {
      const std::uint64_t kind = next() % 10;
      const std::uint64_t bytes = kind < 5 ? 1 + next() % MiB
                                : kind < 8 ? MiB + next() % (9 * MiB)
                                           : 10 * MiB + next() % (190 * MiB);
      const std::uint64_t id = next_id++;
      const MallocResult result = model.malloc(id, bytes);
      if (!result.ok()) return "op " + std::to_string(op) + ": the model refused a malloc";
      m = segments();
      if (m.empty() && cb.alloc) m = cb.alloc(op, bytes, result);
      live.push_back(id);
    } else if (r < 97) {
      const std::size_t k = next() % live.size();
      const std::uint64_t id = live[k];
      live[k] = live.back();
      live.pop_back();
      const AllocatorBlockInfo b = model.block_of(id);
      model.free(id);
      m = segments();
      if (m.empty() && cb.free) m = cb.free(op, b);
    } else {
      model.empty_cache();
      m = segments();
    }
    if (m.empty() && cb.after) m = cb.after(op);
    if (!m.empty()) return m;
  }
  return "";
}

}  // namespace ridgescope::testing
