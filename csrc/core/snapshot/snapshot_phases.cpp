// snapshot_phases.cpp — the phases and steps of a snapshot's replay (see snapshot_phases.h).
#include "snapshot_phases.h"

#include "snapshot_emitter.h"
#include "snapshot_frames.h"

namespace ridgescope::detail {

void SnapshotPhases::emit_marks_through(SnapshotEmitter& out, std::uint64_t index) {
  while (next_mark_ < doc_.marks.size() && doc_.marks[next_mark_].trace_index <= index) {
    const PhaseMark& m = doc_.marks[next_mark_++];
    const std::uint64_t t = out.time_ns(m.time_us);
    if (m.step) {
      out.step(m.step_value, t);
    } else {
      out.phase(m.begin, m.name, t);
    }
  }
}

void SnapshotPhases::emit_torch_marks_before(SnapshotEmitter& out, std::uint64_t time_us) {
  while (next_torch_mark_ < doc_.torch_marks.size()) {
    const PhaseMark& m = doc_.torch_marks[next_torch_mark_];
    if (m.begin ? m.time_us > time_us : m.time_us >= time_us) break;
    ++next_torch_mark_;
    const std::uint64_t t = out.time_ns(m.time_us);
    if (m.begin) {
      if (!annotated_phase_.empty()) continue;  // nested annotations: the outer one stands
      close_inferred(out, t);
      begin_step_phase(out, parse_phase_kind(m.name), t);
      annotated_phase_ = m.name;
      out.phase(true, m.name, t);
      ++annotated_phases_;
    } else if (m.name == annotated_phase_) {
      out.phase(false, m.name, t);
      annotated_phase_.clear();
    }
  }
}

void SnapshotPhases::close_inferred(SnapshotEmitter& out, std::uint64_t t_ns) {
  if (recompute_open_) out.phase(false, builtin_phase_name(PhaseKind::Recompute), t_ns);
  recompute_open_ = false;
  if (!current_phase_.empty()) out.phase(false, current_phase_, t_ns);
  current_phase_.clear();
}

void SnapshotPhases::infer_phase(SnapshotEmitter& out, const SnapshotEntry& e, std::uint64_t t_ns) {
  if (!annotated_phase_.empty()) return;  // inside a phase torch's annotations mark exactly
  auto [cached, inserted] = phases_.try_emplace(e.frames);
  if (inserted) cached->second = FramesPhase{phase_from_frames(*e.frames), from_main_thread(*e.frames)};
  const PhaseKind kind = cached->second.kind;
  const std::string_view recompute = builtin_phase_name(PhaseKind::Recompute);
  if (kind == PhaseKind::Other) {
    if (cached->second.main_thread) {
      close_inferred(out, t_ns);  // the user's own code between phases: the batch, the loss
    } else if (recompute_open_ && e.frames->empty()) {
      // No frames at all inside a recomputation: autograd's thread running C++ nodes again (a
      // snapshot recorded with Python stacks only), so the backward goes on.
      out.phase(false, recompute, t_ns);
      recompute_open_ = false;
    }
    return;
  }
  const std::string_view p = builtin_phase_name(kind);
  if (current_phase_ == builtin_phase_name(PhaseKind::Backward) && (kind == PhaseKind::Recompute || kind == PhaseKind::Backward)) {
    // A recomputation runs inside the backward, which stays open around it.
    if (kind == PhaseKind::Recompute && !recompute_open_) out.phase(true, recompute, t_ns);
    if (kind == PhaseKind::Backward && recompute_open_) out.phase(false, recompute, t_ns);
    recompute_open_ = kind == PhaseKind::Recompute;
    inferred_phases_ = true;
    return;
  }
  if (p == current_phase_) return;
  close_inferred(out, t_ns);
  begin_step_phase(out, kind, t_ns);
  current_phase_ = std::string(p);
  out.phase(true, current_phase_, t_ns);
  inferred_phases_ = true;
}

void SnapshotPhases::infer_phase_at_free(SnapshotEmitter& out, const SnapshotEntry& e,
                                         const SnapshotFrames* alloc_frames, std::uint64_t t_ns) {
  if (!annotated_phase_.empty() || current_phase_.empty() || e.frames->empty() || e.frames == alloc_frames) return;
  auto [cached, inserted] = phases_.try_emplace(e.frames);
  if (inserted) cached->second = FramesPhase{phase_from_frames(*e.frames), from_main_thread(*e.frames)};
  if (cached->second.kind == PhaseKind::Other && cached->second.main_thread) close_inferred(out, t_ns);
}

void SnapshotPhases::begin_step_phase(SnapshotEmitter& out, PhaseKind kind, std::uint64_t t_ns) {
  if (kind == PhaseKind::Forward && step_has_backward_or_optimizer_) {
    out.step(inferred_step_++, t_ns);
    step_has_backward_or_optimizer_ = false;
  }
  if (kind == PhaseKind::Backward || kind == PhaseKind::OptimizerStep) step_has_backward_or_optimizer_ = true;
}

void SnapshotPhases::finish(SnapshotEmitter& out, std::uint64_t t_ns) {
  emit_marks_through(out, UINT64_MAX);
  if (!doc_.ours) emit_torch_marks_before(out, UINT64_MAX);
  if (!annotated_phase_.empty()) out.phase(false, annotated_phase_, t_ns);
  close_inferred(out, t_ns);
}

}  // namespace ridgescope::detail
