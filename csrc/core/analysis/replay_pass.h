// replay_pass.h — pass 2 of the analysis (analysis.cpp, see ridgescope/analysis.h): replays
// one device's events through a Ledger with the categories pass 1 resolved (lifetime_pass.h)
// and gathers the report: steps and phases, the peak and what was live at it, OOMs, the
// timeline, retained tensors, the driver view, consistency with the allocator's readings, the
// dashboards' samples and the probe. Internal to the analysis layer.
//
// Thread-safety: none; one pass per analysis.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "device_ledger.h"
#include "host_ledger.h"
#include "lifetime_pass.h"
#include "peak_sites.h"
#include "retained.h"
#include "ridgescope/analysis.h"
#include "ridgescope/forensics.h"
#include "ridgescope/ledger.h"
#include "ridgescope/report.h"
#include "ridgescope/trace_reader.h"
#include "timeline_columns.h"
#include "window_tracker.h"

namespace ridgescope::detail {

class ReplayPass {
 public:
  // `peak_seq`: the event at which `device` peaks (pass 1), when `has_peak`.
  ReplayPass(const TraceReader& reader, const std::vector<Resolved>& resolved, Device device,
             std::uint64_t peak_seq, bool has_peak, std::uint64_t end_time_ns,
             const AnalysisOptions& options, Report& report);

  void run(TraceReader& reader);
  // The dashboards' samples and the probe, once the trace has ended.
  void finish_dashboards();

  std::vector<OomContext> oom_contexts_;  // one per report.ooms entry, explained after the run

 private:
  std::string phase_name(std::uint32_t id) const;
  StepStats& step_stats();
  PhaseStats& phase_at(std::size_t i);
  void observe_timeline();
  void observe_growth(const Event& e);
  void on_alloc(const Event& e);
  void on_free(const Event& e);
  void on_tag(const Event& e);
  void on_phase_begin(const Event& e);
  void close_phase(std::size_t i, std::uint64_t time_ns, bool complete);
  void on_phase_end(const Event& e);
  void on_step(const Event& e);
  std::uint32_t current_phase_id() const;
  void on_layer_sample(const Event& e);
  void on_external(const Event& e);
  void on_oom(const Event& e);
  // A bounded trace's window (window_tracker.h): the state becomes the checkpoint's.
  void on_checkpoint(const Checkpoint& c);
  void on_checkpoint_block(const CheckpointBlock& c, std::uint64_t seq);
  // The gaps between live blocks inside the reserved segments now.
  FreeSpace current_free_space() const;
  void on_sample(const Event& e);
  // A key recorded again replaces the earlier value (the last one wins), keeping first order.
  void on_metadata(std::string key, std::string_view text);
  // The label of a block no tag named: its category and the module that made it, or the phase
  // when no module was running.
  std::string fallback_label(const LiveBlock& b) const;
  void capture_peak(const Event& e);
  bool id_inferred(std::uint64_t id) const { return id < resolved_.size() && resolved_[id].inferred; }
  // The phases and the step still open end where the events end (a window's end, the trace's).
  void end_open_phases_and_step();
  void finish();
  // The state as of the last event at or before the probe instant.
  void take_probe();
  void sample_dashboards(std::uint64_t now_ns);

  static inline const Resolved kUnknown{};
  const TraceReader& reader_;
  const std::vector<Resolved>& resolved_;
  const Device device_;
  const std::uint64_t peak_seq_;
  const bool has_peak_;
  const AnalysisOptions& options_;
  Report& report_;
  TimelineColumnsBuilder timeline_;
  FrameTable frames_;            // the report's frames (sites, stacks, verdicts)
  RetentionDetector retention_;  // tensors kept across steps
  HostLedgerBuilder host_ledger_;      // the resident set in three layers
  DeviceLedgerBuilder device_ledger_;  // the driver's figure, reconciled
  std::uint64_t now_ns_ = 0;  // time of the last timed event
  Ledger ledger_;
  std::uint64_t next_block_id_ = 0;
  std::uint64_t current_step_ = 0;
  bool step_open_ = false;
  std::uint64_t last_time_ = 0;
  std::vector<std::uint32_t> phase_stack_;
  std::vector<std::pair<std::size_t, std::size_t>> open_phases_;  // (step index, phase index)
  absl::flat_hash_map<std::uint32_t, std::uint32_t> occurrences_;  // per phase name, this step
  absl::flat_hash_map<std::uint64_t, std::uint64_t> alloc_step_;   // live block id -> step
  bool completed_optimizer_step_ = false;
  WindowTracker window_;
  bool applying_ = false;                     // inside the records of an applied checkpoint
  std::vector<std::uint32_t> pending_phases_;  // open at the checkpoint: opened with its step

  // Dashboards: the live bytes a sampler would read every period (15 s and 30 s).
  struct Sampler {
    std::uint64_t period_ns, next_ns, samples = 0, max = 0;
    bool exhausted = false;  // next_ns would pass UINT64_MAX
  };
  std::vector<Sampler> samplers_;
  bool sampling_started_ = false;
};

}  // namespace ridgescope::detail
