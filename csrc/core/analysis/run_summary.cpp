#include "run_summary.h"

#include "json_value.h"
#include "json_writer.h"
#include "model_list.h"
#include "ridgescope/phase.h"

namespace ridgescope::detail {
namespace {

const PhaseStats* last_complete(const Report& r, std::string_view name) {
  const PhaseStats* found = nullptr;
  for (const auto& s : r.steps)
    for (const auto& p : s.phases)
      if (p.phase == name && p.complete) found = &p;
  return found;
}

void read_run(const JsonValue& run, Report& r) {
  r.run.ridgescope_version = run.get_string("ridgescope_version").value_or("");
  r.run.torch_version = run.get_string("torch_version").value_or("");
  r.run.python_version = run.get_string("python_version").value_or("");
  r.device_capacity_bytes = run.get_uint("device_capacity_bytes");
  if (const JsonValue* argv = run.get("argv"); argv && argv->type == JsonValue::Type::Array)
    for (const auto& a : argv->array)
      if (a.type == JsonValue::Type::String) r.run.argv.push_back(a.string);

  if (const JsonValue* m = run.get("model"); m && m->type == JsonValue::Type::Object) {
    ModelSummary& model = r.model;
    model.class_name = m->get_string("class").value_or("");
    model.parameters = m->get_uint("parameters");
    model.parameter_tensors = m->get_uint("parameter_tensors");
    model.trainable_parameters = m->get_uint("trainable_parameters");
    model.trainable_parameter_tensors = m->get_uint("trainable_parameter_tensors");
    if (auto b = m->get_uint("parameter_bytes")) model.parameter_bytes = *b;
    model.trainable_parameter_bytes = m->get_uint("trainable_parameter_bytes");
    model.buffers = m->get_uint("buffers");
    model.buffer_bytes = m->get_uint("buffer_bytes");
    if (const JsonValue* d = m->get("dtypes"); d && d->type == JsonValue::Type::Object)
      for (const auto& [k, v] : d->object)
        if (v.is_integer && v.integer >= 0) model.dtypes.emplace_back(k, static_cast<std::uint64_t>(v.integer));
  }
  if (const JsonValue* models = run.get("models")) read_models(*models, r);
  if (const JsonValue* o = run.get("optimizer"); o && o->type == JsonValue::Type::Object) {
    OptimizerSummary& opt = r.optimizer;
    opt.type = o->get_string("type").value_or("");
    opt.states_per_parameter = o->get_uint("states_per_parameter");
    if (const JsonValue* keys = o->get("state_keys"); keys && keys->type == JsonValue::Type::Array)
      for (const auto& k : keys->array)
        if (k.type == JsonValue::Type::String) opt.state_keys.push_back(k.string);
    if (const JsonValue* h = o->get("hyperparameters"); h && h->type == JsonValue::Type::Object) {
      JsonWriter w;
      write_json_value(w, *h);
      opt.hyperparameters_json = w.take();
    }
  }
}

void read_session(const JsonValue& session, Report& r) {
  RecorderSummary& rec = r.recorder;
  rec.known = true;
  rec.events = session.get_uint("events").value_or(0);
  rec.dropped_events = session.get_uint("dropped_events").value_or(0);
  rec.bytes_written = session.get_uint("bytes_written").value_or(0);
  rec.buffer_bytes_peak = session.get_uint("buffer_bytes_peak").value_or(0);
}

}  // namespace

void summarise_run(Report& r) {
  r.model.parameter_bytes = r.final_by_category[category_index(Category::Parameter)];
  for (const auto& [key, text] : r.metadata) {
    if (key != "run" && key != "session" && key != "driver_view") continue;
    std::string error;
    const auto value = parse_json(text, &error);
    if (!value || value->type != JsonValue::Type::Object) {
      r.warnings.push_back({"corrupt_metadata",
                            "The trace's '" + key + "' metadata is not a valid JSON object (" +
                                (value ? std::string("not an object") : error) +
                                ") and was ignored.",
                            0, 0});
      continue;
    }
    if (key == "run") {
      read_run(*value, r);
    } else if (key == "session") {
      read_session(*value, r);
    } else {
      if (const JsonValue* a = value->get("available"); a && a->type == JsonValue::Type::Bool) {
        r.driver_view.available = a->boolean;
      }
      r.driver_view.reason = value->get_string("reason").value_or("");
    }
  }

  measure_models(r);

  // Without a declared capacity, the driver's total is the device's capacity.
  if (!r.device_capacity_bytes && r.driver_view.total_bytes > 0) r.device_capacity_bytes = r.driver_view.total_bytes;

  const PhaseStats* opt = last_complete(r, builtin_phase_name(PhaseKind::OptimizerStep));
  for (const auto& s : r.steps)
    for (const auto& p : s.phases) r.optimizer.steps += parse_phase_kind(p.phase) == PhaseKind::OptimizerStep;
  r.optimizer.state_bytes = (opt ? opt->end_by_category : r.final_by_category)[category_index(Category::OptimizerState)];

  ModelSummary& m = r.model;
  const std::uint64_t n = m.trainable_parameters.value_or(0);
  if (n > 0 && m.trainable_parameter_bytes && r.optimizer.states_per_parameter) {
    const double per_element = static_cast<double>(*m.trainable_parameter_bytes) / static_cast<double>(n);
    m.expected_persistent_bytes_per_parameter =
        per_element * static_cast<double>(2 + *r.optimizer.states_per_parameter);
  }
  if (n > 0 && opt != nullptr) {
    const auto& end = opt->end_by_category;
    const std::uint64_t trainable = m.trainable_parameter_bytes.value_or(end[category_index(Category::Parameter)]);
    m.measured_persistent_bytes_per_parameter =
        static_cast<double>(trainable + end[category_index(Category::Gradient)] +
                            end[category_index(Category::OptimizerState)]) / static_cast<double>(n);
    m.measured_at_step = opt->step;
  }
}

}  // namespace ridgescope::detail
