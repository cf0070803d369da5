// analysis.cpp — trace -> Report in two streaming passes (see ridgescope/analysis.h): pass 1
// resolves every block's category and finds each device's peak (lifetime_pass.cpp), pass 2
// replays the reported device and gathers the report (replay_pass.cpp); then the warnings
// (report_warnings.cpp), the run summary (run_summary.cpp) and the OOM verdicts
// (forensics.cpp).
#include "ridgescope/analysis.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "lifetime_pass.h"
#include "replay_pass.h"
#include "report_warnings.h"
#include "run_glance.h"
#include "run_summary.h"
#include "ridgescope/forensics.h"
#include "ridgescope/trace_reader.h"

namespace ridgescope {

using detail::LifetimePass;
using detail::Resolved;

Report analyze_trace(const std::string& path, const AnalysisOptions& options) {
  TraceReader reader(path);
  LifetimePass lifetimes;
  lifetimes.run(reader);

  Report report;
  report.trace.path = path;
  report.trace.file_bytes = reader.file_bytes();
  report.trace.format_version = reader.version();
  report.trace.events = lifetimes.events();
  report.trace.skipped_records = reader.skipped_records();
  report.trace.truncated = reader.truncated();
  report.trace.truncated_at = reader.truncated_at();
  report.trace.problem = reader.problem();
  report.trace.duration_ns = lifetimes.last_time();

  // The device to report: the one asked for, else the one with the highest peak.
  Device device;
  std::uint64_t best = 0;
  bool has_peak = false;
  std::uint64_t peak_seq = 0;
  std::vector<std::pair<std::uint64_t, LifetimePass::DevicePeak>> peaks(lifetimes.peaks().begin(),
                                                                          lifetimes.peaks().end());
  std::sort(peaks.begin(), peaks.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [code, peak] : peaks) {
    report.devices_seen.push_back(detail::device_from_code(code));
    const Device d = detail::device_from_code(code);
    if (options.device ? d == *options.device : (!has_peak || peak.peak > best)) {
      device = d;
      best = peak.peak;
      has_peak = peak.peak > 0;
      peak_seq = peak.peak_seq;
    }
  }
  if (options.device) device = *options.device;
  report.device = device;

  reader.rewind();
  detail::ReplayPass replay(reader, lifetimes.resolved(), device, peak_seq, has_peak, lifetimes.last_time(),
                    options, report);
  replay.run(reader);
  replay.finish_dashboards();
  detail::add_warnings(report);
  detail::summarise_run(report);
  detail::build_glance(lifetimes.summaries(), lifetimes.summaries_recorded(), reader, options.standout_fraction, report);
  // The verdicts need the device capacity, which the run's metadata gives.
  for (std::size_t i = 0; i < report.ooms.size() && i < replay.oom_contexts_.size(); ++i) {
    OomContext& c = replay.oom_contexts_[i];
    c.capacity_bytes = report.device_capacity_bytes;
    report.ooms[i].verdict = explain_oom(c);
  }
  return report;
}

std::vector<BlockAttribution> attribute_blocks(const std::string& path) {
  TraceReader reader(path);
  LifetimePass lifetimes;
  lifetimes.run(reader);
  std::vector<BlockAttribution> out;
  out.reserve(lifetimes.resolved().size());
  for (const Resolved& r : lifetimes.resolved()) out.push_back({r.category, r.inferred, r.label_id});
  return out;
}

}  // namespace ridgescope
