// lifetime_pass.cpp — pass 1 of the analysis: lifetimes, tags, the peak of every device and
// the per-step summaries (see lifetime_pass.h).
#include "lifetime_pass.h"

namespace ridgescope::detail {

void LifetimePass::run(TraceReader& reader) {
  Event e;
  while (reader.next(e)) {
    last_time_ = e.time_ns;
    window_.on_event(e);
    if (!summaries_recorded_) {
      if (e.kind == EventKind::StepSummary) {
        summaries_recorded_ = true;  // the trace's own summaries replace the computed ones
        summaries_.clear();
      } else {
        summarizer_.on_event(e);
        for (StepSummary& s : summarizer_.completed()) summaries_.push_back(std::move(s));
        summarizer_.completed().clear();
      }
    }
    if (e.kind != EventKind::CheckpointBlock && e.kind != EventKind::CheckpointSegment &&
        e.kind != EventKind::CheckpointExternal && e.kind != EventKind::String) {
      applying_ = applying_ && e.kind == EventKind::Checkpoint;
    }
    switch (e.kind) {
      case EventKind::Alloc: on_alloc(e); break;
      case EventKind::Free: on_free(e); break;
      case EventKind::Tag: lifetimes_.tag(e); break;
      case EventKind::PhaseBegin:
        lifetimes_.phase_begin(e.string_id, parse_phase_kind(reader.string(e.string_id)));
        break;
      case EventKind::PhaseEnd: lifetimes_.phase_end(e.string_id); break;
      case EventKind::StepSummary: summaries_.push_back(reader.summary()); break;
      case EventKind::Checkpoint: on_checkpoint(reader); break;
      case EventKind::CheckpointBlock: on_checkpoint_block(reader); break;
      case EventKind::Resolve:
        if (BlockLife* b = lifetimes_.find(e.device, e.addr)) {
          b->final = Resolved{e.category, (e.flags & kTagInferred) != 0, e.string_id};
        }
        break;
      default: break;
    }
    ++events_;
  }
  if (!summaries_recorded_) {
    for (StepSummary& s : summarizer_.open_summaries()) summaries_.push_back(std::move(s));
  }
  lifetimes_.end_all([this](const BlockLife& b, const Resolved& r) { end(b, r); });
}

void LifetimePass::on_alloc(const Event& e) {
  std::optional<EndedBlock> replaced;
  BlockLife& b = lifetimes_.alloc(e, window_.step(), &replaced);
  resolved_.emplace_back();
  auto& peak = peaks_[device_code(e.device)];
  if (replaced) {  // a missed free: the old block ends here
    peak.live -= replaced->life.bytes;
    end(replaced->life, replaced->resolved);
  }
  peak.seen = true;
  peak.live += b.bytes;
  if (peak.live > peak.peak) {
    peak.peak = peak.live;
    peak.peak_seq = e.seq;
  }
}

void LifetimePass::on_free(const Event& e) {
  std::optional<EndedBlock> ended = lifetimes_.free(e);
  if (!ended) return;
  peaks_[device_code(e.device)].live -= ended->life.bytes;
  end(ended->life, ended->resolved);
}

void LifetimePass::on_checkpoint(const TraceReader& reader) {
  const Checkpoint& c = reader.checkpoint();
  if (window_.continues(c)) {  // the state it describes is the one built so far
    applying_ = false;
    return;
  }
  // The window before ends here: its live blocks' lives end (as at the end of a trace).
  lifetimes_.end_all([this](const BlockLife& b, const Resolved& r) { end(b, r); });
  std::vector<PhaseKind> kinds;
  for (const CheckpointPhase& p : c.phases) kinds.push_back(parse_phase_kind(reader.string(p.name_id)));
  lifetimes_.begin_window(c, kinds);
  window_.restart(c);
  for (auto& [code, peak] : peaks_) peak.live = 0;
  applying_ = true;
  ++windows_;
}

void LifetimePass::on_checkpoint_block(const TraceReader& reader) {
  if (!applying_) return;
  const CheckpointBlock& c = reader.checkpoint_block();
  lifetimes_.add_checkpoint_block(c);
  resolved_.emplace_back();
  auto& peak = peaks_[device_code(c.device)];
  peak.seen = true;
  peak.live += c.bytes;  // the peak itself is always at an allocation (a kept step's)
}

}  // namespace ridgescope::detail
