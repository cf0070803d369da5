// ridgescope/run_glance.h — the run at a glance (Report::glance): every step of the reported
// device summarised (the trace's per-step summaries, ridgescope/flight_records.h, or for a trace
// without them the same summaries computed from its events), the categories whose bytes at the
// step peaks grow over the run, the steps that stand out, and the windows of steps whose events
// the trace kept (all of them for a full trace). docs/long-runs.md, docs/report_schema.md
// "at_a_glance".
//
// Thread-safety: plain data.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ridgescope/category.h"

namespace ridgescope {

// One step of the reported device. Bytes are bytes, times nanoseconds.
struct GlanceStep {
  std::uint64_t step = 0;
  std::uint64_t begin_time_ns = 0, duration_ns = 0;
  std::uint64_t peak_bytes = 0, peak_reserved_bytes = 0, start_bytes = 0, end_bytes = 0;
  std::uint64_t allocations = 0, ooms = 0, marks = 0;
  std::uint8_t flags = 0;                          // kSummaryComplete, kSummaryGrowth
  std::array<std::uint64_t, kCategoryCount> peak_by_category{};
  std::vector<std::uint64_t> phase_peaks;          // aligned with RunGlance::phases (0: absent)
  std::string mark;                                // the first rs.mark() name in the step
};

// A category whose bytes at the step peaks grew over the run: the median over the first tenth
// of the steady-state steps against the median over the last tenth.
struct GrowingCategory {
  Category category = Category::Unknown;
  std::uint64_t first_bytes = 0, last_bytes = 0;
  std::uint64_t growth_bytes = 0;
  double growth_per_step_bytes = 0;
};

// A step that stands out, and why: "oom", "mark", "growth" (its end completed a run of steps
// whose end bytes kept growing), "new_maximum" (its peak is above every step's before it),
// "above_median" (its peak exceeds the median by more than RunGlance::standout_fraction).
struct StandoutStep {
  std::uint64_t step = 0;
  std::uint64_t peak_bytes = 0;
  double over_median = 0;          // peak / median - 1
  std::vector<std::string> reasons;
};

// A run of consecutive steps whose events the trace holds, and why they were kept: "all" (a
// full trace), "last_steps", "highest_peak", "oom", "mark", "growth", "first_steps" (the steps
// the saved-tensor hook ran in, FlightOptions::keep_first_steps).
struct KeptWindow {
  std::uint64_t first_step = 0, last_step = 0;
  std::vector<std::string> reasons;
};

struct RunGlance {
  bool recorded = false;                    // the summaries are the recorder's own records
  std::optional<std::uint64_t> keep_steps;  // the run's keep_steps (none: every step kept)
  double standout_fraction = 0.10;
  std::uint64_t median_peak_bytes = 0, max_peak_bytes = 0, max_peak_step = 0;
  std::vector<std::string> phases;          // phase names of GlanceStep::phase_peaks
  std::vector<GlanceStep> steps;            // in step order
  std::vector<GrowingCategory> growing;     // largest growth first
  std::vector<StandoutStep> standouts;      // in step order, at most kMaxStandouts
  std::uint64_t standouts_total = 0;        // before the cap
  std::vector<KeptWindow> windows;          // in step order
  static constexpr std::size_t kMaxStandouts = 100;
};

}  // namespace ridgescope
