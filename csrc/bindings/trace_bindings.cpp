// trace_bindings.cpp — ridgescope._C's shared constants and rules, format_bytes, the trace
// and snapshot readers (analyze, read_events, write_snapshot, analyze_snapshot,
// snapshot_to_trace) and TraceWriter. Conversions only; no torch header.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ridgescope/analysis.h"
#include "ridgescope/category.h"
#include "ridgescope/cuda_rounding.h"
#include "ridgescope/cuda_workspace.h"
#include "ridgescope/external_alloc.h"
#include "ridgescope/forensics.h"
#include "ridgescope/recorder.h"
#include "ridgescope/snapshot.h"
#include "ridgescope/trace_format.h"
#include "ridgescope/trace_reader.h"
#include "bindings.h"
#include "format_bytes.h"

namespace py = pybind11;
using ridgescope::Category;
using ridgescope_bindings::to_category;

namespace {

py::list read_events(const std::string& path, std::size_t limit) {
  ridgescope::TraceReader reader(path);
  py::list out;
  ridgescope::Event e;
  while (out.size() < limit && reader.next(e)) {
    py::dict d;
    d["seq"] = e.seq;
    d["kind"] = std::string(ridgescope::event_kind_name(e.kind));
    d["flight"] = ridgescope::is_flight_record(e.kind);  // written by the flight recorder, not recorded
    d["time_ns"] = e.time_ns;
    d["device"] = ridgescope::device_name(e.device);
    d["addr"] = e.addr;
    d["bytes"] = e.bytes;
    d["requested_bytes"] = e.requested_bytes;
    d["stream"] = e.stream;
    d["category"] = std::string(ridgescope::category_name(e.category));
    d["weak"] = (e.flags & ridgescope::kTagWeak) != 0;
    d["string"] = std::string(reader.string(e.string_id));
    d["value"] = e.value;
    d["stack_id"] = e.stack_id;
    if (e.kind == ridgescope::EventKind::ExternalAlloc || e.kind == ridgescope::EventKind::ExternalFree) {
      d["api"] = std::string(ridgescope::external_api_name(ridgescope::external_api_from_byte(e.flags)));
    }
    out.append(std::move(d));
  }
  if (reader.truncated()) {
    py::dict d;
    d["kind"] = "truncated";
    d["problem"] = reader.problem();
    d["offset"] = reader.truncated_at();
    out.append(std::move(d));
  }
  return out;
}

// User category rules for snapshots: (name, category, frame-name regex, file regex) tuples.
using RuleTuple = std::tuple<std::string, std::string, std::string, std::string>;
std::vector<ridgescope::SnapshotCategoryRule> to_rules(const std::vector<RuleTuple>& rules) {
  std::vector<ridgescope::SnapshotCategoryRule> out;
  for (const auto& [name, category, frame_name, file] : rules) {
    out.push_back({name, to_category(category), frame_name, file});
  }
  return out;
}

// Event kinds a TraceWriter may write (strings and metadata have their own calls).
ridgescope::EventKind to_event_kind(const std::string& name) {
  using ridgescope::EventKind;
  for (EventKind k : {EventKind::Alloc, EventKind::Free, EventKind::SegmentAlloc,
                      EventKind::SegmentFree, EventKind::Tag, EventKind::PhaseBegin,
                      EventKind::PhaseEnd, EventKind::Step, EventKind::Oom, EventKind::Sample}) {
    if (ridgescope::event_kind_name(k) == name) return k;
  }
  throw py::value_error("unknown event kind '" + name + "'");
}

}  // namespace

