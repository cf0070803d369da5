// report_warnings.cpp — the analysis's warnings (see report_warnings.h).
#include "report_warnings.h"

#include <string>
#include <utility>

#include "format_bytes.h"
#include "ridgescope/phase.h"

namespace ridgescope::detail {

void add_warnings(Report& report) {
  if (report.trace.truncated) {
    report.warnings.push_back({"truncated_trace",
                               "The trace is incomplete: " + report.trace.problem +
                                   ". The report covers the readable prefix.",
                               0, 0});
  }
  for (std::size_t si = 0; si < report.steps.size(); ++si) {
    const StepStats& s = report.steps[si];
    bool found = false;
    for (const PhaseStats& p : s.phases) {
      if (parse_phase_kind(p.phase) != PhaseKind::OptimizerStep) continue;
      const auto i = category_index(Category::OptimizerState);
      if (p.end_by_category[i] <= p.start_by_category[i]) continue;
      const std::uint64_t created = p.end_by_category[i] - p.start_by_category[i];
      std::string message = "The optimizer step of step " + std::to_string(p.step) +
                            " created " + format_bytes(created) +
                            " of optimizer state lazily (it did not exist before that step).";
      if (si + 1 < report.steps.size() && report.steps[si + 1].complete &&
          report.steps[si + 1].peak_bytes > s.peak_bytes) {
        const StepStats& next = report.steps[si + 1];
        message += " From then on it is live during forward and backward as well: step " +
                   std::to_string(next.step) + " peaks at " + format_bytes(next.peak_bytes) +
                   " against " + format_bytes(s.peak_bytes) + " for step " +
                   std::to_string(s.step) + ".";
      }
      message += " A run that fits its first forward and backward can still run out of memory "
                 "at the first optimizer step or in the step after it: size memory for the "
                 "steady state.";
      report.warnings.push_back({"lazy_optimizer_state", std::move(message), created, p.step});
      found = true;
      break;
    }
    if (found) break;
  }
  if (report.retained) {
    const Verdict& v = report.retained->verdict;
    std::string message = v.summary;
    if (!v.remedies.empty()) {
      std::string action = v.remedies.front().action;
      if (!action.empty() && action[0] >= 'A' && action[0] <= 'Z') action[0] = static_cast<char>(action[0] - 'A' + 'a');
      message += " Remedy: " + action + ".";
    }
    report.warnings.push_back({"retained_tensors", std::move(message), report.retained->growth_per_step_bytes,
                               report.retained->since_step});
  }
  if (report.consistency.mismatches > 0) {
    report.warnings.push_back(
        {"ledger_mismatch",
         std::to_string(report.consistency.mismatches) + " of " +
             std::to_string(report.consistency.samples) +
             " allocator readings disagreed with the replayed ledger (first difference " +
             std::to_string(report.consistency.first_difference_bytes) + " bytes).",
         0, 0});
  }
}

}  // namespace ridgescope::detail
