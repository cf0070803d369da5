// snapshot_sink.cpp — the snapshot reader's events, straight to the trace or through the
// inference (see snapshot_sink.h).
#include "snapshot_sink.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace ridgescope::detail {
namespace {

bool is_frame_rule(InferenceRule r) {
  using R = InferenceRule;
  return r == R::UserRule || r == R::WorkspaceFrames || r == R::OptimizerInitGroup || r == R::AccumulateGrad ||
         r == R::ParameterFrames || r == R::DataLoader;
}

}  // namespace

SnapshotSink::SnapshotSink(Recorder& rec, std::unique_ptr<SnapshotInference> inference)
    : rec_(rec), inference_(std::move(inference)) {}

void SnapshotSink::record(const Event& e, const SnapshotFrames* frames, bool after_trace) {
  switch (e.kind) {
    case EventKind::Alloc:
      live_ += e.bytes;
      peak_ = std::max(peak_, live_);
      break;
    case EventKind::Free: live_ -= std::min(live_, e.bytes); break;
    case EventKind::SegmentAlloc: segments_[e.addr] = e.bytes; break;
    case EventKind::SegmentFree: segments_.erase(e.addr); break;
    default: break;
  }
  if (!inference_) {
    rec_.record_timed(e);
    return;
  }
  if (e.kind == EventKind::Free) inference_->free(e.addr, frames, after_trace);
  buffer_.push_back(e);
  block_of_event_.push_back(kNoBlock);
}

void SnapshotSink::alloc(const Event& e, std::string_view where) {
  if (inference_ && e.string_id != 0 && !where_.contains(e.string_id)) where_[e.string_id] = std::string(where);
  last_alloc_ = buffer_.size();
  record(e);
}

void SnapshotSink::block(const SnapshotFrames* frames, bool before_trace, std::optional<Category> recorded) {
  if (!inference_ || last_alloc_ >= buffer_.size()) return;
  const Event& e = buffer_[last_alloc_];
  block_of_event_[last_alloc_] = inference_->alloc(e.addr, e.bytes, e.requested_bytes, frames, before_trace, recorded);
}

void SnapshotSink::phase(const Event& e, bool begin, std::string_view name) {
  if (inference_) {
    if (begin) {
      inference_->phase_begin(name);
    } else {
      inference_->phase_end(name);
    }
  }
  record(e);
}

void SnapshotSink::flush() {
  if (!inference_) return;
  inference_->finish();
  absl::flat_hash_map<std::tuple<Category, InferenceRule, std::uint32_t>, std::uint32_t> labels;
  for (std::size_t i = 0; i < buffer_.size(); ++i) {
    const Event& e = buffer_[i];
    rec_.record_timed(e);
    if (block_of_event_[i] == kNoBlock) continue;
    const InferenceDecision d = inference_->decision(block_of_event_[i]);
    Event tag;
    tag.kind = EventKind::Tag;
    tag.time_ns = e.time_ns;
    tag.device = e.device;
    tag.addr = e.addr;
    tag.category = d.category;
    const bool observed = d.rule == InferenceRule::Recorded || d.rule == InferenceRule::Unknown;
    tag.flags = observed ? 0 : kTagInferred;
    auto [it, inserted] = labels.try_emplace(std::make_tuple(d.category, d.rule, e.string_id), 0);
    if (inserted) {
      std::string text(category_name(d.category));
      if (auto w = where_.find(e.string_id); w != where_.end()) text += " in " + w->second;
      if (d.rule != InferenceRule::Unknown) text += " [" + std::string(inference_rule_id(d.rule)) + "]";
      it->second = rec_.intern(text);
    }
    tag.string_id = it->second;
    rec_.record_timed(tag);
    if (d.rule == InferenceRule::Recorded) ++by_snapshot_;
    if (is_frame_rule(d.rule)) ++by_frames_;
  }
  buffer_ = {};
  block_of_event_ = {};
}

std::vector<SnapshotReason> SnapshotSink::reasons() const {
  std::vector<SnapshotReason> out;
  if (!inference_) return out;
  for (const InferenceReason& r : inference_->reasons()) {
    out.push_back({std::string(inference_rule_id(r.rule)), r.category, r.text,
                   std::string(inference_evidence_id(r.evidence)), r.allocations, r.peak_bytes, r.peak_blocks,
                   r.end_bytes});
  }
  return out;
}

}  // namespace ridgescope::detail
