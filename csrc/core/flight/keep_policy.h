// keep_policy.h — which steps' events a bounded flight trace keeps (ridgescope/flight.h): the
// last keep_steps complete steps and the one running; per device, the step with the highest peak
// so far and the one before it; the step before, the step and the step after each OOM and each
// rs.mark(); the step before and the step that completed a retained-tensor growth; the first
// `first_steps` steps (the saved-tensor hook's). The most recent `event_windows` of the OOM,
// mark and growth windows are kept.
//
// Internal to the core. Thread-safety: none (the flight writer's thread).
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ridgescope/flight_records.h"

namespace ridgescope::detail {

class KeepPolicy {
 public:
  KeepPolicy(std::uint64_t keep_steps, std::uint64_t event_windows, std::uint64_t first_steps = 0)
      : keep_steps_(keep_steps), event_windows_(event_windows), first_steps_(first_steps) {}

  // Step `step` completed; its summaries, one per device.
  void on_step(std::uint64_t step, const std::vector<StepSummary>& summaries);
  // Whether the events of `step` are kept now.
  bool keeps(std::uint64_t step) const;
  // Whether they are kept for a reason other than being among the last steps (the highest peak,
  // an OOM, a mark, a warning, the first steps), so that the window that holds them may end there.
  bool keeps_for_event(std::uint64_t step) const;

 private:
  void add_window(std::uint64_t first, std::uint64_t last);

  const std::uint64_t keep_steps_, event_windows_, first_steps_;
  bool any_complete_ = false;
  std::uint64_t last_complete_ = 0;
  struct Best {
    std::uint64_t peak = 0, step = 0;
  };
  absl::flat_hash_map<std::uint64_t, Best> best_;          // by device code
  std::deque<std::pair<std::uint64_t, std::uint64_t>> windows_;  // [first, last] steps
};

}  // namespace ridgescope::detail
