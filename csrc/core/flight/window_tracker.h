// window_tracker.h — where a stream of events stands with respect to steps and kept windows:
// the step it is in, and whether a Checkpoint record continues the state the stream has built
// (the flight writer puts one at the start of every step it may keep; when the step before was
// kept too, the checkpoint repeats what the reader already knows) or starts a new window after a
// gap (the state is replaced by the checkpoint's). Every consumer of a flight trace decides this
// the same way: the analysis's passes, the step summarizer, the live view.
//
// Internal to the core. Thread-safety: none; one instance per stream.
#pragma once

#include <cstdint>

#include "ridgescope/event.h"
#include "ridgescope/flight_records.h"

namespace ridgescope::detail {

class WindowTracker {
 public:
  // Every event of the stream, in order (checkpoint records included).
  void on_event(const Event& e) noexcept {
    switch (e.kind) {
      case EventKind::Step:
        step_ = e.value + 1;
        at_step_start_ = true;
        seen_step_ = true;
        break;
      case EventKind::Alloc: case EventKind::Free: case EventKind::SegmentAlloc:
      case EventKind::SegmentFree: case EventKind::Tag: case EventKind::PhaseBegin:
      case EventKind::PhaseEnd: case EventKind::Oom: case EventKind::Sample: case EventKind::Mark:
        at_step_start_ = false;
        any_event_ = true;
        break;
      default:
        break;  // untimed records, summaries, and the checkpoint records themselves
    }
  }
  // Whether checkpoint `c` continues the state built so far (nothing happened since the step
  // before c.step ended, or nothing at all yet), so its records are to be skipped.
  bool continues(const Checkpoint& c) const noexcept {
    if (!any_event_ && !seen_step_) return false;  // the first window: its state is the checkpoint's
    return at_step_start_ && c.step == step_;
  }
  // A checkpoint was applied: the stream is at the start of its step.
  void restart(const Checkpoint& c) noexcept {
    step_ = c.step;
    at_step_start_ = true;
    seen_step_ = true;
  }
  std::uint64_t step() const noexcept { return step_; }

 private:
  std::uint64_t step_ = 0;
  bool at_step_start_ = true;
  bool seen_step_ = false;
  bool any_event_ = false;
};

}  // namespace ridgescope::detail
