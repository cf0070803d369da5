// run_summary.h — fills a Report's run, model, optimizer and recorder sections from the
// trace's `run` and `session` metadata and the measured figures. Internal to csrc/core.
#pragma once

#include "ridgescope/report.h"

namespace ridgescope::detail {

// Reads report.metadata (bad JSON becomes a `corrupt_metadata` warning) and report.steps.
void summarise_run(Report& report);

}  // namespace ridgescope::detail
