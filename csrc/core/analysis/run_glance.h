// run_glance.h — builds Report::glance (ridgescope/run_glance.h) from pass 1's per-step summaries,
// the steps pass 2 found events for, and the run's `flight` metadata. Internal to the analysis.
#pragma once

#include <vector>

#include "ridgescope/flight_records.h"
#include "ridgescope/report.h"
#include "ridgescope/trace_reader.h"

namespace ridgescope::detail {

// `summaries`: every device's, in file order; those of report.device are kept.
void build_glance(const std::vector<StepSummary>& summaries, bool recorded, const TraceReader& reader,
                  double standout_fraction, Report& report);

}  // namespace ridgescope::detail
