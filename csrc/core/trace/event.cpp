// The names of event kinds (ridgescope/event.h).
#include "ridgescope/event.h"

namespace ridgescope {

std::string_view event_kind_name(EventKind kind) noexcept {
  switch (kind) {
    case EventKind::Alloc: return "alloc";
    case EventKind::Free: return "free";
    case EventKind::SegmentAlloc: return "segment_alloc";
    case EventKind::SegmentFree: return "segment_free";
    case EventKind::Tag: return "tag";
    case EventKind::PhaseBegin: return "phase_begin";
    case EventKind::PhaseEnd: return "phase_end";
    case EventKind::Step: return "step";
    case EventKind::Oom: return "oom";
    case EventKind::Sample: return "sample";
    case EventKind::String: return "string";
    case EventKind::Metadata: return "metadata";
    case EventKind::ExternalAlloc: return "external_alloc";
    case EventKind::ExternalFree: return "external_free";
    case EventKind::Frame: return "frame";
    case EventKind::Stack: return "stack";
    case EventKind::Mark: return "mark";
    case EventKind::TimeBase: return "time_base";
    case EventKind::StepSummary: return "step_summary";
    case EventKind::Checkpoint: return "checkpoint";
    case EventKind::CheckpointSegment: return "checkpoint_segment";
    case EventKind::CheckpointBlock: return "checkpoint_block";
    case EventKind::Resolve: return "resolve";
    case EventKind::CheckpointExternal: return "checkpoint_external";
  }
  return "unknown_kind";
}

}  // namespace ridgescope