void ridgescope_bindings::bind_trace(py::module_& m) {
  py::register_exception<ridgescope::TraceError>(m, "TraceError", PyExc_ValueError);

  m.attr("TRACE_FORMAT_VERSION") = ridgescope::trace_format::kVersion;
  m.attr("REPORT_SCHEMA_VERSION") = ridgescope::kReportSchemaVersion;
  py::list names;
  for (std::size_t i = 0; i < ridgescope::kCategoryCount; ++i) {
    names.append(std::string(ridgescope::category_name(static_cast<Category>(i))));
  }
  m.attr("CATEGORIES") = names;

  // The rules and constants Python shares with C++ (one definition each, here exported).
  m.attr("VERSION") = RIDGESCOPE_VERSION;  // python/ridgescope/_version.py, read by CMake
  m.attr("TRACE_MAGIC") = py::bytes(ridgescope::trace_format::kFileMagic, sizeof ridgescope::trace_format::kFileMagic);
  m.attr("CUDA_MIN_BLOCK_BYTES") = ridgescope::kCudaMinBlockSize;
  m.attr("CUDA_SMALL_POOL_REQUEST_BYTES") = ridgescope::FreeSpace::kSmallPoolRequestBytes;
  m.attr("CUBLAS_DEFAULT_WORKSPACE_BYTES") = ridgescope::kCublasDefaultWorkspaceBytes;
  m.attr("CUBLAS_HOPPER_WORKSPACE_BYTES") = ridgescope::kCublasHopperWorkspaceBytes;
  m.attr("CUBLASLT_DEFAULT_WORKSPACE_BYTES") = ridgescope::kCublasLtDefaultWorkspaceBytes;
  m.def("format_bytes", &ridgescope::detail::format_bytes, py::arg("nbytes"),
        "Bytes as a person reads them: format_bytes(1536) == '1.50 KiB' (csrc/core/util/format_bytes.h).");

  m.def(
      "analyze",
      [](const std::string& path, std::size_t top_blocks, std::optional<std::uint64_t> probe_time_ns,
         std::size_t timeline_columns, std::optional<int> cuda_device, bool cpu) {
        ridgescope::AnalysisOptions options;
        options.top_blocks = top_blocks;
        options.probe_time_ns = probe_time_ns;
        options.timeline_columns = timeline_columns;
        if (cpu) options.device = ridgescope::Device{};
        if (cuda_device) {
          options.device = ridgescope::Device{ridgescope::DeviceType::CUDA, static_cast<std::int16_t>(*cuda_device)};
        }
        return ridgescope::report_to_json(ridgescope::analyze_trace(path, options));
      },
      py::arg("path"), py::arg("top_blocks") = 20, py::arg("probe_time_ns") = py::none(),
      py::arg("timeline_columns") = 2000, py::arg("cuda_device") = py::none(), py::arg("cpu") = false,
      py::call_guard<py::gil_scoped_release>(),
      "Analyse a trace file; returns the report as JSON text.");
  m.def("read_events", &read_events, py::arg("path"), py::arg("limit") = SIZE_MAX,
        "Decode a trace's events as dicts (for inspection and tests).");

  // Torch memory snapshots (docs/snapshot.md).
  m.def(
      "write_snapshot",
      [](const std::string& trace_path, const std::string& out_path, std::optional<int> cuda_device,
         bool cpu) {
        ridgescope::SnapshotWriteOptions options;
        if (cpu) options.device = ridgescope::Device{};
        if (cuda_device) {
          options.device = ridgescope::Device{ridgescope::DeviceType::CUDA, static_cast<std::int16_t>(*cuda_device)};
        }
        const auto s = ridgescope::write_snapshot(trace_path, out_path, options);
        return std::map<std::string, std::uint64_t>{{"trace_entries", s.trace_entries},
                                                    {"allocations", s.allocations},
                                                    {"segments", s.segments},
                                                    {"annotations", s.annotations},
                                                    {"bytes", s.bytes}};
      },
      py::arg("trace_path"), py::arg("out_path"), py::arg("cuda_device") = py::none(), py::arg("cpu") = false,
      py::call_guard<py::gil_scoped_release>(),
      "Write a trace as a torch.cuda.memory._snapshot() pickle; returns counts.");
  m.def(
      "analyze_snapshot",
      [](const std::string& path, std::size_t top_blocks, std::optional<std::uint64_t> probe_time_ns,
         std::size_t timeline_columns, std::optional<int> device_index, const std::vector<RuleTuple>& rules) {
        ridgescope::AnalysisOptions options;
        options.top_blocks = top_blocks;
        options.probe_time_ns = probe_time_ns;
        options.timeline_columns = timeline_columns;
        ridgescope::SnapshotReadOptions read;
        read.device_index = device_index;
        read.rules = to_rules(rules);
        return ridgescope::report_to_json(ridgescope::analyze_snapshot(path, options, read));
      },
      py::arg("path"), py::arg("top_blocks") = 20, py::arg("probe_time_ns") = py::none(),
      py::arg("timeline_columns") = 2000, py::arg("device_index") = py::none(),
      py::arg("rules") = std::vector<RuleTuple>{},
      py::call_guard<py::gil_scoped_release>(),
      "Read a torch memory snapshot pickle (restricted unpickler) and analyse it; returns JSON.");
  m.def(
      "snapshot_to_trace",
      [](const std::string& pickle_path, const std::string& trace_path, std::optional<int> device_index,
         const std::vector<RuleTuple>& rules) {
        ridgescope::SnapshotReadOptions read;
        read.device_index = device_index;
        read.rules = to_rules(rules);
        return ridgescope::snapshot_to_trace(pickle_path, trace_path, read).alloc_conf;
      },
      py::arg("pickle_path"), py::arg("trace_path"), py::arg("device_index") = py::none(),
      py::arg("rules") = std::vector<RuleTuple>{},
      py::call_guard<py::gil_scoped_release>(),
      "Replay a torch memory snapshot pickle as a ridgescope trace file; returns the snapshot's "
      "PYTORCH_CUDA_ALLOC_CONF (allocator_settings), '' when it has none.");

  // A trace written event by event (the dry run of rs.estimate writes its synthetic events
  // here, so the normal analysis reads them). Times are the caller's nanoseconds.
  py::class_<ridgescope::Recorder>(m, "TraceWriter")
      .def(py::init<const std::string&>(), py::arg("path"))
      .def("intern", [](ridgescope::Recorder& r, const std::string& text) { return r.intern(text); })
      .def("metadata", [](ridgescope::Recorder& r, const std::string& key,
                          const std::string& json) { r.metadata(key, json); })
      .def("event",
           [](ridgescope::Recorder& r, const std::string& kind, std::uint64_t time_ns,
              bool cuda, std::uint64_t addr, std::uint64_t bytes, std::uint64_t requested_bytes,
              const std::string& category, bool weak, std::uint32_t string_id,
              std::uint64_t value, std::uint64_t stream) {
             ridgescope::Event e;
             e.kind = to_event_kind(kind);
             e.time_ns = time_ns;
             e.device = cuda ? ridgescope::Device{ridgescope::DeviceType::CUDA, 0} : ridgescope::Device{};
             e.addr = addr;
             e.bytes = bytes;
             e.requested_bytes = requested_bytes;
             e.category = to_category(category);
             e.flags = weak ? ridgescope::kTagWeak : 0;
             e.string_id = string_id;
             e.value = value;
             e.stream = stream;
             r.record_timed(e);
           },
           py::arg("kind"), py::arg("time_ns"), py::arg("cuda") = false, py::arg("addr") = 0,
           py::arg("bytes") = 0, py::arg("requested_bytes") = 0, py::arg("category") = "unknown",
           py::arg("weak") = false, py::arg("string_id") = 0, py::arg("value") = 0,
           py::arg("stream") = 0)
      .def("close", &ridgescope::Recorder::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("failed", &ridgescope::Recorder::failed)
      .def_property_readonly("error", &ridgescope::Recorder::error);
}
