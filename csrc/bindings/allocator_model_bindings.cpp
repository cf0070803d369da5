// allocator_model_bindings.cpp — pybind11 conversions for ridgescope/allocator_model.h
// (_C.AllocatorModel, _C.parse_alloc_conf, _C.simulate_allocator, _C.replay_allocator_actions).
// the logic is in csrc/core/allocator/, the policy in
// python/ridgescope/_allocator_model.py. A bad settings string raises ValueError with the
// parser's message.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "ridgescope/allocator_model.h"

namespace ridgescope_bindings {

namespace py = pybind11;

static ridgescope::AllocatorSettings allocator_settings_from(const std::string& text,
                                                             std::uint64_t capacity) {
  ridgescope::AllocatorSettings s;
  std::string error;
  if (!ridgescope::parse_allocator_settings(text, &s, &error)) throw py::value_error(error);
  s.capacity_bytes = capacity;
  return s;
}

static py::dict allocator_settings_dict(const ridgescope::AllocatorSettings& s) {
  py::dict d;
  d["alloc_conf"] = ridgescope::format_allocator_settings(s);
  d["max_split_size"] = s.max_split_size_bytes;  // 0 = unlimited
  d["max_non_split_rounding"] = s.max_non_split_rounding_bytes;
  d["large_segment_size"] = s.large_segment_bytes;
  py::list divisions;
  for (auto v : s.roundup_power2_divisions) divisions.append(v);
  d["roundup_power2_divisions"] = divisions;
  d["expandable_segments"] = s.expandable_segments;
  d["garbage_collection_threshold"] = s.garbage_collection_threshold;
  d["per_process_memory_fraction"] = s.per_process_memory_fraction;
  d["capacity"] = s.capacity_bytes;
  return d;
}

static py::dict allocator_stats_dict(const ridgescope::AllocatorStats& st) {
  py::dict d;
  d["allocated_bytes"] = st.allocated_bytes;
  d["requested_bytes"] = st.requested_bytes;
  d["reserved_bytes"] = st.reserved_bytes;
  d["peak_allocated_bytes"] = st.peak_allocated_bytes;
  d["peak_reserved_bytes"] = st.peak_reserved_bytes;
  d["peak_requested_bytes"] = st.peak_requested_bytes;
  d["small_allocated_bytes"] = st.small_allocated_bytes;
  d["large_allocated_bytes"] = st.large_allocated_bytes;
  d["small_reserved_bytes"] = st.small_reserved_bytes;
  d["large_reserved_bytes"] = st.large_reserved_bytes;
  d["inactive_split_bytes"] = st.inactive_split_bytes;
  d["inactive_split_count"] = st.inactive_split_count;
  d["largest_free_small_bytes"] = st.largest_free_small_bytes;
  d["largest_free_large_bytes"] = st.largest_free_large_bytes;
  d["active_count"] = st.active_count;
  d["segment_count"] = st.segment_count;
  d["device_alloc_count"] = st.device_alloc_count;
  d["device_free_count"] = st.device_free_count;
  d["alloc_retries"] = st.alloc_retries;
  d["oom_count"] = st.oom_count;
  return d;
}

static py::list allocator_segment_events_list(
    const std::vector<ridgescope::AllocatorSegmentEvent>& events) {
  py::list out;
  for (const auto& e : events) {
    py::dict d;
    d["action"] = std::string(ridgescope::allocator_segment_event_name(e.kind));
    d["address"] = e.address;
    d["bytes"] = e.bytes;
    d["stream"] = e.stream;
    d["reserved_after"] = e.reserved_after;
    out.append(std::move(d));
  }
  return out;
}

static py::dict replay_result_dict(const ridgescope::ReplayResult& r) {
  py::dict d;
  d["settings"] = allocator_settings_dict(r.settings);
  d["actions"] = r.actions;
  d["allocs"] = r.allocs;
  d["frees"] = r.frees;
  d["unmatched_frees"] = r.unmatched_frees;
  d["duplicate_allocs"] = r.duplicate_allocs;
  d["failed_allocs"] = r.failed_allocs;
  d["first_failure_index"] = r.failed_allocs ? py::object(py::int_(r.first_failure_index))
                                             : py::object(py::none());
  d["recorded_peak_bytes"] = r.recorded_peak_bytes;
  d["peak_allocated_bytes"] = r.final_stats.peak_allocated_bytes;
  d["peak_reserved_bytes"] = r.final_stats.peak_reserved_bytes;
  d["peak_allocated_time_ns"] = r.peak_allocated_time_ns;
  d["peak_reserved_time_ns"] = r.peak_reserved_time_ns;
  d["segment_count"] = r.final_stats.segment_count;
  d["final"] = allocator_stats_dict(r.final_stats);
  py::list timeline;
  for (const auto& p : r.timeline) {
    py::dict t;
    t["index"] = p.index;
    t["time_ns"] = p.time_ns;
    t["allocated_bytes"] = p.allocated_bytes;
    t["reserved_bytes"] = p.reserved_bytes;
    timeline.append(std::move(t));
  }
  d["timeline"] = timeline;
  d["segment_events"] = allocator_segment_events_list(r.segment_events);
  d["truncated"] = r.truncated;
  d["problem"] = r.problem;
  return d;
}

static ridgescope::AllocatorAction::Kind allocator_action_kind(const std::string& name) {
  using K = ridgescope::AllocatorAction::Kind;
  if (name == "alloc") return K::Alloc;
  if (name == "free" || name == "free_completed") return K::Free;
  if (name == "empty_cache") return K::EmptyCache;
  if (name == "segment_alloc" || name == "segment_map") return K::SegmentHint;
  if (name == "segment_free" || name == "segment_unmap") return K::ReleaseSegment;
  throw py::value_error("unknown allocator action '" + name +
                        "' (alloc, free, free_completed, empty_cache, segment_alloc, "
                        "segment_map, segment_free or segment_unmap)");
}

void bind_allocator_model(py::module_& m) {
  using ridgescope::AllocatorModel;
  py::class_<AllocatorModel>(m, "AllocatorModel")
      .def(py::init([](const std::string& settings, std::uint64_t capacity) {
             return std::make_unique<AllocatorModel>(allocator_settings_from(settings, capacity));
           }),
           py::arg("settings") = "", py::arg("capacity") = 0)
      .def("malloc",
           [](AllocatorModel& self, std::uint64_t alloc_id, std::uint64_t nbytes,
              std::uint64_t stream) {
             const ridgescope::MallocResult r = self.malloc(alloc_id, nbytes, stream);
             py::dict d;
             d["ok"] = r.ok();
             d["status"] = r.status == ridgescope::MallocStatus::Ok            ? "ok"
                           : r.status == ridgescope::MallocStatus::OutOfMemory ? "out_of_memory"
                                                                               : "duplicate_id";
             d["requested_bytes"] = r.requested_bytes;
             d["block_bytes"] = r.block_bytes;
             d["address"] = r.address;
             d["segment_bytes"] = r.segment_bytes;
             d["released_bytes"] = r.released_bytes;
             d["segment_created"] = r.segment_created;
             d["small_pool"] = r.small_pool;
             return d;
           },
           py::arg("alloc_id"), py::arg("nbytes"), py::arg("stream") = 0)
      .def("free", &AllocatorModel::free, py::arg("alloc_id"))
      .def("empty_cache", &AllocatorModel::empty_cache)
      .def("reset_peaks", &AllocatorModel::reset_peaks)
      .def("stats", [](const AllocatorModel& self) { return allocator_stats_dict(self.stats()); })
      .def("settings",
           [](const AllocatorModel& self) { return allocator_settings_dict(self.settings()); })
      .def("segments",
           [](const AllocatorModel& self) {
             py::list out;
             for (const auto& s : self.segments()) {
               py::dict d;
               d["address"] = s.address;
               d["total_size"] = s.total_bytes;
               d["allocated_size"] = s.allocated_bytes;
               d["requested_size"] = s.requested_bytes;
               d["stream"] = s.stream;
               d["segment_type"] = s.is_large ? "large" : "small";
               d["is_expandable"] = s.is_expandable;
               py::list blocks;
               for (const auto& b : s.blocks) {
                 py::dict bd;
                 bd["address"] = b.address;
                 bd["size"] = b.bytes;
                 bd["requested_size"] = b.requested_bytes;
                 bd["state"] = b.allocated ? "active_allocated" : "inactive";
                 blocks.append(std::move(bd));
               }
               d["blocks"] = blocks;
               out.append(std::move(d));
             }
             return out;
           },
           "The segments as torch.cuda.memory_snapshot() lists them (same keys).")
      .def("hint_next_segment_address", &AllocatorModel::hint_next_segment_address,
           py::arg("address"))
      .def("release_cached_segment", &AllocatorModel::release_cached_segment, py::arg("address"))
      .def("record_segment_events", &AllocatorModel::record_segment_events, py::arg("enabled"))
      .def("segment_events",
           [](const AllocatorModel& self) {
             return allocator_segment_events_list(self.segment_events());
           })
      .def_property_readonly("allocated_bytes", &AllocatorModel::allocated_bytes)
      .def_property_readonly("reserved_bytes", &AllocatorModel::reserved_bytes)
      .def_property_readonly("peak_allocated_bytes", &AllocatorModel::peak_allocated_bytes)
      .def_property_readonly("peak_reserved_bytes", &AllocatorModel::peak_reserved_bytes)
      .def_property_readonly("segment_count", &AllocatorModel::segment_count);

  m.def(
      "parse_alloc_conf",
      [](const std::string& text) { return allocator_settings_dict(allocator_settings_from(text, 0)); },
      py::arg("alloc_conf"), "Parse a PYTORCH_CUDA_ALLOC_CONF string (ValueError if malformed).");
  m.def(
      "allocator_round_size",
      [](std::uint64_t nbytes, const std::string& settings) {
        return ridgescope::cuda_round_size(
            nbytes, ridgescope::allocator_rounding_rules(allocator_settings_from(settings, 0)));
      },
      py::arg("nbytes"), py::arg("settings") = "",
      "The block size torch's CUDA caching allocator gives a request (round_size).");
  m.def(
      "simulate_allocator",
      [](const std::string& path, const std::string& settings, std::uint64_t capacity,
         std::size_t timeline_points, int device, bool keep_segment_events,
         bool use_recorded_segment_addresses) {
        const ridgescope::AllocatorSettings s = allocator_settings_from(settings, capacity);
        ridgescope::ReplayOptions o;
        o.timeline_points = timeline_points;
        o.device = device;
        o.keep_segment_events = keep_segment_events;
        o.use_recorded_segment_addresses = use_recorded_segment_addresses;
        ridgescope::ReplayResult r;
        {
          py::gil_scoped_release release;
          r = ridgescope::replay_trace_through_allocator(path, s, o);
        }
        return replay_result_dict(r);
      },
      py::arg("path"), py::arg("settings") = "", py::arg("capacity") = 0,
      py::arg("timeline_points") = 512, py::arg("device") = -2,
      py::arg("keep_segment_events") = false, py::arg("use_recorded_segment_addresses") = false,
      "Replay a trace's alloc/free events through the allocator model; returns a summary dict.");
  m.def(
      "replay_allocator_actions",
      [](const std::vector<std::tuple<std::string, std::uint64_t, std::uint64_t, std::uint64_t>>&
             actions,
         const std::string& settings, std::uint64_t capacity, std::size_t timeline_points,
         bool keep_segment_events) {
        const ridgescope::AllocatorSettings s = allocator_settings_from(settings, capacity);
        std::vector<ridgescope::AllocatorAction> converted;
        converted.reserve(actions.size());
        for (const auto& [kind, address, nbytes, stream] : actions) {
          ridgescope::AllocatorAction a;
          a.kind = allocator_action_kind(kind);
          a.address = address;
          a.bytes = nbytes;
          a.stream = stream;
          a.time_ns = converted.size();
          converted.push_back(a);
        }
        ridgescope::ReplayOptions o;
        o.timeline_points = timeline_points;
        o.keep_segment_events = keep_segment_events;
        ridgescope::ReplayResult r;
        {
          py::gil_scoped_release release;
          r = ridgescope::replay_allocator_actions(converted, s, o);
        }
        return replay_result_dict(r);
      },
      py::arg("actions"), py::arg("settings") = "", py::arg("capacity") = 0,
      py::arg("timeline_points") = 0, py::arg("keep_segment_events") = true,
      "Replay (action, address, nbytes, stream) tuples, e.g. a torch snapshot's alloc and "
      "free_completed entries (segment_alloc / segment_map entries place the model's next "
      "segment at the recorded address, segment_free / segment_unmap release the cached "
      "segment there); time_ns of the timeline is the action index.");
}

}  // namespace ridgescope_bindings
