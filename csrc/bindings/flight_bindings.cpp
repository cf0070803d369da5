// flight_bindings.cpp — ridgescope._C's flight recorder conversions (docs/long-runs.md):
// `compact_trace(in, out, keep_steps)`, `read_summaries(path)` and `TraceFollower(path)` (whose
// poll() returns the live view as a dict, for `ridgescope watch`). Conversions only.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bindings.h"
#include "ridgescope/category.h"
#include "ridgescope/flight.h"
#include "ridgescope/report.h"
#include "ridgescope/trace_reader.h"

namespace ridgescope_bindings {

static pybind11::dict summary_dict(const ridgescope::StepSummary& s, const std::function<std::string(std::uint32_t)>& text) {
  namespace py = pybind11;
  py::dict d;
  d["step"] = s.step;
  d["device"] = ridgescope::device_name(s.device);
  d["complete"] = (s.flags & ridgescope::kSummaryComplete) != 0;
  d["growth"] = (s.flags & ridgescope::kSummaryGrowth) != 0;
  d["begin_time_ns"] = s.begin_time_ns;
  d["end_time_ns"] = s.end_time_ns;
  d["start_bytes"] = s.start_bytes;
  d["end_bytes"] = s.end_bytes;
  d["peak_bytes"] = s.peak_bytes;
  d["peak_reserved_bytes"] = s.peak_reserved_bytes;
  d["allocations"] = s.allocations;
  d["ooms"] = s.ooms;
  d["marks"] = s.marks;
  d["mark"] = s.mark_id != 0 ? text(s.mark_id) : std::string();
  py::dict by;
  for (std::size_t i = 0; i < ridgescope::kCategoryCount; ++i) {
    by[py::str(std::string(ridgescope::category_name(static_cast<ridgescope::Category>(i))))] = s.peak_by_category[i];
  }
  d["peak_by_category"] = by;
  py::dict phases;
  for (const auto& p : s.phases) phases[py::str(text(p.name_id))] = p.peak_bytes;
  d["phases"] = phases;
  return d;
}

static pybind11::dict categories_dict(const std::array<std::uint64_t, ridgescope::kCategoryCount>& bytes) {
  pybind11::dict by;
  for (std::size_t i = 0; i < ridgescope::kCategoryCount; ++i) {
    by[pybind11::str(std::string(ridgescope::category_name(static_cast<ridgescope::Category>(i))))] = bytes[i];
  }
  return by;
}

void bind_flight(pybind11::module_& m) {
  namespace py = pybind11;
  m.def(
      "compact_trace",
      [](const std::string& in, const std::string& out, std::uint64_t keep_steps, std::uint64_t rewrite_bytes) {
        ridgescope::FlightOptions options;
        options.keep_steps = keep_steps;
        if (rewrite_bytes > 0) options.rewrite_bytes = rewrite_bytes;
        const auto r = ridgescope::compact_trace(in, out, options);
        return std::map<std::string, std::uint64_t>{{"events", r.events}, {"steps", r.steps},
                                                    {"in_bytes", r.in_bytes}, {"out_bytes", r.out_bytes},
                                                    {"truncated", r.truncated ? 1u : 0u}};
      },
      py::arg("in_path"), py::arg("out_path"), py::arg("keep_steps"), py::arg("rewrite_bytes") = 0,
      py::call_guard<py::gil_scoped_release>(),
      "Re-record a full trace as a bounded one (keep_steps > 0) through the flight recorder.");
  m.def(
      "read_summaries",
      [](const std::string& path) {
        ridgescope::TraceReader reader(path);
        std::vector<ridgescope::StepSummary> all;
        ridgescope::Event e;
        while (reader.next(e)) {
          if (e.kind == ridgescope::EventKind::StepSummary) all.push_back(reader.summary());
        }
        py::list out;
        for (const auto& s : all) out.append(summary_dict(s, [&](std::uint32_t id) { return std::string(reader.string(id)); }));
        return out;
      },
      py::arg("path"), "The per-step summary records of a trace (format 4), as dicts, in file order.");

  py::class_<ridgescope::TraceFollower>(m, "TraceFollower")
      .def(py::init<std::string>(), py::arg("path"))
      .def("poll", [](ridgescope::TraceFollower& f, std::size_t since) {
        ridgescope::TraceFollower::View v;
        {
          py::gil_scoped_release release;
          v = f.poll();
        }
        py::dict d;
        d["readable"] = v.readable;
        d["problem"] = v.problem;
        d["file_bytes"] = v.file_bytes;
        d["step"] = v.step;
        d["phases"] = v.phases;
        d["time_ns"] = v.time_ns;
        d["ended"] = v.ended;
        d["rewrites"] = v.rewrites;
        py::list devices;
        for (const auto& dev : v.devices) {
          py::dict x;
          x["device"] = ridgescope::device_name(dev.device);
          x["live_bytes"] = dev.live_bytes;
          x["reserved_bytes"] = dev.reserved_bytes;
          x["by_category"] = categories_dict(dev.by_category);
          devices.append(x);
        }
        d["devices"] = devices;
        d["summary_count"] = v.summaries.size();
        py::list summaries;  // the ones after the first `since`
        for (std::size_t i = std::min(since, v.summaries.size()); i < v.summaries.size(); ++i) {
          summaries.append(summary_dict(v.summaries[i], [&](std::uint32_t id) { return f.string(id); }));
        }
        d["summaries"] = summaries;
        return d;
      }, py::arg("since") = 0,
      "Reads what was appended since the last poll; returns the view, with the summaries after the first `since`.");
}

}  // namespace ridgescope_bindings
