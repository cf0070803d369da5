#include "model_list.h"

#include <string_view>

namespace ridgescope::detail {

void read_models(const JsonValue& models, Report& r) {
  std::vector<ModelListEntry>& out = r.model.models;
  out.clear();
  if (models.type != JsonValue::Type::Array) return;
  for (const JsonValue& m : models.array) {
    if (m.type != JsonValue::Type::Object) continue;
    ModelListEntry e;
    e.name = m.get_string("name").value_or("");
    e.class_name = m.get_string("class").value_or("");
    e.found = m.get_string("found").value_or("");
    e.created_at = m.get_string("created_at").value_or("");
    e.label_prefix = m.get_string("label_prefix").value_or("");
    e.copy_of = m.get_string("copy_of").value_or("");
    if (const JsonValue* t = m.get("trainable"); t && t->type == JsonValue::Type::Bool) e.trainable = t->boolean;
    e.parameters = m.get_uint("parameters").value_or(0);
    e.parameter_tensors = m.get_uint("parameter_tensors").value_or(0);
    e.trainable_parameters = m.get_uint("trainable_parameters").value_or(0);
    e.parameter_bytes = m.get_uint("parameter_bytes").value_or(0);
    e.trainable_parameter_bytes = m.get_uint("trainable_parameter_bytes").value_or(0);
    e.buffers = m.get_uint("buffers").value_or(0);
    e.buffer_bytes = m.get_uint("buffer_bytes").value_or(0);
    if (const JsonValue* d = m.get("dtypes"); d && d->type == JsonValue::Type::Object)
      for (const auto& [k, v] : d->object)
        if (v.is_integer && v.integer >= 0) e.dtypes.emplace_back(k, static_cast<std::uint64_t>(v.integer));
    if (const JsonValue* d = m.get("devices"); d && d->type == JsonValue::Type::Array)
      for (const auto& v : d->array)
        if (v.type == JsonValue::Type::String) e.devices.push_back(v.string);
    out.push_back(std::move(e));
  }
}

void measure_models(Report& r) {
  std::vector<ModelListEntry>& models = r.model.models;
  if (models.empty()) return;
  ModelListEntry* plain = nullptr;  // the model whose labels carry no prefix
  for (auto& m : models) {
    m.peak_parameter_bytes = m.peak_buffer_bytes = 0;
    if (m.label_prefix.empty() && plain == nullptr) plain = &m;
  }
  for (const LabelBytes& l : r.peak.persistent_labels) {
    ModelListEntry* owner = nullptr;
    std::size_t best = 0;
    for (auto& m : models) {
      const std::string& p = m.label_prefix;
      if (!p.empty() && p.size() > best && std::string_view(l.label).substr(0, p.size()) == p) {
        owner = &m;
        best = p.size();
      }
    }
    if (owner == nullptr) owner = plain;
    if (owner == nullptr) continue;
    if (l.category == Category::Parameter) owner->peak_parameter_bytes += l.bytes;
    if (l.category == Category::Buffer) owner->peak_buffer_bytes += l.bytes;
  }
}

void write_model_list(JsonWriter& w, const std::vector<ModelListEntry>& models) {
  auto string_or_null = [&w](std::string_view key, const std::string& v) {
    w.key(key);
    if (v.empty()) w.null(); else w.value(v);
  };
  w.key("models").begin_array();
  for (const ModelListEntry& m : models) {
    w.begin_object();
    w.field("name", m.name);
    string_or_null("class", m.class_name);
    w.field("found", m.found);
    string_or_null("created_at", m.created_at);
    string_or_null("copy_of", m.copy_of);
    w.field("trainable", m.trainable);
    w.field("parameters", m.parameters);
    w.field("parameter_tensors", m.parameter_tensors);
    w.field("trainable_parameters", m.trainable_parameters);
    w.field("parameter_bytes", m.parameter_bytes);
    w.field("trainable_parameter_bytes", m.trainable_parameter_bytes);
    w.field("buffers", m.buffers);
    w.field("buffer_bytes", m.buffer_bytes);
    w.key("dtypes").begin_object();
    for (const auto& [k, v] : m.dtypes) w.field(k, v);
    w.end_object();
    w.key("devices").begin_array();
    for (const auto& d : m.devices) w.value(d);
    w.end_array();
    w.field("label_prefix", m.label_prefix);
    w.key("at_peak").begin_object();
    w.field("parameter_bytes", m.peak_parameter_bytes);
    w.field("buffer_bytes", m.peak_buffer_bytes);
    w.end_object();
    w.end_object();
  }
  w.end_array();
}

}  // namespace ridgescope::detail
