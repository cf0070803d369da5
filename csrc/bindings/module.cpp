// module.cpp — ridgescope._C: pybind11 conversions only; the logic lives in csrc/core and
// csrc/torch, the policy in python/ridgescope.
#include <torch/extension.h>

#include "ridgescope/analysis.h"
#include "ridgescope/category.h"
#include "ridgescope/cuda_rounding.h"
#include "ridgescope/cuda_workspace.h"
#include "ridgescope/external_alloc.h"
#include "ridgescope/forensics.h"
#include "ridgescope/snapshot.h"
#include "ridgescope/recorder.h"
#include "ridgescope/trace_format.h"
#include "ridgescope/trace_reader.h"
#include "cpu_allocator_source.h"
#include "cuda_allocator_source.h"
#include "cupti_source.h"
#include "format_bytes.h"
#include "host_memory_source.h"
#include "python_frames.h"
#include "python_locals.h"
#include "site_capture.h"
#include "tracking_session.h"
#include "allocator_model_bindings.h"
#include "distributed_bindings.h"
#include "flight_bindings.h"

namespace py = pybind11;
using ridgescope::Category;
using ridgescope::sources::TrackingSession;

namespace {

Category to_category(const std::string& name) {
  Category c;
  if (!ridgescope::parse_category(name, &c)) {
    throw py::value_error("unknown category '" + name + "'");
  }
  return c;
}

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

// The saved-tensor hooks as plain CPython functions (METH_O): torch calls them for every tensor
// saved for backward (pack) and every use of one in backward (unpack); a pybind11 method's
// dispatch costs more than the work. The pack hook's self is a capsule holding the session,
// which also keeps the Python session object alive as long as torch holds the hook.
constexpr const char* kSessionCapsule = "ridgescope.TrackingSession";

PyObject* pack_saved(PyObject* capsule, PyObject* tensor) {
  auto* session = static_cast<TrackingSession*>(PyCapsule_GetPointer(capsule, kSessionCapsule));
  if (session == nullptr) return nullptr;
  try {
    if (THPVariable_Check(tensor)) session->on_saved_tensor(THPVariable_Unpack(tensor));
  } catch (...) {
    PyErr_Clear();  // not a tensor we can read: saved as it is, untagged
  }
  Py_INCREF(tensor);
  return tensor;
}

PyObject* unpack_saved(PyObject*, PyObject* packed) {
  Py_INCREF(packed);
  return packed;
}

PyMethodDef kPackSaved = {"pack_saved", pack_saved, METH_O, "ridgescope's saved-tensor pack hook"};
PyMethodDef kUnpackSaved = {"unpack_saved", unpack_saved, METH_O, "the identity: ridgescope's unpack hook"};

void release_session(PyObject* capsule) {
  Py_XDECREF(static_cast<PyObject*>(PyCapsule_GetContext(capsule)));
}

py::tuple saved_tensor_hooks(py::object session) {
  TrackingSession& s = session.cast<TrackingSession&>();
  PyObject* capsule = PyCapsule_New(&s, kSessionCapsule, release_session);
  if (capsule == nullptr) throw py::error_already_set();
  PyCapsule_SetContext(capsule, session.inc_ref().ptr());
  py::object self = py::reinterpret_steal<py::object>(capsule);
  py::object pack = py::reinterpret_steal<py::object>(PyCFunction_New(&kPackSaved, self.ptr()));
  py::object unpack = py::reinterpret_steal<py::object>(PyCFunction_New(&kUnpackSaved, nullptr));
  if (!pack || !unpack) throw py::error_already_set();
  return py::make_tuple(pack, unpack);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "ridgescope native core (see python/ridgescope for the public API)";
  ridgescope_bindings::bind_allocator_model(m);  // _C.AllocatorModel, simulate_allocator
  ridgescope_bindings::bind_distributed(m);      // _C.ddp_buckets
  ridgescope_bindings::bind_flight(m);           // _C.compact_trace, read_summaries, TraceFollower
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
  py::list stack_modes;
  for (auto mode : {ridgescope::sources::StackMode::Site, ridgescope::sources::StackMode::Python,
                    ridgescope::sources::StackMode::All, ridgescope::sources::StackMode::Off}) {
    stack_modes.append(ridgescope::sources::stack_mode_name(mode));
  }
  m.attr("STACK_MODES") = py::tuple(stack_modes);  // rs.track(stacks=...), the default first
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

  m.def("_cpu_allocator_installed", &ridgescope::sources::cpu_allocator_source_installed,
        "Whether ridgescope's tracking CPU allocator is registered now (for tests).");
  m.def("_cuda_source_compiled", &ridgescope::sources::cuda_source_compiled,
        "Whether this build has the CUDA caching-allocator source (torch had CUDA at build time).");
  m.def("_cupti_source_compiled", &ridgescope::sources::cupti_source_compiled,
        "Whether this build has the CUPTI source (CUPTI's headers were found at build time).");
  m.def(
      "_resident_part",
      [](const std::vector<std::pair<std::uint64_t, std::uint64_t>>& blocks) {
        std::vector<unsigned char> pages;
        return ridgescope::sources::resident_part(blocks, pages);
      },
      py::arg("blocks"),
      "The bytes of (address, bytes) ranges whose pages are resident (mincore; the host source's rule).");
  m.def("_cuda_workspace_tags_compiled", &ridgescope::sources::cuda_workspace_tags_compiled,
        "Whether this build reads torch's cuBLAS workspace maps (workspace blocks are tagged).");
  m.def("_cuda_allocator_backend", &ridgescope::sources::cuda_allocator_backend,
        "The CUDA allocator backend ('native', 'cudaMallocAsync'), or '' without CUDA.");
  m.def("_cuda_source_stats", &ridgescope::sources::cuda_source_stats_json,
        "The CUDA source's counters as JSON text (for tests and the GPU check).");
  m.def("_cpu_live_bytes", &ridgescope::sources::cpu_live_bytes,
        "The CPU source's own count of live bytes in the running session (for tests).");

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

  m.def("configure_python_frames", &ridgescope::sources::configure_python_frames,
        py::arg("library_roots"), py::arg("stdlib_roots"),
        "Set which files are library code for allocation sites and install the Python frame "
        "walker after checking it on this thread; returns '' or why Python frames are not read.");

  m.def("frame_locals",
        [](py::object frame) -> py::object {
          PyObject* out = ridgescope::sources::frame_locals(frame.ptr());
          if (out == nullptr) throw py::error_already_set();
          return py::reinterpret_steal<py::object>(out);
        },
        py::arg("frame"),
        "The (name, value) pairs of a running frame's locals, without the snapshot f_locals "
        "keeps (python_locals.h); None where this build does not read them.");
  m.def("frame_locals_status", &ridgescope::sources::frame_locals_status,
        "'' when frame_locals reads this interpreter's frames, else why not.");

  py::class_<TrackingSession>(m, "Session")
      .def(py::init([](const std::string& path, std::uint64_t capacity, const std::string& stacks,
                       std::uint64_t keep_steps, bool host_memory) {
             ridgescope::sources::StackMode mode;
             if (!ridgescope::sources::parse_stack_mode(stacks, &mode)) {
               throw py::value_error("stacks must be 'site', 'python', 'all' or 'none', got '" + stacks + "'");
             }
             ridgescope::FlightOptions flight;
             flight.keep_steps = keep_steps;
             return std::make_unique<TrackingSession>(path, capacity, mode, flight, host_memory);
           }),
           py::arg("path"), py::arg("capacity") = 0, py::arg("stacks") = "site", py::arg("keep_steps") = 0,
           py::arg("host_memory") = true)
      .def_property_readonly("keep_steps", &TrackingSession::keep_steps)
      .def("mark", &TrackingSession::mark)
      .def("stop", &TrackingSession::stop, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("active", &TrackingSession::active)
      .def_property_readonly("degraded", &TrackingSession::degraded)
      .def_property_readonly("error", &TrackingSession::error)
      .def_property_readonly("path", &TrackingSession::path)
      .def("start_driver_view", &TrackingSession::start_driver_view, py::arg("interval_ms") = 100)
      .def("start_cuda", &TrackingSession::start_cuda, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("cuda_started", &TrackingSession::cuda_started)
      .def("start_cupti", &TrackingSession::start_cupti, py::call_guard<py::gil_scoped_release>())
      .def("set_host_memory", &TrackingSession::set_host_memory, py::arg("on"))
      .def("flush", &TrackingSession::flush, py::call_guard<py::gil_scoped_release>())
      .def("intern", &TrackingSession::intern)
      .def("metadata", &TrackingSession::metadata)
      .def("phase_begin", &TrackingSession::phase_begin)
      .def("phase_end", &TrackingSession::phase_end)
      .def("step", &TrackingSession::step)
      .def("sample_allocator", &TrackingSession::sample_allocator)
      .def("tag",
           [](TrackingSession& s, const at::Tensor& t, const std::string& category,
              std::uint32_t label, bool weak) { s.tag_tensor(t, to_category(category), label, weak); },
           py::arg("tensor"), py::arg("category"), py::arg("label") = 0, py::arg("weak") = false)
      .def("register",
           [](TrackingSession& s, const at::Tensor& t, const std::string& category,
              std::uint32_t label, bool weak) { return s.register_tensor(t, to_category(category), label, weak); },
           py::arg("tensor"), py::arg("category"), py::arg("label") = 0, py::arg("weak") = false)
      .def("pack_saved",
           [](TrackingSession& s, const at::Tensor& t) { return s.on_saved_tensor(t); })
      .def("saved_tensor_hooks", &saved_tensor_hooks,
           "(pack, unpack): the saved-tensor hooks as plain C functions (pack tags activations)")
      .def("watch_parameters", &TrackingSession::watch_parameters)
      .def("tag_gradients", &TrackingSession::tag_gradients)
      .def("enter_module", &TrackingSession::enter_module, py::arg("activation_label"),
           py::arg("context") = 0)
      .def("exit_module", &TrackingSession::exit_module)
      .def("degrade", &TrackingSession::degrade)
      .def("inject_fault", &TrackingSession::inject_fault)
      .def("stats", [](const TrackingSession& s) {
        const auto st = s.stats();
        py::dict d;
        d["events"] = st.events;
        d["dropped_events"] = st.dropped_events;
        d["bytes_written"] = st.bytes_written;
        d["chunks_written"] = st.chunks_written;
        d["file_bytes"] = st.file_bytes;
        d["buffer_bytes_peak"] = st.buffer_bytes_peak;
        return d;
      });
}
