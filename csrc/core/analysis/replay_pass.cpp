// replay_pass.cpp — pass 2 of the analysis: one device replayed with resolved categories, and
// the report gathered (see replay_pass.h).
#include "replay_pass.h"

#include <algorithm>
#include <tuple>

namespace ridgescope::detail {

namespace {

constexpr std::string_view kAllocatorLiveSample = "allocator_live_bytes";
// The allocator's reserved bytes (CUDA: torch.cuda.memory_reserved()), checked against the
// ledger's reserved bytes in the same consistency counters.
constexpr std::string_view kAllocatorReservedSample = "allocator_reserved_bytes";

}  // namespace

ReplayPass::ReplayPass(const TraceReader& reader, const std::vector<Resolved>& resolved, Device device,
                       std::uint64_t peak_seq, bool has_peak, std::uint64_t end_time_ns,
                       const AnalysisOptions& options, Report& report)
    : reader_(reader), resolved_(resolved), device_(device), peak_seq_(peak_seq),
      has_peak_(has_peak), options_(options), report_(report),
      timeline_(report.timeline, end_time_ns, options.timeline_columns),
      frames_(reader, report.frames), device_ledger_(reader, device) {
}

void ReplayPass::run(TraceReader& reader) {
  Event e;
  while (reader.next(e)) {
    const bool timed = e.kind != EventKind::String && e.kind != EventKind::Metadata &&
                       static_cast<std::uint8_t>(e.kind) < 64;
    if (timed) {
      sample_dashboards(e.time_ns);
      now_ns_ = e.time_ns;
    }
    window_.on_event(e);
    if (e.kind != EventKind::CheckpointBlock && e.kind != EventKind::CheckpointSegment &&
        e.kind != EventKind::CheckpointExternal && e.kind != EventKind::Checkpoint &&
        e.kind != EventKind::String) {
      if (applying_) device_ledger_.end_restating(current_step_);
      applying_ = false;
    }
    switch (e.kind) {
      case EventKind::Alloc: on_alloc(e); break;
      case EventKind::Free:
        if (e.device == device_) on_free(e);
        break;
      case EventKind::Tag:
        if (e.device == device_) on_tag(e);
        break;
      case EventKind::SegmentAlloc:
        if (e.device == device_) {
          ledger_.on_segment_alloc(e.addr, e.bytes);
          device_ledger_.on_segment(true, e.addr, e.bytes);
          observe_timeline();
        }
        break;
      case EventKind::SegmentFree:
        if (e.device == device_) {
          ledger_.on_segment_free(e.addr);
          device_ledger_.on_segment(false, e.addr, e.bytes);
          observe_timeline();
        }
        break;
      case EventKind::ExternalAlloc:
      case EventKind::ExternalFree:
        if (e.device == device_) on_external(e);
        break;
      case EventKind::PhaseBegin: on_phase_begin(e); break;
      case EventKind::PhaseEnd: on_phase_end(e); break;
      case EventKind::Step: on_step(e); break;
      case EventKind::Oom:
        if (e.device == device_) on_oom(e);
        break;
      case EventKind::Sample:
        on_layer_sample(e);
        if (e.device == device_) on_sample(e);
        break;
      case EventKind::Metadata:
        device_ledger_.on_metadata(reader.string(e.string_id), e.text);
        on_metadata(std::string(reader.string(e.string_id)), e.text);
        break;
      case EventKind::Checkpoint: on_checkpoint(reader.checkpoint()); break;
      case EventKind::CheckpointSegment:
        if (applying_ && e.device == device_) ledger_.on_segment_alloc(e.addr, e.bytes);
        break;
      case EventKind::CheckpointBlock:
        if (applying_) on_checkpoint_block(reader.checkpoint_block(), e.seq);
        break;
      case EventKind::CheckpointExternal:
        if (applying_ && e.device == device_) {
          device_ledger_.restate(e, frames_.site_text(frames_.site_of_stack(e.stack_id)), current_step_,
                                 current_phase_id());
        }
        break;
      default: break;  // strings, frames and stacks are absorbed into the reader's tables; marks,
                       // summaries and resolutions are pass 1's
    }
    if (timed) last_time_ = e.time_ns;
  }
  finish();
}

std::string ReplayPass::phase_name(std::uint32_t id) const {
  const auto s = reader_.string(id);
  return s.empty() ? std::string("idle") : std::string(s);
}

StepStats& ReplayPass::step_stats() {
  if (!step_open_) {
    step_open_ = true;
    StepStats s;
    s.step = current_step_;
    s.begin_time_ns = s.end_time_ns = now_ns_;
    s.start_bytes = s.peak_bytes = ledger_.live_bytes();
    s.peak_by_category = ledger_.by_category();
    report_.steps.push_back(std::move(s));
    // The phases open at a window's checkpoint go on in its first step.
    std::vector<std::uint32_t> pending;
    pending.swap(pending_phases_);
    for (std::uint32_t name : pending) {
      Event begin;
      begin.kind = EventKind::PhaseBegin;
      begin.string_id = name;
      begin.time_ns = now_ns_;
      on_phase_begin(begin);
    }
  }
  return report_.steps.back();
}

PhaseStats& ReplayPass::phase_at(std::size_t i) {
  const auto& ref = open_phases_[i];
  return report_.steps[ref.first].phases[ref.second];
}

void ReplayPass::observe_timeline() {
  timeline_.observe(now_ns_, ledger_.live_bytes(), ledger_.reserved_bytes(), ledger_.by_category());
}

void ReplayPass::observe_growth(const Event& e) {
  observe_timeline();
  const std::uint64_t live = ledger_.live_bytes();
  StepStats& s = step_stats();
  if (live > s.peak_bytes) {
    s.peak_bytes = live;
    s.peak_by_category = ledger_.by_category();
  }
  for (std::size_t i = 0; i < open_phases_.size(); ++i) {
    PhaseStats& p = phase_at(i);
    if (live > p.peak_bytes) {
      p.peak_bytes = live;
      p.peak_time_ns = e.time_ns;
      p.peak_by_category = ledger_.by_category();
    }
  }
  if (has_peak_ && e.seq == peak_seq_) capture_peak(e);
}

void ReplayPass::on_alloc(const Event& e) {
  const std::uint64_t id = next_block_id_++;
  if (e.device != device_) return;
  ++report_.allocations;
  step_stats();  // open the step first, so its start_bytes exclude this block
  const Resolved& r = id < resolved_.size() ? resolved_[id] : kUnknown;
  LiveBlock b;
  b.bytes = e.bytes;
  b.requested_bytes = e.requested_bytes;
  b.block_id = id;
  b.label_id = r.label_id;
  b.alloc_phase_id = phase_stack_.empty() ? 0 : phase_stack_.back();
  b.context_id = e.string_id;
  b.stack_id = e.stack_id;
  b.category = r.category;
  if (const LiveBlock* old = ledger_.find(e.addr)) retention_.on_free(old->block_id);  // a missed free
  ledger_.on_alloc(e.addr, b);
  retention_.on_alloc(id, frames_.site_of_stack(e.stack_id), r.category, e.bytes, e.seq);
  alloc_step_[id] = current_step_;
  for (std::size_t i = 0; i < open_phases_.size(); ++i) {
    PhaseStats& p = phase_at(i);
    p.allocated_bytes += e.bytes;
    ++p.allocations;
  }
  observe_growth(e);
}

void ReplayPass::on_free(const Event& e) {
  step_stats();
  const auto block = ledger_.on_free(e.addr);
  if (!block) return;
  observe_timeline();
  ++report_.frees;
  alloc_step_.erase(block->block_id);
  retention_.on_free(block->block_id);
  for (std::size_t i = 0; i < open_phases_.size(); ++i) phase_at(i).freed_bytes += block->bytes;
}

void ReplayPass::on_tag(const Event& e) {
  ++report_.tags;
  const LiveBlock* b = ledger_.find(e.addr);
  if (b == nullptr) {
    ledger_.set_category(e.addr, e.category, e.string_id);  // counts the unknown address
    return;
  }
  if (e.flags & kTagWeak) return;  // weak tags were settled in pass 1
  if (b->category != e.category || (e.string_id != 0 && b->label_id != e.string_id)) {
    ledger_.set_category(e.addr, e.category, e.string_id);
  }
}

void ReplayPass::on_phase_begin(const Event& e) {
  StepStats& s = step_stats();
  PhaseStats p;
  p.phase = phase_name(e.string_id);
  p.parent = phase_stack_.empty() ? std::string() : phase_name(phase_stack_.back());
  p.depth = static_cast<std::uint32_t>(phase_stack_.size());
  p.step = current_step_;
  p.index = occurrences_[e.string_id]++;
  p.complete = false;
  p.begin_time_ns = p.peak_time_ns = e.time_ns;
  p.start_bytes = p.peak_bytes = ledger_.live_bytes();
  p.start_by_category = p.peak_by_category = ledger_.by_category();
  s.phases.push_back(std::move(p));
  open_phases_.emplace_back(report_.steps.size() - 1, s.phases.size() - 1);
  phase_stack_.push_back(e.string_id);
}

void ReplayPass::close_phase(std::size_t i, std::uint64_t time_ns, bool complete) {
  PhaseStats& p = phase_at(i);
  if (complete && parse_phase_kind(p.phase) == PhaseKind::OptimizerStep) completed_optimizer_step_ = true;
  p.complete = complete;
  p.end_time_ns = time_ns;
  report_.timeline.phases.push_back({p.phase, p.step, p.depth, p.begin_time_ns, time_ns});
  p.end_bytes = ledger_.live_bytes();
  p.end_by_category = ledger_.by_category();
}

void ReplayPass::on_phase_end(const Event& e) {
  for (std::size_t i = phase_stack_.size(); i-- > 0;) {
    if (phase_stack_[i] == e.string_id) {
      for (std::size_t j = phase_stack_.size(); j-- > i;) close_phase(j, e.time_ns, true);
      phase_stack_.resize(i);
      open_phases_.resize(i);
      return;
    }
  }
}

void ReplayPass::on_step(const Event& e) {
  StepStats& s = step_stats();
  s.end_bytes = ledger_.live_bytes();
  s.end_by_category = ledger_.by_category();
  s.end_time_ns = e.time_ns;
  report_.timeline.step_ends.emplace_back(e.value, e.time_ns);
  retention_.on_step_end(e.value);
  step_open_ = false;
  current_step_ = e.value + 1;
  occurrences_.clear();
}

// The ledgers beside the composition (ridgescope/memory_layers.h): host samples of the CPU
// (whatever device is reported) and driver readings of the reported device.
std::uint32_t ReplayPass::current_phase_id() const { return phase_stack_.empty() ? 0 : phase_stack_.back(); }

void ReplayPass::on_layer_sample(const Event& e) {
  const std::string_view key = reader_.string(e.string_id);
  if (e.device.type == DeviceType::CPU && key.substr(0, 5) == "host_") {
    host_ledger_.on_sample(key, e.value, e.time_ns, current_step_, phase_name(current_phase_id()));
  } else if (e.device == device_) {
    device_ledger_.on_sample(key, e.value, e.time_ns, ledger_.reserved_bytes(), current_step_, current_phase_id());
  }
}

void ReplayPass::on_external(const Event& e) {
  const std::string site = e.kind == EventKind::ExternalAlloc ? frames_.site_text(frames_.site_of_stack(e.stack_id))
                                                              : std::string();
  device_ledger_.on_external(e, site, current_step_, current_phase_id());
}

void ReplayPass::on_oom(const Event& e) {
  OomContext c;
  c.request_bytes = e.bytes;
  c.live_bytes = ledger_.live_bytes();
  c.reserved_bytes = ledger_.reserved_bytes();
  c.device_free_bytes = e.value;
  c.by_category = ledger_.by_category();
  c.phase = phase_stack_.empty() ? std::string("idle") : phase_name(phase_stack_.back());
  c.step = current_step_;
  for (std::size_t i = open_phases_.size(); i-- > 0;) {
    const PhaseStats& p = phase_at(i);
    if (parse_phase_kind(p.phase) != PhaseKind::OptimizerStep) continue;
    c.first_optimizer_step = !completed_optimizer_step_;
    const auto k = category_index(Category::OptimizerState);
    c.optimizer_state_created = ledger_.by_category()[k] - std::min(ledger_.by_category()[k], p.start_by_category[k]);
    break;
  }
  c.free = current_free_space();
  device_ledger_.describe(c, c.reserved_bytes);
  oom_contexts_.push_back(c);
  OomRecord o;
  o.free = c.free;
  o.request_bytes = e.bytes;
  o.device_free_bytes = e.value;
  o.step = current_step_;
  o.phase = phase_stack_.empty() ? std::string("idle") : phase_name(phase_stack_.back());
  o.time_ns = e.time_ns;
  report_.timeline.oom_times_ns.push_back(e.time_ns);
  o.live_bytes = ledger_.live_bytes();
  o.reserved_bytes = ledger_.reserved_bytes();
  o.by_category = ledger_.by_category();
  report_.ooms.push_back(std::move(o));
}

void ReplayPass::on_checkpoint(const Checkpoint& c) {
  if (window_.continues(c)) {  // the state it describes is the one built so far
    applying_ = false;
    return;
  }
  // The window before ends: its open phases and step end where its events end.
  end_open_phases_and_step();
  phase_stack_.clear();
  step_open_ = false;
  if (!report_.steps.empty() || next_block_id_ > 0) report_.timeline.gaps.emplace_back(last_time_, c.time_ns);
  ledger_ = Ledger();
  alloc_step_.clear();
  retention_ = RetentionDetector();
  occurrences_.clear();
  window_.restart(c);
  current_step_ = c.step;
  now_ns_ = last_time_ = c.time_ns;
  if (c.step > 0) completed_optimizer_step_ = true;  // the steps before it ran their optimizer
  pending_phases_.clear();
  for (const CheckpointPhase& p : c.phases) pending_phases_.push_back(p.name_id);
  device_ledger_.begin_restating();
  applying_ = true;
}

void ReplayPass::on_checkpoint_block(const CheckpointBlock& c, std::uint64_t seq) {
  const std::uint64_t id = next_block_id_++;  // every device's, as pass 1 counts them
  if (c.device != device_) return;
  const Resolved& r = id < resolved_.size() ? resolved_[id] : kUnknown;
  LiveBlock b;
  b.bytes = c.bytes;
  b.requested_bytes = c.requested_bytes;
  b.block_id = id;
  b.label_id = r.label_id;
  b.alloc_phase_id = c.alloc_phase_id;
  b.context_id = c.context_id;
  b.stack_id = c.stack_id;
  b.category = r.category;
  // The strong tags before the checkpoint moved the ledger's category as on_tag() does.
  if ((c.tags & kTagsStrong) && (b.category != c.current || (c.current_label != 0 && b.label_id != c.current_label))) {
    b.category = c.current;
    if (c.current_label != 0) b.label_id = c.current_label;
  }
  ledger_.on_alloc(c.addr, b);
  retention_.on_alloc(id, frames_.site_of_stack(c.stack_id), r.category, c.bytes, seq);
  alloc_step_[id] = c.alloc_step;
  observe_timeline();
}

FreeSpace ReplayPass::current_free_space() const {
  std::vector<AddressRange> segments, blocks;
  ledger_.for_each_segment([&](std::uint64_t addr, std::uint64_t bytes) { segments.push_back({addr, bytes}); });
  if (!segments.empty()) {
    ledger_.for_each_live([&](std::uint64_t addr, const LiveBlock& b) { blocks.push_back({addr, b.bytes}); });
  }
  return free_space(std::move(segments), std::move(blocks));
}

void ReplayPass::on_sample(const Event& e) {
  const std::string_view name = reader_.string(e.string_id);
  if (name == "nvml_used_bytes") {
    DriverView& d = report_.driver_view;
    ++d.samples;
    d.max_used_bytes = std::max(d.max_used_bytes, e.value);
    const std::uint64_t reserved = ledger_.reserved_bytes();
    if (e.value > reserved) d.max_non_pytorch_bytes = std::max(d.max_non_pytorch_bytes, e.value - reserved);
    return;
  }
  if (name == "nvml_process_used_bytes") {
    ++report_.driver_view.process_samples;
    report_.driver_view.max_process_used_bytes = std::max(report_.driver_view.max_process_used_bytes, e.value);
    return;
  }
  if (name == "nvml_total_bytes") {
    report_.driver_view.total_bytes = e.value;
    return;
  }
  if (name != kAllocatorLiveSample && name != kAllocatorReservedSample) return;
  const std::uint64_t ours =
      name == kAllocatorLiveSample ? ledger_.live_bytes() : ledger_.reserved_bytes();
  auto& c = report_.consistency;
  ++c.samples;
  if (e.value != ours) {
    if (c.mismatches == 0) {
      // ours - reading, saturated: a corrupt reading may be near 2^64
      const std::uint64_t d = ours > e.value ? ours - e.value : e.value - ours;
      const std::int64_t magnitude = static_cast<std::int64_t>(std::min<std::uint64_t>(d, INT64_MAX));
      c.first_difference_bytes = ours > e.value ? magnitude : d > INT64_MAX ? INT64_MIN : -magnitude;
      c.first_mismatch_seq = e.seq;
    }
    ++c.mismatches;
  }
}

void ReplayPass::on_metadata(std::string key, std::string_view text) {
  for (auto& [k, v] : report_.metadata) {
    if (k == key) {
      v.assign(text.data(), text.size());
      return;
    }
  }
  report_.metadata.emplace_back(std::move(key), std::string(text));
}

std::string ReplayPass::fallback_label(const LiveBlock& b) const {
  if (b.context_id != 0) {
    return std::string(category_name(b.category)) + " in " + std::string(reader_.string(b.context_id));
  }
  return std::string(category_name(b.category)) + " allocated in " + phase_name(b.alloc_phase_id);
}

void ReplayPass::capture_peak(const Event& e) {
  PeakInfo& peak = report_.peak;
  peak.bytes = ledger_.live_bytes();
  peak.reserved_bytes = ledger_.reserved_bytes();
  peak.step = current_step_;
  peak.phase = phase_stack_.empty() ? std::string("idle") : phase_name(phase_stack_.back());
  for (auto id : phase_stack_) peak.phase_stack.push_back(phase_name(id));
  peak.time_ns = e.time_ns;
  peak.seq = e.seq;
  peak.by_category = ledger_.by_category();

  peak.free = current_free_space();
  host_ledger_.on_peak(e.time_ns);
  device_ledger_.on_peak();
  std::vector<std::pair<std::uint64_t, const LiveBlock*>> blocks;
  blocks.reserve(ledger_.live_blocks());
  // Labelled blocks group by label; unlabelled ones by what their fallback label names: the
  // module that made them, else the phase.
  absl::flat_hash_map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t, Category>, LabelBytes> labels;
  ledger_.for_each_live([&](std::uint64_t addr, const LiveBlock& b) {
    blocks.emplace_back(addr, &b);
    if (id_inferred(b.block_id)) peak.inferred_by_category[category_index(b.category)] += b.bytes;
    const bool named = b.label_id != 0;
    auto& l = labels[{b.label_id, named ? 0u : b.context_id,
                      named || b.context_id ? 0u : b.alloc_phase_id, b.category}];
    l.category = b.category;
    l.bytes += b.bytes;
    ++l.blocks;
    if (l.label.empty()) l.label = b.label_id ? std::string(reader_.string(b.label_id)) : fallback_label(b);
  });
  auto by_size = [](const auto& a, const auto& b) {
    if (a.second->bytes != b.second->bytes) return a.second->bytes > b.second->bytes;
    return a.second->block_id < b.second->block_id;
  };
  const std::size_t n = std::min(options_.top_blocks, blocks.size());
  std::partial_sort(blocks.begin(), blocks.begin() + n, blocks.end(), by_size);
  for (std::size_t i = 0; i < n; ++i) {
    const LiveBlock& b = *blocks[i].second;
    TopBlock t;
    t.bytes = b.bytes;
    t.category = b.category;
    t.inferred = id_inferred(b.block_id);
    t.label = b.label_id ? std::string(reader_.string(b.label_id)) : fallback_label(b);
    t.phase_allocated = phase_name(b.alloc_phase_id);
    t.module = std::string(reader_.string(b.context_id));
    auto it = alloc_step_.find(b.block_id);
    t.step_allocated = it == alloc_step_.end() ? 0 : it->second;
    t.address = blocks[i].first;
    const std::uint32_t site = frames_.site_of_stack(b.stack_id);
    t.site = frames_.site_text(site);
    t.site_frame = frames_.index(site);
    peak.top_blocks.push_back(std::move(t));
  }
  collect_peak_sites(ledger_, frames_, options_.top_sites, options_.max_stacks, peak);
  for (auto& [key, l] : labels) {
    if (l.category == Category::Parameter || l.category == Category::Buffer) peak.persistent_labels.push_back(l);
    peak.by_label.push_back(std::move(l));
  }
  std::sort(peak.by_label.begin(), peak.by_label.end(), [](const LabelBytes& a, const LabelBytes& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.label < b.label;
  });
  if (peak.by_label.size() > options_.top_labels) peak.by_label.resize(options_.top_labels);
}

void ReplayPass::end_open_phases_and_step() {
  for (std::size_t j = open_phases_.size(); j-- > 0;) close_phase(j, last_time_, false);
  open_phases_.clear();
  if (!step_open_) return;
  StepStats& s = report_.steps.back();
  s.end_bytes = ledger_.live_bytes();
  s.end_by_category = ledger_.by_category();
  s.end_time_ns = last_time_;
  s.complete = false;
}

void ReplayPass::finish() {
  if (applying_) device_ledger_.end_restating(current_step_);  // the trace ended in a checkpoint
  end_open_phases_and_step();
  if (step_open_) {
    const StepStats& s = report_.steps.back();
    // A trailing step with nothing in it (the loop ended right after a step) says nothing.
    if (s.phases.empty() && s.peak_bytes == s.start_bytes) report_.steps.pop_back();
  }
  report_.final_live_bytes = ledger_.live_bytes();
  report_.final_reserved_bytes = ledger_.reserved_bytes();
  report_.final_by_category = ledger_.by_category();
  report_.anomalies = ledger_.anomalies();
  report_.retained = retention_.result(frames_);
  host_ledger_.finish(report_.host_memory);
  device_ledger_.finish(report_.device_ledger);
  CodeRoots roots;
  for (const auto& [key, text] : report_.metadata) {
    if (key == "sites") roots = code_roots_from_sites_metadata(text);
  }
  frames_.describe(roots);
  timeline_.finish();
  // Phases were recorded as they closed (inner ones first); draw them in order of beginning.
  std::stable_sort(report_.timeline.phases.begin(), report_.timeline.phases.end(),
                   [](const TimelinePhase& a, const TimelinePhase& b) {
                     return a.begin_time_ns != b.begin_time_ns ? a.begin_time_ns < b.begin_time_ns
                                                               : a.depth < b.depth;
                   });
}

void ReplayPass::take_probe() {
  Report::Probe p;
  p.time_ns = *options_.probe_time_ns;
  p.live_bytes = ledger_.live_bytes();
  p.reserved_bytes = ledger_.reserved_bytes();
  p.free = current_free_space();
  report_.probe = p;
}

void ReplayPass::sample_dashboards(std::uint64_t now_ns) {
  if (!sampling_started_) {
    sampling_started_ = true;
    for (std::uint64_t period : {15'000'000'000ull, 30'000'000'000ull}) samplers_.push_back({period, now_ns});
  }
  if (options_.probe_time_ns && !report_.probe && now_ns > *options_.probe_time_ns) take_probe();
  for (Sampler& s : samplers_) {
    if (s.exhausted || now_ns < s.next_ns) continue;
    // Every sampling instant up to now reads the state as of just before this event. Counted,
    // not looped: a corrupt trace may jump its clock by centuries (or to near 2^64, where
    // stepping next_ns would wrap around and never pass now_ns).
    const std::uint64_t due = (now_ns - s.next_ns) / s.period_ns + 1;
    s.samples += due;
    s.max = std::max(s.max, ledger_.live_bytes());
    if (due > (UINT64_MAX - s.next_ns) / s.period_ns) {
      s.exhausted = true;  // the next instant is past the end of the clock
    } else {
      s.next_ns += due * s.period_ns;
    }
  }
}

void ReplayPass::finish_dashboards() {
  if (options_.probe_time_ns && !report_.probe) take_probe();  // after the last event
  for (const Sampler& s : samplers_) report_.dashboards.push_back({s.period_ns, s.samples, s.max});
}

}  // namespace ridgescope::detail
