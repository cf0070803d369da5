// snapshot_emitter.cpp — one device's replay of a torch memory snapshot as ridgescope events
// (see snapshot_emitter.h).
#include "snapshot_emitter.h"

#include <algorithm>
#include <map>
#include <utility>

#include "address_intervals.h"
#include "snapshot_frames.h"

namespace ridgescope::detail {

SnapshotEmitter::SnapshotEmitter(const SnapshotDocument& doc, const SnapshotStartState& start, Recorder& rec,
                                 std::unique_ptr<SnapshotInference> inference)
    : doc_(doc), start_(start), rec_(rec), sink_(rec, std::move(inference)), modelled_(!doc.ours && !doc.cpu) {
  if (modelled_) translator_ = std::make_unique<CudaTraceTranslator>(doc.rules);
}

void SnapshotEmitter::run() {
  for (const auto& [k, v] : doc_.metadata) rec_.metadata(k, v);
  if (!doc_.ours) {
    for (const SnapshotEntry& e : doc_.entries) {
      if (e.action != EntryAction::Other) {
        base_us_ = e.time_us;
        break;
      }
    }
  }
  // The state before the first entry.
  if (modelled_) {
    adopt_start_state();
  } else {
    emit_start_state();
  }
  for (std::size_t i = 0; i < doc_.entries.size(); ++i) {
    const SnapshotEntry& e = doc_.entries[i];
    phases_.emit_marks_through(*this, i);
    if (e.action == EntryAction::Other) {
      if (!e.outside) ++ignored_entries_;
      continue;
    }
    if (!doc_.ours) phases_.emit_torch_marks_before(*this, e.time_us);
    const std::uint64_t t = time_ns(e.time_us);
    if (!doc_.ours) note_frames(e, t);
    if (modelled_ && e.action != EntryAction::Annotate) {
      if (e.action == EntryAction::Alloc) phases_.infer_phase(*this, e, t);
      translate(e, i, t);
    } else {
      emit_entry(e, i, t);
    }
  }
  phases_.finish(*this, last_ns_);
  if (!doc_.ours && doc_.has_segments) end_state();
  sink_.flush();
}

void SnapshotEmitter::note_frames(const SnapshotEntry& e, std::uint64_t t_ns) {
  if (e.action == EntryAction::Alloc) {
    alloc_frames_[e.addr] = e.frames;
    return;
  }
  const bool free_request = e.action == EntryAction::FreeRequested || (e.action == EntryAction::FreeCompleted && e.legacy_free);
  if (free_request) {
    auto it = alloc_frames_.find(e.addr);
    phases_.infer_phase_at_free(*this, e, it != alloc_frames_.end() ? it->second : nullptr, t_ns);
  }
  if (e.action == EntryAction::FreeCompleted) alloc_frames_.erase(e.addr);
}

std::uint64_t SnapshotEmitter::time_ns(std::uint64_t time_us) {
  std::uint64_t t = time_us >= base_us_ ? (time_us - base_us_) * 1000 : 0;
  if (t < last_ns_) t = last_ns_;
  last_ns_ = t;
  return t;
}

Event SnapshotEmitter::make(EventKind kind, std::uint64_t t_ns) const {
  Event e;
  e.kind = kind;
  e.time_ns = t_ns;
  e.device = doc_.device;
  return e;
}

void SnapshotEmitter::record(const Event& e, const SnapshotFrames* frames, bool after_trace) {
  sink_.record(e, frames, after_trace);
}

void SnapshotEmitter::tag_block(std::uint64_t addr, std::uint64_t t_ns, std::optional<std::string_view> category,
                                const SnapshotFrames* frames, std::string_view label, std::optional<bool> inferred,
                                bool before_trace) {
  ++allocations_;
  std::optional<Category> named;
  if (category) {
    named = category_from_name(*category);
    if (!named) unknown_category_names_.insert(std::string(*category));
  }
  if (sink_.inferring()) {
    sink_.block(frames, before_trace, named);
    return;
  }
  if (!named) return;
  ++categorised_from_snapshot_;
  if (inferred.value_or(false)) return;  // inferred from lifetimes: the same phases give the same result
  Event e = make(EventKind::Tag, t_ns);
  e.addr = addr;
  e.category = *named;
  e.string_id = rec_.intern(label);
  record(e);
}

void SnapshotEmitter::alloc(std::uint64_t addr, std::uint64_t bytes, std::uint64_t requested, std::uint64_t stream,
                            std::uint64_t t_ns, std::string_view module, const SnapshotFrames* frames) {
  Event e = make(EventKind::Alloc, t_ns);
  if (frames != nullptr) e.stack_id = stacks_.stack_of(*frames);
  e.addr = addr;
  e.bytes = bytes;
  e.requested_bytes = requested;
  e.stream = stream;
  e.string_id = module.empty() ? 0 : rec_.intern(module);
  sink_.alloc(e, module);
  live_bytes_[addr] = bytes;
}

const std::string& SnapshotEmitter::where(const SnapshotFrames& frames, bool frames_from_free) {
  static const std::string kNowhere;
  if (doc_.ours || frames_from_free || frames.empty()) return kNowhere;
  auto [it, inserted] = where_.try_emplace(&frames);
  if (inserted) it->second = detail::where_from_frames(frames);
  return it->second;
}

void SnapshotEmitter::phase(bool begin, std::string_view name, std::uint64_t t_ns) {
  Event e = make(begin ? EventKind::PhaseBegin : EventKind::PhaseEnd, t_ns);
  e.device = Device{};
  e.string_id = rec_.intern(name);
  sink_.phase(e, begin, name);
}

void SnapshotEmitter::step(std::uint64_t n, std::uint64_t t_ns) {
  Event e = make(EventKind::Step, t_ns);
  e.device = Device{};
  e.value = n;
  record(e);
}

void SnapshotEmitter::segment(EventKind kind, std::uint64_t addr, std::uint64_t bytes, std::uint64_t t_ns) {
  Event e = make(kind, t_ns);
  e.addr = addr;
  e.bytes = bytes;
  record(e);
}

void SnapshotEmitter::emit_start_state() {
  const std::uint64_t t0 = 0;
  if (!doc_.cpu) {
    for (const auto& [addr, size] : start_.segments) segment(EventKind::SegmentAlloc, addr, size, t0);
  }
  for (const SnapshotBlock& b : start_.blocks) {
    alloc(b.addr, b.bytes, b.requested, 0, t0, doc_.ours ? std::string(b.module) : where(*b.frames, b.frames_from_free),
          b.frames_from_free ? nullptr : b.frames);
    tag_block(b.addr, t0, b.category, b.frames_from_free ? nullptr : b.frames, b.label, b.category_inferred, true);
  }
}

void SnapshotEmitter::emit_entry(const SnapshotEntry& e, std::size_t i, std::uint64_t t) {
  switch (e.action) {
    case EntryAction::Alloc: {
      if (!doc_.ours) phases_.infer_phase(*this, e, t);
      auto exact = start_.exact_bytes.find(i);
      const std::uint64_t bytes =
          e.block_size() ? *e.block_size() : exact != start_.exact_bytes.end() ? exact->second : doc_.rounded_block_bytes(e.size);
      alloc(e.addr, bytes, e.size, e.stream, t, doc_.ours ? std::string(e.module()) : where(*e.frames), e.frames);
      tag_block(e.addr, t, e.category(), e.frames, e.label(), e.category_inferred(), false);
      break;
    }
    case EntryAction::FreeRequested: break;  // the block stays allocated until free_completed
    case EntryAction::FreeCompleted: {
      if (!live_bytes_.contains(e.addr)) break;
      Event f = make(EventKind::Free, t);
      f.addr = e.addr;
      f.bytes = live_bytes_[e.addr];
      f.stream = e.stream;
      record(f, e.frames);
      live_bytes_.erase(e.addr);
      break;
    }
    case EntryAction::SegmentAlloc:
    case EntryAction::SegmentFree:
    case EntryAction::SegmentMap:
    case EntryAction::SegmentUnmap: {
      if (doc_.cpu) break;  // a CPU export's segments mirror its blocks
      const bool grows = e.action == EntryAction::SegmentAlloc || e.action == EntryAction::SegmentMap;
      Event s = make(grows ? EventKind::SegmentAlloc : EventKind::SegmentFree, t);
      s.addr = e.addr;
      s.bytes = e.size;
      s.stream = e.stream;
      record(s);
      break;
    }
    case EntryAction::Oom: {
      Event o = make(EventKind::Oom, t);
      o.bytes = e.size;
      o.value = e.device_free();
      o.stream = e.stream;
      record(o);
      break;
    }
    case EntryAction::Annotate: {
      if (!e.category() || !live_bytes_.contains(e.addr)) break;
      const std::optional<Category> c = category_from_name(*e.category());
      if (!c) break;
      Event g = make(EventKind::Tag, t);
      g.addr = e.addr;
      g.category = *c;
      g.string_id = rec_.intern(e.label());
      record(g);
      break;
    }
    case EntryAction::Other: break;
  }
}

void SnapshotEmitter::end_state() {
  const std::uint64_t t = last_ns_;
  absl::flat_hash_map<std::uint64_t, const SnapshotBlock*> held;
  for (const SnapshotBlock& b : doc_.end_blocks) held[b.addr] = &b;
  std::vector<std::uint64_t> gone;
  for (const auto& [addr, bytes] : live_bytes_) {
    auto it = held.find(addr);
    if (it == held.end() || it->second->bytes != bytes) gone.push_back(addr);
  }
  std::sort(gone.begin(), gone.end());
  for (std::uint64_t addr : gone) {
    Event f = make(EventKind::Free, t);
    f.addr = addr;
    f.bytes = live_bytes_[addr];
    record(f, nullptr, /*after_trace=*/true);
    live_bytes_.erase(addr);
  }
  std::uint64_t made = 0;
  for (const SnapshotBlock& b : doc_.end_blocks) {
    if (live_bytes_.contains(b.addr)) continue;
    alloc(b.addr, b.bytes, b.requested, 0, t, where(*b.frames), b.frames_from_free ? nullptr : b.frames);
    tag_block(b.addr, t, b.category, b.frames, b.label, b.category_inferred, false);
    ++made;
  }
  // Reserved memory: compare what is covered, since ranges of expandable segments may be cut
  // differently.
  std::map<std::uint64_t, std::uint64_t> want;  // address -> bytes
  for (const auto& [addr, size] : doc_.end_segments) want[addr] = size;
  for (const auto& [lo, hi] : doc_.end_mapped) want[lo] = hi - lo;
  auto covered = [](const auto& segments) {
    std::map<std::uint64_t, std::uint64_t> out;
    for (const auto& [addr, size] : segments) add_interval(out, addr, addr + size);
    return out;
  };
  std::uint64_t segments_changed = 0;
  const auto& segments_now = sink_.segments();
  if (!doc_.cpu && covered(segments_now) != covered(want)) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> now(segments_now.begin(), segments_now.end());
    std::sort(now.begin(), now.end());
    for (const auto& [addr, size] : now) {
      auto it = want.find(addr);
      if (it != want.end() && it->second == size) continue;
      segment(EventKind::SegmentFree, addr, size, t);
      ++segments_changed;
    }
    for (const auto& [addr, size] : want) {
      auto it = segments_now.find(addr);
      if (it != segments_now.end() && it->second == size) continue;
      segment(EventKind::SegmentAlloc, addr, size, t);
      ++segments_changed;
    }
  }
  if (!gone.empty() || made > 0 || segments_changed > 0) {
    end_state_note_ = (
        "The trace ends in another state than the snapshot's segments (history recording stopped before "
        "the snapshot was taken?): at the end " + std::to_string(gone.size()) + " blocks the trace left "
        "allocated were freed, " + std::to_string(made) + " blocks it never allocated were allocated and " +
        std::to_string(segments_changed) + " segments were set as the snapshot holds them.");
  }
}

