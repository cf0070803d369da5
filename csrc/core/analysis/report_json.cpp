// report_json.cpp — Report -> JSON (schema: docs/report_schema.md).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "glance_json.h"
#include "json_writer.h"
#include "memory_layers_json.h"
#include "model_list.h"
#include "ridgescope/phase.h"
#include "ridgescope/report.h"

namespace ridgescope {
namespace {

using detail::JsonWriter;

void write_categories(JsonWriter& w, std::string_view key, const CategoryBytes& bytes) {
  w.key(key).begin_object();
  for (std::size_t i = 0; i < kCategoryCount; ++i) {
    w.field(category_name(static_cast<Category>(i)), bytes[i]);
  }
  w.end_object();
}

// How the bytes of a snapshot's peak were decided: per evidence (kSnapshotEvidence), their bytes
// and composition, from the reasons; and the share that size or lifetime alone decided.
void write_snapshot_confidence(JsonWriter& w, const SnapshotImport& si) {
  std::array<CategoryBytes, kSnapshotEvidence.size()> by{};
  std::uint64_t total = 0;
  for (const SnapshotReason& x : si.reasons) {
    std::size_t e = kSnapshotEvidence.size() - 1;
    for (std::size_t i = 0; i < kSnapshotEvidence.size(); ++i) {
      if (kSnapshotEvidence[i] == x.evidence) e = i;
    }
    by[e][category_index(x.category)] += x.peak_bytes;
    total += x.peak_bytes;
  }
  auto sum = [](const CategoryBytes& c) {
    std::uint64_t s = 0;
    for (std::uint64_t v : c) s += v;
    return s;
  };
  w.key("confidence").begin_object();
  w.key("peak_bytes_by_evidence").begin_object();
  for (std::size_t i = 0; i < kSnapshotEvidence.size(); ++i) w.field(kSnapshotEvidence[i], sum(by[i]));
  w.end_object();
  w.key("peak_by_evidence").begin_object();
  for (std::size_t i = 0; i < kSnapshotEvidence.size(); ++i) write_categories(w, kSnapshotEvidence[i], by[i]);
  w.end_object();
  const std::uint64_t weak = sum(by[3]);
  w.field("weak_peak_bytes", weak);
  w.field("weak_share_of_peak", total > 0 ? static_cast<double>(weak) / static_cast<double>(total) : 0.0);
  w.key("evidence_text").begin_object();
  for (std::size_t i = 0; i < kSnapshotEvidence.size(); ++i) w.field(kSnapshotEvidence[i], kSnapshotEvidenceText[i]);
  w.end_object();
  w.end_object();
}

void write_free_space(JsonWriter& w, const FreeSpace& f) {
  w.key("free").begin_object();
  w.field("free_bytes", f.free_bytes).field("largest_free_block", f.largest_free_block);
  w.field("free_blocks", f.free_blocks);
  w.field("largest_free_block_small_pool", f.largest_free_block_small_pool);
  w.field("largest_free_block_large_pool", f.largest_free_block_large_pool);
  w.field("inactive_split_bytes", f.inactive_split_bytes);
  w.key("histogram").begin_array();
  for (auto n : f.histogram) w.value(n);
  w.end_array();
  w.end_object();
}

void write_phase(JsonWriter& w, const PhaseStats& p) {
  w.begin_object();
  w.field("phase", p.phase).field("parent", p.parent).field("depth", p.depth);
  w.field("step", p.step).field("index", p.index).field("complete", p.complete);
  w.field("begin_time_ns", p.begin_time_ns).field("end_time_ns", p.end_time_ns);
  w.field("start_bytes", p.start_bytes).field("end_bytes", p.end_bytes);
  w.field("peak_bytes", p.peak_bytes).field("peak_time_ns", p.peak_time_ns);
  w.field("allocated_bytes", p.allocated_bytes).field("freed_bytes", p.freed_bytes);
  w.field("allocations", p.allocations);
  write_categories(w, "start_by_category", p.start_by_category);
  write_categories(w, "peak_by_category", p.peak_by_category);
  write_categories(w, "end_by_category", p.end_by_category);
  w.end_object();
}

// Columnar arrays keep the timeline compact. Only columns with a state change are listed, and
// the column right after each (it holds the carried state); a column not listed equals the last
// listed one before it. Column 0 is always listed.
void write_timeline(JsonWriter& w, const Timeline& t) {
  std::vector<std::size_t> listed;
  for (std::size_t i = 0; i < t.columns.size(); ++i) {
    if (i == 0 || t.columns[i].changes > 0 || t.columns[i - 1].changes > 0) listed.push_back(i);
  }
  w.key("timeline").begin_object();
  w.field("end_time_ns", t.end_time_ns).field("column_ns", t.column_ns);
  w.field("columns", static_cast<std::uint64_t>(t.columns.size()));
  w.key("index").begin_array();
  for (std::size_t i : listed) w.value(static_cast<std::uint64_t>(i));
  w.end_array();
  auto column_array = [&](std::string_view key, auto get) {
    w.key(key).begin_array();
    for (std::size_t i : listed) w.value(static_cast<std::uint64_t>(get(t.columns[i])));
    w.end_array();
  };
  column_array("changes", [](const TimelineColumn& c) { return c.changes; });
  column_array("min_bytes", [](const TimelineColumn& c) { return c.min_bytes; });
  column_array("max_bytes", [](const TimelineColumn& c) { return c.max_bytes; });
  column_array("max_time_ns", [](const TimelineColumn& c) { return c.max_time_ns; });
  column_array("reserved_bytes", [](const TimelineColumn& c) { return c.reserved_bytes; });
  w.key("max_by_category").begin_object();
  for (std::size_t i = 0; i < kCategoryCount; ++i) {
    w.key(category_name(static_cast<Category>(i))).begin_array();
    for (std::size_t c : listed) w.value(t.columns[c].max_by_category[i]);
    w.end_array();
  }
  w.end_object();
  // Step ends and phases are columnar too: a long run has thousands of them.
  auto uint_array = [&](std::string_view key, std::size_t n, auto get) {
    w.key(key).begin_array();
    for (std::size_t i = 0; i < n; ++i) w.value(static_cast<std::uint64_t>(get(i)));
    w.end_array();
  };
  w.key("step_ends").begin_object();
  uint_array("step", t.step_ends.size(), [&](std::size_t i) { return t.step_ends[i].first; });
  uint_array("time_ns", t.step_ends.size(), [&](std::size_t i) { return t.step_ends[i].second; });
  w.end_object();
  // Phase names once each, in order of first appearance; phases refer to them by position.
  std::vector<std::string_view> names;
  std::vector<std::uint64_t> name_of;
  for (const TimelinePhase& p : t.phases) {
    auto it = std::find(names.begin(), names.end(), std::string_view(p.phase));
    name_of.push_back(static_cast<std::uint64_t>(it - names.begin()));
    if (it == names.end()) names.push_back(p.phase);
  }
  w.key("phases").begin_object();
  w.key("names").begin_array();
  for (auto n : names) w.value(n);
  w.end_array();
  uint_array("name", t.phases.size(), [&](std::size_t i) { return name_of[i]; });
  uint_array("step", t.phases.size(), [&](std::size_t i) { return t.phases[i].step; });
  uint_array("depth", t.phases.size(), [&](std::size_t i) { return t.phases[i].depth; });
  uint_array("begin_time_ns", t.phases.size(), [&](std::size_t i) { return t.phases[i].begin_time_ns; });
  uint_array("end_time_ns", t.phases.size(), [&](std::size_t i) { return t.phases[i].end_time_ns; });
  w.end_object();
  w.key("oom_times_ns").begin_array();
  for (auto x : t.oom_times_ns) w.value(x);
  w.end_array();
  w.key("gaps").begin_object();
  uint_array("from_ns", t.gaps.size(), [&](std::size_t i) { return t.gaps[i].first; });
  uint_array("to_ns", t.gaps.size(), [&](std::size_t i) { return t.gaps[i].second; });
  w.end_object();
  w.end_object();
}

// --- Allocation sites (docs/sites.md) ---------------------------------------------------------
void write_verdict(JsonWriter& w, const Verdict& v) {
  w.key("verdict").begin_object();
  w.field("kind", v.kind).field("summary", v.summary);
  w.field("dominant_category", category_name(v.dominant));
  w.key("evidence").begin_array();
  for (const auto& x : v.evidence) w.value(x);
  w.end_array();
  w.key("remedies").begin_array();
  for (const auto& x : v.remedies) w.begin_object().field("action", x.action).field("trade_off", x.trade_off).end_object();
  w.end_array();
  w.end_object();
}

void write_frame_index(JsonWriter& w, std::string_view key, std::int64_t index) {
  w.key(key);
  if (index < 0) w.null(); else w.value(static_cast<std::uint64_t>(index));
}

// The peak by site (per category) and by stack.
void write_peak_sites(JsonWriter& w, const PeakInfo& p) {
  w.key("by_site").begin_array();
  for (const SiteBytes& s : p.by_site) {
    w.begin_object();
    w.field("site", s.site);
    write_frame_index(w, "frame", s.frame);
    w.field("category", category_name(s.category)).field("bytes", s.bytes).field("blocks", s.blocks);
    w.end_object();
  }
  w.end_array();
  w.key("stacks").begin_array();
  for (const StackBytes& s : p.stacks) {
    w.begin_object();
    w.key("frames").begin_array();
    for (auto f : s.frames) w.value(static_cast<std::uint64_t>(f));
    w.end_array();
    write_frame_index(w, "site", s.site);
    w.field("bytes", s.bytes).field("blocks", s.blocks);
    w.key("by_category").begin_object();  // only the categories present
    for (std::size_t i = 0; i < kCategoryCount; ++i) {
      if (s.by_category[i] != 0) w.field(category_name(static_cast<Category>(i)), s.by_category[i]);
    }
    w.end_object();
    w.end_object();
  }
  w.end_array();
  w.field("stacks_merged", p.stacks_merged);
}

void write_frames(JsonWriter& w, const std::vector<ReportFrame>& frames) {
  w.key("frames").begin_array();
  for (const ReportFrame& f : frames) {
    w.begin_object();
    w.field("kind", frame_kind_name(f.kind)).field("file", f.file).field("line", f.line);
    w.field("function", f.function).field("module", f.module);
    w.field("library", f.library).field("text", f.text).field("location", f.location);
    w.end_object();
  }
  w.end_array();
}

void write_retained(JsonWriter& w, const std::optional<RetainedGrowth>& r) {
  w.key("retained");
  if (!r) {
    w.null();
    return;
  }
  w.begin_object();
  w.field("since_step", r->since_step).field("last_step", r->last_step);
  w.field("growth_steps", r->growth_steps).field("growth_per_step_bytes", r->growth_per_step_bytes);
  w.field("growth_constant", r->growth_constant);
  w.field("min_growth_bytes", r->min_growth_bytes).field("max_growth_bytes", r->max_growth_bytes);
  w.field("bytes", r->bytes).field("blocks", r->blocks);
  w.key("sites").begin_array();
  for (const RetainedSite& s : r->sites) {
    w.begin_object();
    w.field("site", s.site);
    write_frame_index(w, "frame", s.frame);
    w.field("category", category_name(s.category));
    w.field("growth_per_step_bytes", s.growth_per_step_bytes).field("bytes", s.bytes).field("blocks", s.blocks);
    w.end_object();
  }
  w.end_array();
  write_frame_index(w, "latest", r->latest);
  write_verdict(w, r->verdict);
  w.end_object();
}

}  // namespace

std::string device_name(Device device) {
  if (device.type == DeviceType::CPU) return "cpu";
  return "cuda:" + std::to_string(device.index);
}

std::string report_to_json(const Report& r) {
  JsonWriter w;
  w.begin_object();
  w.field("schema_version", r.schema_version);
  w.key("categories").begin_array();
  for (std::size_t i = 0; i < kCategoryCount; ++i) w.value(category_name(static_cast<Category>(i)));
  w.end_array();

  w.key("trace").begin_object();
  w.field("path", r.trace.path).field("file_bytes", r.trace.file_bytes);
  w.field("format_version", r.trace.format_version).field("events", r.trace.events);
  w.field("skipped_records", r.trace.skipped_records).field("truncated", r.trace.truncated);
  w.field("truncated_at", r.trace.truncated_at).field("problem", r.trace.problem);
  w.field("duration_ns", r.trace.duration_ns);
  w.end_object();

  w.field("device", device_name(r.device));
  w.key("device_capacity_bytes");
  if (r.device_capacity_bytes) w.value(*r.device_capacity_bytes); else w.null();
  w.key("devices_seen").begin_array();
  for (Device d : r.devices_seen) w.value(device_name(d));
  w.end_array();

  const PeakInfo& p = r.peak;
  w.key("peak").begin_object();
  w.field("bytes", p.bytes).field("reserved_bytes", p.reserved_bytes).field("step", p.step);
  w.field("phase", p.phase);
  w.key("phase_stack").begin_array();
  for (const auto& s : p.phase_stack) w.value(s);
  w.end_array();
  w.field("time_ns", p.time_ns).field("seq", p.seq);
  write_categories(w, "by_category", p.by_category);
  write_categories(w, "inferred_by_category", p.inferred_by_category);
  w.key("top_blocks").begin_array();
  for (const TopBlock& b : p.top_blocks) {
    w.begin_object();
    w.field("bytes", b.bytes).field("category", category_name(b.category));
    w.field("inferred", b.inferred).field("label", b.label);
    w.field("phase_allocated", b.phase_allocated).field("module", b.module);
    w.field("step_allocated", b.step_allocated);
    w.field("address", b.address);
    w.field("site", b.site);
    write_frame_index(w, "site_frame", b.site_frame);
    w.end_object();
  }
  w.end_array();
  write_free_space(w, p.free);
  w.key("by_label").begin_array();
  for (const LabelBytes& l : p.by_label) {
    w.begin_object();
    w.field("label", l.label).field("category", category_name(l.category));
    w.field("bytes", l.bytes).field("blocks", l.blocks);
    w.end_object();
  }
  w.end_array();
  write_peak_sites(w, p);
  w.end_object();

  w.key("steps").begin_array();
  for (const StepStats& s : r.steps) {
    w.begin_object();
    w.field("step", s.step).field("complete", s.complete);
    w.field("begin_time_ns", s.begin_time_ns).field("end_time_ns", s.end_time_ns);
    w.field("start_bytes", s.start_bytes).field("end_bytes", s.end_bytes);
    w.field("peak_bytes", s.peak_bytes);
    write_categories(w, "peak_by_category", s.peak_by_category);
    write_categories(w, "end_by_category", s.end_by_category);
    w.key("phases").begin_array();
    for (const PhaseStats& ph : s.phases) write_phase(w, ph);
    w.end_array();
    w.end_object();
  }
  w.end_array();

  w.key("ooms").begin_array();
  for (const OomRecord& o : r.ooms) {
    w.begin_object();
    w.field("request_bytes", o.request_bytes).field("device_free_bytes", o.device_free_bytes);
    w.field("step", o.step).field("phase", o.phase).field("time_ns", o.time_ns);
    w.field("live_bytes", o.live_bytes).field("reserved_bytes", o.reserved_bytes);
    write_categories(w, "by_category", o.by_category);
    write_free_space(w, o.free);
    w.key("verdict").begin_object();
    w.field("kind", o.verdict.kind).field("summary", o.verdict.summary);
    w.field("dominant_category", category_name(o.verdict.dominant));
    w.key("evidence").begin_array();
    for (const auto& x : o.verdict.evidence) w.value(x);
    w.end_array();
    w.key("remedies").begin_array();
    for (const auto& x : o.verdict.remedies) w.begin_object().field("action", x.action).field("trade_off", x.trade_off).end_object();
    w.end_array();
    w.end_object();
    w.end_object();
  }
  w.end_array();

  w.key("warnings").begin_array();
  for (const ReportWarning& x : r.warnings) {
    w.begin_object();
    w.field("kind", x.kind).field("message", x.message).field("bytes", x.bytes).field("step", x.step);
    w.end_object();
  }
  w.end_array();

  write_frames(w, r.frames);
  write_retained(w, r.retained);
  write_glance(w, r.glance);

  w.key("consistency").begin_object();
  w.field("samples", r.consistency.samples).field("mismatches", r.consistency.mismatches);
  w.field("first_difference_bytes", r.consistency.first_difference_bytes);
  w.field("first_mismatch_seq", r.consistency.first_mismatch_seq);
  w.end_object();

  if (r.probe) {
    w.key("probe").begin_object();
    w.field("time_ns", r.probe->time_ns).field("live_bytes", r.probe->live_bytes);
    w.field("reserved_bytes", r.probe->reserved_bytes);
    write_free_space(w, r.probe->free);
    w.end_object();
  }

  w.key("dashboards").begin_array();
  for (const SamplerView& d : r.dashboards) {
    w.begin_object().field("period_s", static_cast<std::uint64_t>(d.period_ns / 1'000'000'000u)).field("samples", d.samples);
    w.field("max_sample_bytes", d.max_sample_bytes).end_object();
  }
  w.end_array();

  write_timeline(w, r.timeline);

  w.key("anomalies").begin_object();
  w.field("unknown_frees", r.anomalies.unknown_frees);
  w.field("replaced_allocs", r.anomalies.replaced_allocs);
  w.field("unknown_tags", r.anomalies.unknown_tags);
  w.field("unknown_segment_frees", r.anomalies.unknown_segment_frees);
  w.end_object();

  w.key("totals").begin_object();
  w.field("allocations", r.allocations).field("frees", r.frees).field("tags", r.tags);
  w.field("final_live_bytes", r.final_live_bytes);
  w.field("final_reserved_bytes", r.final_reserved_bytes);
  write_categories(w, "final_by_category", r.final_by_category);
  w.end_object();

  // Metadata the analysis understood becomes sections; anything else is carried as text.
  w.key("metadata").begin_object();
  for (const auto& [k, v] : r.metadata)
    if (k != "run" && k != "session" && k != "driver_view") w.field(k, v);
  w.end_object();

  w.key("run").begin_object();
  if (!r.run.ridgescope_version.empty()) w.field("ridgescope_version", r.run.ridgescope_version);
  if (!r.run.torch_version.empty()) w.field("torch_version", r.run.torch_version);
  if (!r.run.python_version.empty()) w.field("python_version", r.run.python_version);
  w.key("argv").begin_array();
  for (const auto& a : r.run.argv) w.value(a);
  w.end_array();
  w.end_object();

  const ModelSummary& m = r.model;
  auto opt_uint = [&w](std::string_view key, const std::optional<std::uint64_t>& v) {
    w.key(key);
    if (v) w.value(*v); else w.null();
  };
  auto opt_double = [&w](std::string_view key, const std::optional<double>& v) {
    w.key(key);
    if (v) w.value(*v); else w.null();
  };
  w.key("model").begin_object();
  w.key("class");
  if (m.class_name.empty()) w.null(); else w.value(m.class_name);
  opt_uint("parameters", m.parameters);
  opt_uint("parameter_tensors", m.parameter_tensors);
  opt_uint("trainable_parameters", m.trainable_parameters);
  opt_uint("trainable_parameter_tensors", m.trainable_parameter_tensors);
  w.field("parameter_bytes", m.parameter_bytes);
  opt_uint("trainable_parameter_bytes", m.trainable_parameter_bytes);
  opt_uint("buffers", m.buffers);
  opt_uint("buffer_bytes", m.buffer_bytes);
  w.key("dtypes").begin_object();
  for (const auto& [k, v] : m.dtypes) w.field(k, v);
  w.end_object();
  w.key("persistent_bytes_per_trainable_parameter").begin_object();
  opt_double("expected", m.expected_persistent_bytes_per_parameter);
  opt_double("measured", m.measured_persistent_bytes_per_parameter);
  w.key("measured_at");
  if (m.measured_at_step) {
    w.begin_object().field("step", *m.measured_at_step).field("phase", builtin_phase_name(PhaseKind::OptimizerStep));
    w.field("at", "end").end_object();
  } else {
    w.null();
  }
  w.end_object();
  detail::write_model_list(w, m.models);
  w.end_object();

  const OptimizerSummary& o = r.optimizer;
  w.key("optimizer").begin_object();
  w.key("type");
  if (o.type.empty()) w.null(); else w.value(o.type);
  w.field("state_bytes", o.state_bytes);
  opt_uint("states_per_parameter", o.states_per_parameter);
  w.key("state_keys").begin_array();
  for (const auto& k : o.state_keys) w.value(k);
  w.end_array();
  w.key("hyperparameters").raw(o.hyperparameters_json);
  w.field("steps", o.steps);
  w.end_object();

  const DriverView& dv = r.driver_view;
  w.key("driver_view").begin_object();
  w.key("available");
  if (dv.available) w.value(*dv.available); else w.null();
  w.field("reason", dv.reason).field("samples", dv.samples).field("total_bytes", dv.total_bytes);
  w.field("max_used_bytes", dv.max_used_bytes).field("max_non_pytorch_bytes", dv.max_non_pytorch_bytes);
  w.field("process_samples", dv.process_samples).field("max_process_used_bytes", dv.max_process_used_bytes);
  w.end_object();

  if (r.recorder.known) {
    w.key("recorder").begin_object();
    w.field("events", r.recorder.events).field("dropped_events", r.recorder.dropped_events);
    w.field("bytes_written", r.recorder.bytes_written);
    w.field("buffer_bytes_peak", r.recorder.buffer_bytes_peak);
    w.end_object();
  }
  if (r.snapshot) {  // a report built from a torch memory snapshot: what was inferred
    const SnapshotImport& si = *r.snapshot;
    w.key("snapshot").begin_object();
    w.field("producer", si.producer).field("protocol", static_cast<std::uint64_t>(si.protocol));
    w.field("device", si.device).field("trace_entries", si.trace_entries);
    w.field("live_at_start_blocks", si.live_at_start_blocks);
    w.key("inferred").begin_object();
    w.field("categories", si.categories_inferred).field("phases", si.phases_inferred);
    w.field("block_sizes", si.block_sizes_inferred);
    w.end_object();
    w.field("block_sizes_modelled", si.block_sizes_modelled);
    w.field("blocks_larger_than_rounded", si.blocks_larger_than_rounded);
    w.field("unmatched_entries", si.unmatched_entries);
    w.field("alloc_conf", si.alloc_conf);
    w.field("categorised_from_snapshot", si.categorised_from_snapshot);
    w.field("categorised_from_frames", si.categorised_from_frames);
    w.key("notes").begin_array();
    for (const auto& n : si.notes) w.value(n);
    w.end_array();
    w.key("reasons").begin_array();
    for (const SnapshotReason& x : si.reasons) {
      w.begin_object().field("rule", x.rule).field("category", category_name(x.category));
      w.field("reason", x.reason).field("evidence", x.evidence).field("allocations", x.allocations);
      w.field("peak_bytes", x.peak_bytes).field("peak_blocks", x.peak_blocks).field("end_bytes", x.end_bytes);
      w.end_object();
    }
    w.end_array();
    if (!si.reasons.empty()) write_snapshot_confidence(w, si);
    w.field("device_choice", si.device_choice);
    w.key("devices").begin_array();
    for (const SnapshotDevice& d : si.devices) {
      w.begin_object().field("device", d.device).field("segments", d.segments);
      w.field("trace_entries", d.trace_entries).field("peak_bytes", d.peak_bytes);
      w.field("peak_reserved_bytes", d.peak_reserved_bytes);
      write_categories(w, "peak_by_category", d.peak_by_category);
      w.field("end_live_bytes", d.end_live_bytes).field("end_reserved_bytes", d.end_reserved_bytes);
      w.end_object();
    }
    w.end_array();
    w.end_object();
  }
  detail::write_memory_layers(w, r);  // host_memory, device_ledger
  w.end_object();
  return w.take();
}

std::string Report::to_json() const { return report_to_json(*this); }

void Report::write_json(const std::string& path) const {
  const std::string text = to_json() + "\n";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot write '" + path + "': " + std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error("cannot write '" + path + "'");
}

}  // namespace ridgescope
