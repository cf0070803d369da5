// model_list.h — the report's list of models (docs/report_schema.md, `model.models`): every model
// the run held — the tracked one, an EMA copy, a frozen reference or teacher, a frozen encoder —
// as the Python layer described it in the trace's `run` metadata, with the `parameter` and
// `buffer` bytes the analysis measured under each model's labels at the peak. Internal to
// csrc/core.
// Thread-safety: functions over one Report, no shared state.
#pragma once

#include <vector>

#include "json_value.h"
#include "json_writer.h"
#include "ridgescope/report.h"

namespace ridgescope::detail {

// Reads the `models` array of the run metadata into report.model.models (replacing any list
// read before: the last description wins). Entries that are not objects are skipped.
void read_models(const JsonValue& models, Report& report);

// Sums report.peak.persistent_labels per model: a label belongs to the model with the longest
// non-empty label prefix it starts with, else to the model whose prefix is "" (the tracked
// model, whose labels are plain module paths); labels of no model are left out.
void measure_models(Report& report);

// Writes `"models": [...]` (docs/report_schema.md) into the open model object.
void write_model_list(JsonWriter& w, const std::vector<ModelListEntry>& models);

}  // namespace ridgescope::detail