SnapshotImport SnapshotEmitter::import_info() const {
  SnapshotImport info;
  info.producer = doc_.ours ? "ridgescope" : "pytorch";
  info.device = device_name(doc_.device);
  info.trace_entries = doc_.entries.size();
  info.alloc_conf = doc_.alloc_conf;
  info.live_at_start_blocks = start_.blocks.size();
  info.reasons = sink_.reasons();
  info.categorised_from_snapshot = categorised_from_snapshot_ + sink_.decided_by_snapshot();
  info.categorised_from_frames = sink_.decided_by_frames();
  info.categories_inferred = info.categorised_from_snapshot < allocations_;
  info.phases_inferred = phases_.inferred_phases();
  info.block_sizes_inferred = !doc_.ours && !doc_.cpu;
  if (doc_.ours) {
    info.notes.push_back("A ridgescope export: categories, labels, phases and steps are read back from the "
                          "snapshot's 'category' keys, user_metadata and external_annotations.");
  } else {
    info.notes.push_back(
        "A snapshot written by PyTorch: it records no categories or phases. Each block's category is "
        "inferred by the first rule that fires (docs/snapshot.md): frames (the optimizer's _init_group, "
        "AccumulateGrad, Module._apply/load_state_dict/from_pretrained, workspaces, the data loader), "
        "sizes (a block live before the first forward that a gradient of its size matches is a "
        "parameter), the step's structure and lifetimes over the phases. Each label ends with the "
        "rule's id; 'reasons' says how many bytes each rule decided.");
    if (!end_state_note_.empty()) info.notes.push_back(end_state_note_);
    if (phases_.annotated_phases() > 0) {
      info.notes.push_back(std::to_string(phases_.annotated_phases()) +
                            " phases come from torch's record_function annotations (the optimizer's "
                            "step and zero_grad, or record_functions named like a phase): exact.");
    }
    if (phases_.inferred_phases()) {
      info.notes.push_back("Phases are inferred from stack frames (Module forward calls, backward, "
                            "torch.optim, zero_grad); steps begin where a forward follows a backward "
                            "or an optimizer step.");
    } else if (phases_.annotated_phases() == 0) {
      info.notes.push_back("No frame names a phase (the snapshot was recorded without stacks?): "
                            "the report has no phases, and lifetime categories need phases.");
    }
    const CudaTranslatorStats ts = translator_ ? translator_->stats() : CudaTranslatorStats{};
    info.block_sizes_modelled = blocks_modelled_;
    info.blocks_larger_than_rounded = blocks_larger_than_rounded_;
    info.unmatched_entries = ts.unmatched_frees + ts.unmatched_segment_frees + ts.allocs_outside_segments;
    info.notes.push_back(
        "PyTorch's trace records requested sizes; block sizes (what memory_allocated() counts) are "
        "recomputed by replaying the segments under the snapshot's allocator_settings: rounding, and "
        "blocks handed out whole when the allocator does not split them (" +
        std::to_string(blocks_larger_than_rounded_) + " of " + std::to_string(blocks_modelled_) +
        " allocations got a block larger than the rounded request).");
    if (info.unmatched_entries > 0) {
      info.notes.push_back(
          std::to_string(info.unmatched_entries) + " trace entries did not match the replayed segments (" +
          std::to_string(ts.allocs_outside_segments) + " allocations outside any known segment, " +
          std::to_string(ts.unmatched_frees) + " frees of unknown blocks, " +
          std::to_string(ts.unmatched_segment_frees) +
          " segment releases of unknown segments; the trace probably began after these were made): "
          "their blocks use the rounded request size.");
    }
  }
  if (info.live_at_start_blocks > 0) {
    info.notes.push_back(std::to_string(info.live_at_start_blocks) +
                          " blocks were live before the first trace entry (from the segments or from "
                          "frees without an alloc); they are counted from time 0.");
  }
  if (ignored_entries_ > 0) {
    info.notes.push_back(std::to_string(ignored_entries_) + " trace entries of other kinds (snapshot "
                          "markers, newer actions) were skipped.");
  }
  for (const std::string& n : unknown_category_names_) {
    info.notes.push_back("category '" + n + "' is not a ridgescope category; those blocks were treated "
                          "as uncategorised.");
  }
  return info;
}

}  // namespace ridgescope::detail
