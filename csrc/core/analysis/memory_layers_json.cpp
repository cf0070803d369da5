// memory_layers_json.cpp — Report::host_memory and Report::device_ledger as JSON
// (memory_layers_json.h; the keys are documented in docs/report_schema.md).
#include "memory_layers_json.h"

#include "ridgescope/external_alloc.h"
#include "ridgescope/host_memory.h"

namespace ridgescope::detail {
namespace {

void write_host_row(JsonWriter& w, const HostSample& s) {
  const HostLayers& l = s.layers;
  w.begin_object();
  w.field("time_ns", s.time_ns).field("step", s.step).field("phase", s.phase);
  w.field("resident_bytes", l.resident).field("pytorch_bytes", l.pytorch);
  w.field("torch_live_bytes", s.torch_allocated_bytes).field("untouched_bytes", l.untouched);
  w.field("allocator_slack_bytes", l.slack).field("outside_bytes", l.outside);
  w.key("outside").begin_object();
  w.field("files_bytes", l.files).field("shared_memory_bytes", l.shared_memory);
  w.field("other_heap_bytes", l.other_heap).field("remainder_bytes", l.remainder);
  w.end_object();
  w.field("residency_measured", l.residency_known).field("split_known", l.split_known);
  w.field("malloc_known", l.malloc_known).field("malloc_misses_torch", l.malloc_misses_torch);
  w.field("malloc_time_ns", s.malloc_time_ns);
  w.end_object();
}

void write_device_row(JsonWriter& w, const DeviceLedgerRow& r) {
  w.begin_object();
  w.field("time_ns", r.time_ns).field("step", r.step).field("phase", r.phase);
  w.field("driver_bytes", r.driver_bytes).field("reserved_bytes", r.reserved_bytes);
  w.field("outside_bytes", r.outside_bytes).field("context_bytes", r.context_bytes);
  w.field("unexplained_bytes", r.unexplained_bytes).field("exact", r.exact);
  w.end_object();
}

template <typename T, typename F>
void write_optional(JsonWriter& w, std::string_view key, const std::optional<T>& v, F write) {
  w.key(key);
  if (v) write(w, *v); else w.null();
}

}  // namespace

void write_memory_layers(JsonWriter& w, const Report& r) {
  w.key("host_memory");
  if (!r.host_memory) {
    w.null();
  } else {
    const HostMemoryReport& h = *r.host_memory;
    w.begin_object();
    w.field("samples", h.samples).field("phase_end_readings", h.phase_end_readings);
    w.field("readings_skipped", h.readings_skipped);
    w.field("rows_dropped", h.rows_dropped);
    // The source's budgets (ridgescope/host_memory.h), for the reporters' sentences.
    w.field("reading_share", 1.0 / static_cast<double>(host_budget::kReadingBudget));
    w.field("readings_always_taken", host_budget::kReadingsAlwaysTaken);
    w.field("malloc_share", 1.0 / static_cast<double>(host_budget::kMallocBudget));
    w.field("malloc_allowance_ns", host_budget::kMallocAllowanceNs);
    w.key("rows").begin_array();
    for (const HostSample& s : h.rows) write_host_row(w, s);
    w.end_array();
    write_optional(w, "max_resident", h.max_resident, write_host_row);
    write_optional(w, "at_peak", h.at_peak, write_host_row);
    w.end_object();
  }

  w.key("device_ledger");
  if (!r.device_ledger) {
    w.null();
    return;
  }
  const DeviceLedgerReport& d = *r.device_ledger;
  w.begin_object();
  w.field("available", d.available).field("reason", d.reason).field("driver_source", d.driver_source);
  w.field("other_processes", d.other_processes);
  w.field("itemised", d.itemised).field("itemise_reason", d.itemise_reason);
  w.field("readings", d.readings).field("total_bytes", d.total_bytes).field("context_bytes", d.context_bytes);
  w.field("modules_loaded", d.modules_loaded).field("module_bytes", d.module_bytes);
  w.field("outside_inside_reserved", d.outside_inside_reserved);
  write_optional(w, "at_peak", d.at_peak, write_device_row);
  write_optional(w, "max_driver", d.max_driver, write_device_row);
  write_optional(w, "last", d.last, write_device_row);
  w.key("rows").begin_array();
  for (const DeviceLedgerRow& row : d.rows) write_device_row(w, row);
  w.end_array();
  w.field("rows_dropped", d.rows_dropped);
  w.key("groups").begin_array();
  for (const ExternalGroup& g : d.groups) {
    w.begin_object();
    w.field("library", g.library).field("library_name", library_friendly_name(g.library));
    w.field("api", g.api).field("site", g.site).field("allocations", g.allocations);
    w.field("live_at_peak", g.live_at_peak).field("bytes_at_peak", g.bytes_at_peak);
    w.field("max_bytes", g.max_bytes).field("end_bytes", g.end_bytes);
    w.field("first_step", g.first_step).field("first_phase", g.first_phase);
    w.key("last_free_step");
    if (g.last_free_step) w.value(*g.last_free_step); else w.null();
    w.key("last_free_phase");
    if (g.last_free_step) w.value(g.last_free_phase); else w.null();
    w.end_object();
  }
  w.end_array();
  w.end_object();
}

}  // namespace ridgescope::detail
