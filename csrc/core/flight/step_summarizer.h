// step_summarizer.h — the summary of every step of a stream of events (ridgescope/
// flight_records.h, StepSummary): for each device, its duration, start, end and peak live bytes,
// the peak's composition by category, the highest reserved bytes, each phase's peak, the
// allocations, OOMs and marks, and whether the bytes kept at step ends have grown for several
// steps (retained tensors). Computed from the events alone, in one pass and in memory bounded by
// what is live: the flight writer runs it on the recording side (flight_sink.cpp) and writes a
// summary record per step; the analysis runs the same code over a trace that has none (written
// before format 4), so both give the same summaries for the same events; the live view reads
// its current state.
//
// Categories are those of block_lifetimes.h: a block is counted in the category it has now (its
// tags, or where it was made), and a block live at a step's peak and freed before the step ends
// in the category its lifetime decided (a temporary, an activation).
//
// Internal to the core. Thread-safety: none; one instance per stream.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "block_lifetimes.h"
#include "ridgescope/flight_records.h"
#include "window_tracker.h"

namespace ridgescope::detail {

class StepSummarizer {
 public:
  // Steps after the first two whose end bytes grew, in a row, before a summary says kSummaryGrowth.
  static constexpr std::uint32_t kGrowthSteps = 5;

  // Every event of the stream, in order. `text` of String events defines phase kinds. The
  // payloads of Checkpoint and CheckpointBlock events (TraceReader::checkpoint() ...) come in
  // on_checkpoint and on_checkpoint_block, right after on_event.
  void on_event(const Event& e);
  // A checkpoint record: skipped when it continues the state (window_tracker.h), else the state
  // becomes the checkpoint's (its segments and blocks follow). Returns whether it was applied.
  bool on_checkpoint(const Checkpoint& c);
  void on_checkpoint_block(const CheckpointBlock& b);
  // Whether the last checkpoint was applied and its records are still coming.
  bool applying() const { return applying_; }

  // Called with every block whose life ends (freed, or a missed free), and its category.
  std::function<void(const BlockLife&, const Resolved&)> on_ended;
  // The category a live block would have if its life ended now (not freed).
  std::optional<Resolved> resolution_now(Device device, std::uint64_t addr, std::uint64_t uid);

  // The summaries a step record completed, in device order; the caller takes them.
  std::vector<StepSummary>& completed() { return completed_; }
  // The summaries of the step still open (not kSummaryComplete), for devices with activity in it.
  std::vector<StepSummary> open_summaries() const;

  // The state as a checkpoint (its record, each device's segments, each live block in order of
  // allocation), appended as records to `out`. `time_ns`: the instant it describes.
  void write_checkpoint(std::uint64_t time_ns, std::string& out) const;

  // The live view.
  std::uint64_t current_step() const { return window_.step(); }
  std::vector<std::uint32_t> open_phases() const { return lifetimes_.open_phases(); }
  struct DeviceView {
    Device device;
    std::uint64_t live_bytes = 0, reserved_bytes = 0;
    std::array<std::uint64_t, kCategoryCount> by_category{};
  };
  std::vector<DeviceView> devices() const;
  std::uint64_t step_begin_ns() const { return step_begin_ns_; }
  std::uint64_t last_time_ns() const { return last_time_ns_; }
  std::size_t live_blocks() const { return lifetimes_.live_blocks(); }
  template <class Fn>
  void for_each_live(Fn&& fn) const {
    lifetimes_.for_each_live(fn);
  }

 private:
  struct DeviceState {
    Device device;
    std::uint64_t live = 0;
    std::array<std::uint64_t, kCategoryCount> live_by_category{};
    absl::flat_hash_map<std::uint64_t, std::uint64_t> segments;
    std::uint64_t segment_bytes = 0;
    bool has_segments = false;
    bool active = false;  // had an event in this step
    // The step so far.
    std::uint64_t start = 0, peak = 0, peak_reserved = 0, allocations = 0, ooms = 0;
    std::array<std::uint64_t, kCategoryCount> peak_by_category{};
    std::uint64_t epoch = 0, peak_epoch = 0;  // blocks allocated at epoch <= peak_epoch were live at the peak
    std::vector<std::uint64_t> open_peaks;    // per open phase, aligned with open_names_
    std::vector<PhasePeak> phases;
    // Growth of the bytes kept at step ends.
    std::uint64_t steps = 0, last_end = 0;
    std::uint32_t growth_run = 0;
    bool growth_reported = false;

    std::uint64_t reserved() const { return has_segments ? segment_bytes : live; }
  };

  DeviceState& device(Device d);
  void begin_step(DeviceState& d);
  StepSummary summary_of(const DeviceState& d, std::uint64_t step, std::uint64_t end_ns, bool complete) const;
  static void merge_phase(std::vector<PhasePeak>& phases, std::uint32_t name_id, std::uint64_t peak);
  void count(DeviceState& d, BlockLife& b);
  void uncount(DeviceState& d, const BlockLife& b, Category resolved);
  void recategorise(DeviceState& d, BlockLife& b, Category now);
  void on_alloc(const Event& e);
  void on_free(const Event& e);
  void on_tag(const Event& e);
  void on_phase_begin(const Event& e);
  void on_phase_end(const Event& e);
  void on_step(const Event& e);
  void on_checkpoint_segment(const Event& e);

  BlockLifetimes lifetimes_;
  WindowTracker window_;
  absl::flat_hash_map<std::uint64_t, DeviceState> devices_;  // by device_code
  // The device of the last lookup (nearly every event is on the same one). A copy or move of the
  // summarizer starts without it: the pointer is into this object's table.
  struct LastDevice {
    std::uint64_t code = 0;
    DeviceState* state = nullptr;
    LastDevice() = default;
    LastDevice(const LastDevice&) noexcept {}
    LastDevice& operator=(const LastDevice&) noexcept {
      state = nullptr;
      return *this;
    }
  } last_device_;
  std::vector<std::uint32_t> open_names_;   // the open phases, aligned with the lifetimes' stack
  std::vector<PhaseKind> kinds_;            // by string id: the phase kind its text names
  std::vector<StepSummary> completed_;
  absl::flat_hash_map<std::uint64_t, Event> externals_;  // live external_alloc events, by block_key
  std::uint64_t step_begin_ns_ = 0, last_time_ns_ = 0;
  bool timed_ = false;  // a timed event was seen (step_begin_ns_ is set)
  std::uint64_t marks_ = 0;
  std::uint32_t mark_id_ = 0;
  bool applying_ = false;  // inside the records of an applied checkpoint
};

}  // namespace ridgescope::detail
