// report_warnings.h — the analysis's warnings (Report::warnings): a truncated trace, optimizer
// state created lazily at the first step, retained tensors, readings that disagree with the
// ledger. Internal to the analysis layer.
#pragma once

#include "ridgescope/report.h"

namespace ridgescope::detail {

// Appends the warnings the finished report calls for (after the replay pass).
void add_warnings(Report& report);

}  // namespace ridgescope::detail
