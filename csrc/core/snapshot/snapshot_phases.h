// snapshot_phases.h — the phases and steps of a snapshot's replay (internal to the snapshot
// layer): a ridgescope export's annotations, placed by trace index; for a snapshot PyTorch
// wrote, its record_function annotations (the optimizer's step and zero_grad, record_functions
// named like a phase: exact) placed by time, and otherwise phases inferred from each
// allocation's frames (a phase per run of allocations whose frames name the same phase; a
// checkpoint's recomputation nested inside the backward; the user's main-thread code, in an
// allocation's stack or a free's own, ending the phase; a new step when a forward follows a
// backward or an optimizer step). The SnapshotEmitter calls it as the entries go by and
// receives the phase and step events.
//
// Thread-safety: none; one per replay.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ridgescope/phase.h"
#include "snapshot_document.h"
#include "snapshot_entries.h"

namespace ridgescope::detail {

class SnapshotEmitter;

class SnapshotPhases {
 public:
  explicit SnapshotPhases(const SnapshotDocument& doc) : doc_(doc) {}

  // A ridgescope export's marks due at the entry `index` (those before it and at it).
  void emit_marks_through(SnapshotEmitter& out, std::uint64_t index);
  // PyTorch's annotations due before an entry at `time_us`: a START at or before it, an END
  // before it.
  void emit_torch_marks_before(SnapshotEmitter& out, std::uint64_t time_us);
  // PyTorch's snapshots: the phase the allocation `e` (at t_ns) shows by its frames, unless an
  // annotation marks the phase exactly.
  void infer_phase(SnapshotEmitter& out, const SnapshotEntry& e, std::uint64_t t_ns);
  // PyTorch's snapshots: a free `e` (at t_ns) of a block allocated with `alloc_frames`. When torch
  // recorded the free's own stack (context="all": other frames than the allocation's) and it is
  // the user's main-thread code outside any phase (a `del`, the next line of the loop), the phase
  // inferred from frames has ended before the free.
  void infer_phase_at_free(SnapshotEmitter& out, const SnapshotEntry& e, const SnapshotFrames* alloc_frames,
                           std::uint64_t t_ns);
  // After the last entry: the marks left, and the phases still open closed at t_ns.
  void finish(SnapshotEmitter& out, std::uint64_t t_ns);

  std::uint64_t annotated_phases() const { return annotated_phases_; }  // from torch's annotations
  bool inferred_phases() const { return inferred_phases_; }              // some from frames

 private:
  // A phase of `kind` begins at t_ns: a forward after a backward or an optimizer step begins a
  // new step (the step is counted before the phase begins).
  void begin_step_phase(SnapshotEmitter& out, PhaseKind kind, std::uint64_t t_ns);
  // Ends the phases inferred from frames (a recomputation inside a backward, then the backward).
  void close_inferred(SnapshotEmitter& out, std::uint64_t t_ns);

  struct FramesPhase {
    PhaseKind kind = PhaseKind::Other;  // phase_from_frames
    bool main_thread = false;           // from_main_thread
  };

  const SnapshotDocument& doc_;
  std::size_t next_mark_ = 0;
  std::size_t next_torch_mark_ = 0;
  std::string current_phase_;    // inferred from frames
  bool recompute_open_ = false;  // a recomputation inferred inside current_phase_ (a backward)
  std::string annotated_phase_;  // marked by torch's annotations
  std::uint64_t annotated_phases_ = 0;
  bool step_has_backward_or_optimizer_ = false;
  std::uint64_t inferred_step_ = 0;
  bool inferred_phases_ = false;
  absl::flat_hash_map<const SnapshotFrames*, FramesPhase> phases_;  // per frames list
};

}  // namespace ridgescope::detail
