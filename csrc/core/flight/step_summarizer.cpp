// step_summarizer.cpp — the summary of every step (step_summarizer.h).
#include "step_summarizer.h"

#include <algorithm>

#include "record_codec.h"

namespace ridgescope::detail {

StepSummarizer::DeviceState& StepSummarizer::device(Device d) {
  const std::uint64_t code = device_code(d);
  if (last_device_.state != nullptr && last_device_.code == code) {
    last_device_.state->active = true;
    return *last_device_.state;
  }
  auto [it, inserted] = devices_.try_emplace(code);
  if (inserted) {
    it->second.device = d;
    it->second.open_peaks.assign(open_names_.size(), 0);
  }
  it->second.active = true;
  // Set after the insertion, which may have moved every entry (the table never erases one).
  last_device_.code = code;
  last_device_.state = &it->second;
  return it->second;
}

void StepSummarizer::begin_step(DeviceState& d) {
  d.start = d.peak = d.live;
  d.peak_by_category = d.live_by_category;
  d.peak_reserved = d.reserved();
  d.peak_epoch = d.epoch++;
  d.allocations = d.ooms = 0;
  d.phases.clear();
  d.active = false;
  for (auto& p : d.open_peaks) p = d.live;
}

void StepSummarizer::merge_phase(std::vector<PhasePeak>& phases, std::uint32_t name_id, std::uint64_t peak) {
  for (PhasePeak& p : phases) {
    if (p.name_id == name_id) {
      p.peak_bytes = std::max(p.peak_bytes, peak);
      return;
    }
  }
  phases.push_back(PhasePeak{name_id, peak});
}

// A block starts being counted: live now, in the category it is seen in.
void StepSummarizer::count(DeviceState& d, BlockLife& b) {
  b.shown = lifetimes_.current_category(b);
  b.epoch = d.epoch;
  d.live += b.bytes;
  d.live_by_category[category_index(b.shown)] += b.bytes;
}

// A block's life ended with category `resolved`; if it was live at the step's peak, the peak
// counts it there.
void StepSummarizer::uncount(DeviceState& d, const BlockLife& b, Category resolved) {
  d.live -= std::min(d.live, b.bytes);
  auto& slot = d.live_by_category[category_index(b.shown)];
  slot -= std::min(slot, b.bytes);
  if (b.epoch <= d.peak_epoch && resolved != b.shown) {
    auto& from = d.peak_by_category[category_index(b.shown)];
    const std::uint64_t moved = std::min(from, b.bytes);
    from -= moved;
    d.peak_by_category[category_index(resolved)] += moved;
  }
}

void StepSummarizer::recategorise(DeviceState& d, BlockLife& b, Category now) {
  if (now == b.shown) return;
  auto move = [&](std::array<std::uint64_t, kCategoryCount>& bytes) {
    auto& from = bytes[category_index(b.shown)];
    const std::uint64_t moved = std::min(from, b.bytes);
    from -= moved;
    bytes[category_index(now)] += moved;
  };
  move(d.live_by_category);
  if (b.epoch <= d.peak_epoch) move(d.peak_by_category);
  b.shown = now;
}

void StepSummarizer::on_event(const Event& e) {
  window_.on_event(e);
  if (e.kind != EventKind::Checkpoint && e.kind != EventKind::CheckpointBlock &&
      e.kind != EventKind::CheckpointSegment && e.kind != EventKind::CheckpointExternal &&
      e.kind != EventKind::String) {
    applying_ = false;
  }
  const auto kind = static_cast<std::uint8_t>(e.kind);
  if (kind < 64 && e.kind != EventKind::String && e.kind != EventKind::Metadata) {
    if (!timed_) {
      timed_ = true;
      step_begin_ns_ = e.time_ns;
    }
    last_time_ns_ = e.time_ns;
  }
  switch (e.kind) {
    case EventKind::String:
      if (e.string_id >= kinds_.size()) {
        if (e.string_id > kinds_.size() + 1'000'000) return;  // as the reader caps its table
        kinds_.resize(e.string_id + 1, PhaseKind::Other);
      }
      kinds_[e.string_id] = parse_phase_kind(e.text);
      break;
    case EventKind::Alloc: on_alloc(e); break;
    case EventKind::Free: on_free(e); break;
    case EventKind::Tag: on_tag(e); break;
    case EventKind::SegmentAlloc: {
      DeviceState& d = device(e.device);
      d.has_segments = true;
      auto [it, inserted] = d.segments.try_emplace(e.addr, e.bytes);
      if (!inserted) {
        d.segment_bytes -= it->second;
        it->second = e.bytes;
      }
      d.segment_bytes += e.bytes;
      d.peak_reserved = std::max(d.peak_reserved, d.reserved());
      break;
    }
    case EventKind::SegmentFree: {
      DeviceState& d = device(e.device);
      auto it = d.segments.find(e.addr);
      if (it != d.segments.end()) {
        d.segment_bytes -= it->second;
        d.segments.erase(it);
      }
      break;
    }
    case EventKind::PhaseBegin: on_phase_begin(e); break;
    case EventKind::PhaseEnd: on_phase_end(e); break;
    case EventKind::Step: on_step(e); break;
    case EventKind::Oom: ++device(e.device).ooms; break;
    case EventKind::Mark:
      if (marks_++ == 0) mark_id_ = e.string_id;
      break;
    case EventKind::CheckpointSegment: on_checkpoint_segment(e); break;
    // Allocations outside PyTorch count in no summary, but a window's checkpoint restates the
    // live ones, so that a window's device ledger holds what the dropped steps allocated.
    case EventKind::ExternalAlloc: externals_[block_key(e.device, e.addr)] = e; break;
    case EventKind::ExternalFree: externals_.erase(block_key(e.device, e.addr)); break;
    case EventKind::CheckpointExternal:
      if (applying_) {
        Event a = e;
        a.kind = EventKind::ExternalAlloc;
        externals_[block_key(e.device, e.addr)] = a;
      }
      break;
    case EventKind::Resolve:
      if (BlockLife* b = lifetimes_.find(e.device, e.addr)) b->final = Resolved{e.category, (e.flags & kTagInferred) != 0, e.string_id};
      break;
    default:
      break;
  }
}

void StepSummarizer::on_alloc(const Event& e) {
  DeviceState& d = device(e.device);
  std::optional<EndedBlock> replaced;
  BlockLife& b = lifetimes_.alloc(e, window_.step(), &replaced);
  if (replaced) {
    uncount(d, replaced->life, replaced->resolved.category);  // the same device
    if (on_ended) on_ended(replaced->life, replaced->resolved);
  }
  ++d.allocations;
  count(d, b);
  if (d.live > d.peak) {
    d.peak = d.live;
    d.peak_by_category = d.live_by_category;
    d.peak_epoch = d.epoch++;
  }
  for (auto& p : d.open_peaks) p = std::max(p, d.live);
}

void StepSummarizer::on_free(const Event& e) {
  std::optional<EndedBlock> ended = lifetimes_.free(e);
  DeviceState& d = device(e.device);
  if (!ended) return;
  uncount(d, ended->life, ended->resolved.category);
  if (on_ended) on_ended(ended->life, ended->resolved);
}

std::optional<Resolved> StepSummarizer::resolution_now(Device device, std::uint64_t addr, std::uint64_t uid) {
  BlockLife* b = lifetimes_.find(device, addr);
  if (b == nullptr || b->uid != uid) return std::nullopt;
  return b->final ? *b->final : lifetimes_.resolve(*b, /*freed=*/false);
}

void StepSummarizer::on_tag(const Event& e) {
  BlockLife* b = lifetimes_.tag(e);
  if (b == nullptr) return;
  recategorise(device(e.device), *b, lifetimes_.current_category(*b));
}

void StepSummarizer::on_phase_begin(const Event& e) {
  const PhaseKind kind = e.string_id < kinds_.size() ? kinds_[e.string_id] : PhaseKind::Other;
  lifetimes_.phase_begin(e.string_id, kind);
  open_names_.push_back(e.string_id);
  for (auto& [code, d] : devices_) d.open_peaks.push_back(d.live);
}

void StepSummarizer::on_phase_end(const Event& e) {
  const std::size_t closed = lifetimes_.phase_end(e.string_id);
  for (std::size_t k = 0; k < closed && !open_names_.empty(); ++k) {
    const std::uint32_t name = open_names_.back();
    open_names_.pop_back();
    for (auto& [code, d] : devices_) {
      if (d.open_peaks.empty()) continue;
      merge_phase(d.phases, name, d.open_peaks.back());
      d.open_peaks.pop_back();
    }
  }
}

StepSummary StepSummarizer::summary_of(const DeviceState& d, std::uint64_t step, std::uint64_t end_ns,
                                       bool complete) const {
  StepSummary s;
  s.step = step;
  s.device = d.device;
  s.flags = complete ? kSummaryComplete : 0;
  s.begin_time_ns = step_begin_ns_;
  s.end_time_ns = std::max(end_ns, step_begin_ns_);
  s.start_bytes = d.start;
  s.end_bytes = d.live;
  s.peak_bytes = d.peak;
  s.peak_reserved_bytes = d.has_segments ? d.peak_reserved : d.peak;  // no segments: reserved is live
  s.allocations = d.allocations;
  s.ooms = d.ooms;
  s.marks = marks_;
  s.mark_id = mark_id_;
  s.peak_by_category = d.peak_by_category;
  s.phases = d.phases;
  for (std::size_t i = 0; i < open_names_.size() && i < d.open_peaks.size(); ++i) {
    merge_phase(s.phases, open_names_[i], d.open_peaks[i]);  // phases still open count so far
  }
  return s;
}

void StepSummarizer::on_step(const Event& e) {
  std::vector<std::uint64_t> codes;
  for (const auto& [code, d] : devices_) codes.push_back(code);
  std::sort(codes.begin(), codes.end());
  for (std::uint64_t code : codes) {
    DeviceState& d = devices_[code];
    if (d.active || d.live > 0) {
      StepSummary s = summary_of(d, e.value, e.time_ns, true);
      // The bytes kept at the step's end grew at every step end for kGrowthSteps steps in a
      // row, after the first two (where optimizer state and caches appear).
      if (d.steps >= 2 && s.end_bytes > d.last_end) {
        if (++d.growth_run >= kGrowthSteps && !d.growth_reported) {
          s.flags |= kSummaryGrowth;
          d.growth_reported = true;
        }
      } else if (d.steps >= 2) {
        d.growth_run = 0;
        d.growth_reported = false;
      }
      d.last_end = s.end_bytes;
      ++d.steps;
      completed_.push_back(std::move(s));
    }
    begin_step(d);
  }
  step_begin_ns_ = e.time_ns;
  marks_ = 0;
  mark_id_ = 0;
}

std::vector<StepSummary> StepSummarizer::open_summaries() const {
  std::vector<std::uint64_t> codes;
  for (const auto& [code, d] : devices_) {
    if (d.active) codes.push_back(code);
  }
  std::sort(codes.begin(), codes.end());
  std::vector<StepSummary> out;
  for (std::uint64_t code : codes) out.push_back(summary_of(devices_.at(code), window_.step(), last_time_ns_, false));
  return out;
}

bool StepSummarizer::on_checkpoint(const Checkpoint& c) {
  if (window_.continues(c)) return false;
  lifetimes_.end_all([](const BlockLife&, const Resolved&) {});
  std::vector<PhaseKind> kinds;
  for (const CheckpointPhase& p : c.phases) {
    kinds.push_back(p.name_id < kinds_.size() ? kinds_[p.name_id] : PhaseKind::Other);
  }
  lifetimes_.begin_window(c, kinds);
  window_.restart(c);
  externals_.clear();
  open_names_.clear();
  for (const CheckpointPhase& p : c.phases) open_names_.push_back(p.name_id);
  for (auto& [code, d] : devices_) {
    d.live = 0;
    d.live_by_category = {};
    d.segments.clear();
    d.segment_bytes = 0;
    d.open_peaks.assign(open_names_.size(), 0);
    d.growth_run = 0;
    d.growth_reported = false;
    d.steps = 0;
    begin_step(d);
  }
  step_begin_ns_ = c.time_ns;
  timed_ = true;
  marks_ = 0;
  mark_id_ = 0;
  applying_ = true;
  return true;
}

void StepSummarizer::on_checkpoint_segment(const Event& e) {
  if (!applying_) return;
  DeviceState& d = device(e.device);
  d.has_segments = true;
  auto [it, inserted] = d.segments.try_emplace(e.addr, e.bytes);
  if (!inserted) d.segment_bytes -= it->second;
  it->second = e.bytes;
  d.segment_bytes += e.bytes;
  d.peak_reserved = d.reserved();
  d.active = false;
}

void StepSummarizer::on_checkpoint_block(const CheckpointBlock& c) {
  if (!applying_) return;
  DeviceState& d = device(c.device);
  BlockLife& b = lifetimes_.add_checkpoint_block(c);
  count(d, b);
  begin_step(d);  // the step starts from the checkpoint's state
}

void StepSummarizer::write_checkpoint(std::uint64_t time_ns, std::string& out) const {
  encode_checkpoint(lifetimes_.checkpoint(window_.step(), time_ns), out);
  std::vector<std::uint64_t> codes;
  for (const auto& [code, d] : devices_) codes.push_back(code);
  std::sort(codes.begin(), codes.end());
  std::vector<std::pair<std::uint64_t, std::uint64_t>> segments;
  for (std::uint64_t code : codes) {
    const DeviceState& d = devices_.at(code);
    segments.assign(d.segments.begin(), d.segments.end());
    std::sort(segments.begin(), segments.end());
    for (const auto& [addr, bytes] : segments) encode_checkpoint_segment(d.device, addr, bytes, out);
  }
  std::vector<const Event*> externals;
  externals.reserve(externals_.size());
  for (const auto& [key, e] : externals_) externals.push_back(&e);
  std::sort(externals.begin(), externals.end(), [](const Event* a, const Event* b) { return a->seq < b->seq; });
  for (const Event* e : externals) encode_checkpoint_external(*e, out);
  // In order of allocation: a window's analysis then orders its blocks as the whole trace would.
  std::vector<const BlockLife*> blocks;
  blocks.reserve(lifetimes_.live_blocks());
  lifetimes_.for_each_live([&](const BlockLife& b) { blocks.push_back(&b); });
  std::sort(blocks.begin(), blocks.end(), [](const BlockLife* a, const BlockLife* b) { return a->uid < b->uid; });
  for (const BlockLife* b : blocks) encode_checkpoint_block(lifetimes_.checkpoint_block(*b), out);
}

std::vector<StepSummarizer::DeviceView> StepSummarizer::devices() const {
  std::vector<DeviceView> out;
  for (const auto& [code, d] : devices_) out.push_back(DeviceView{d.device, d.live, d.reserved(), d.live_by_category});
  std::sort(out.begin(), out.end(), [](const DeviceView& a, const DeviceView& b) {
    return device_code(a.device) < device_code(b.device);
  });
  return out;
}

}  // namespace ridgescope::detail
