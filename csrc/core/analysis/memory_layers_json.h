// memory_layers_json.h — the report's `host_memory` and `device_ledger` sections
// (docs/report_schema.md). Internal to csrc/core.
#pragma once

#include "json_writer.h"
#include "ridgescope/report.h"

namespace ridgescope::detail {

// Writes the two keys (null when the report has no such ledger) into the open report object.
void write_memory_layers(JsonWriter& w, const Report& report);

}  // namespace ridgescope::detail
