// keep_policy.cpp — which steps a bounded flight trace keeps (keep_policy.h).
#include "keep_policy.h"

#include <algorithm>

#include "block_lifetimes.h"

namespace ridgescope::detail {

void KeepPolicy::add_window(std::uint64_t first, std::uint64_t last) {
  if (!windows_.empty() && windows_.back().first <= first && first <= windows_.back().second + 1) {
    windows_.back().second = std::max(windows_.back().second, last);  // overlaps the last one
    return;
  }
  windows_.emplace_back(first, last);
  while (windows_.size() > event_windows_) windows_.pop_front();
}

void KeepPolicy::on_step(std::uint64_t step, const std::vector<StepSummary>& summaries) {
  any_complete_ = true;
  last_complete_ = step;
  const std::uint64_t before = step > 0 ? step - 1 : 0;
  bool event = false, growth = false;
  for (const StepSummary& s : summaries) {
    Best& best = best_[device_code(s.device)];
    if (s.peak_bytes > best.peak) best = Best{s.peak_bytes, step};
    event = event || s.ooms > 0 || s.marks > 0;
    growth = growth || (s.flags & kSummaryGrowth) != 0;
  }
  if (event) add_window(before, step + 1);
  else if (growth) add_window(before, step);
}

bool KeepPolicy::keeps(std::uint64_t step) const {
  if (!any_complete_ || step > last_complete_ || last_complete_ - step < keep_steps_) return true;
  return keeps_for_event(step);
}

bool KeepPolicy::keeps_for_event(std::uint64_t step) const {
  if (step < first_steps_) return true;
  for (const auto& [code, best] : best_) {
    if (best.peak > 0 && (step == best.step || step + 1 == best.step)) return true;
  }
  for (const auto& [first, last] : windows_) {
    if (first <= step && step <= last) return true;
  }
  return false;
}

}  // namespace ridgescope::detail
