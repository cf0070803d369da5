// lifetime_pass.h — pass 1 of the analysis (analysis.cpp, see ridgescope/analysis.h): one
// streaming read of the trace that follows every block's lifetime through the phases and tags
// (block_lifetimes.h, the rules of docs/categories.md), decides the category it has for its
// whole life, finds the peak of every device and gathers the per-step summaries: the trace's
// own (format 4), or, for a trace without them, those the step summarizer computes from its
// events, the same code the flight recorder runs. A bounded trace's windows each start from a
// checkpoint (window_tracker.h); a Resolve record at a window's end gives a block's final
// category. Internal to the analysis layer.
//
// Thread-safety: none; one pass per analysis.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "block_lifetimes.h"
#include "ridgescope/category.h"
#include "ridgescope/event.h"
#include "ridgescope/flight_records.h"
#include "ridgescope/phase.h"
#include "ridgescope/trace_reader.h"
#include "step_summarizer.h"
#include "window_tracker.h"

namespace ridgescope::detail {

class LifetimePass {
 public:
  struct DevicePeak {
    std::uint64_t live = 0, peak = 0, peak_seq = 0;
    bool seen = false;
  };

  void run(TraceReader& reader);

  const std::vector<Resolved>& resolved() const { return resolved_; }
  const absl::flat_hash_map<std::uint64_t, DevicePeak>& peaks() const { return peaks_; }
  std::uint64_t events() const { return events_; }
  std::uint64_t last_time() const { return last_time_; }
  // Every step's summaries, per device, in file order; whether the trace wrote them (else they
  // were computed here); the checkpoints that started a window.
  std::vector<StepSummary>& summaries() { return summaries_; }
  bool summaries_recorded() const { return summaries_recorded_; }
  std::uint64_t windows_started() const { return windows_; }

 private:
  void on_alloc(const Event& e);
  void on_free(const Event& e);
  void on_checkpoint(const TraceReader& reader);
  void on_checkpoint_block(const TraceReader& reader);
  void end(const BlockLife& b, const Resolved& r) { resolved_[b.uid] = r; }

  BlockLifetimes lifetimes_;
  WindowTracker window_;
  StepSummarizer summarizer_;  // for traces without summary records
  absl::flat_hash_map<std::uint64_t, DevicePeak> peaks_;
  std::vector<Resolved> resolved_;
  std::vector<StepSummary> summaries_;
  bool summaries_recorded_ = false;
  bool applying_ = false;  // inside the records of an applied checkpoint
  std::uint64_t windows_ = 0;
  std::uint64_t events_ = 0;
  std::uint64_t last_time_ = 0;
};

}  // namespace ridgescope::detail
