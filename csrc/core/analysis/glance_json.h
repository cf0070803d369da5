// glance_json.h — Report::glance as the report's "at_a_glance" section (docs/report_schema.md).
// Internal to the analysis layer.
#pragma once

#include "json_writer.h"
#include "ridgescope/run_glance.h"

namespace ridgescope::detail {

void write_glance(JsonWriter& w, const RunGlance& g);

}  // namespace ridgescope::detail
