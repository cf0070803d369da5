// snapshot_cuda_blocks.cpp — PyTorch's CUDA snapshots: block sizes from a model of the
// segments (see snapshot_emitter.h). torch's trace records the *requested* bytes of each
// allocation. The block it got (what memory_allocated() counts) is the rounded size, or a whole
// free block when the allocator did not split it (up to 1 MiB more; oversize blocks more still).
// CudaTraceTranslator models the segments from the trace's segment entries and recomputes each
// block exactly under the snapshot's allocator_settings (the same code as the live CUDA source).
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "snapshot_emitter.h"

namespace ridgescope::detail {

CudaTraceEntry SnapshotEmitter::cuda_entry(const SnapshotEntry& e) const {
  CudaTraceEntry c;
  switch (e.action) {
    case EntryAction::Alloc: c.action = CudaTraceAction::Alloc; break;
    case EntryAction::FreeRequested: c.action = CudaTraceAction::FreeRequested; break;
    case EntryAction::FreeCompleted: c.action = CudaTraceAction::FreeCompleted; break;
    case EntryAction::SegmentAlloc: c.action = CudaTraceAction::SegmentAlloc; break;
    case EntryAction::SegmentFree: c.action = CudaTraceAction::SegmentFree; break;
    case EntryAction::SegmentMap: c.action = CudaTraceAction::SegmentMap; break;
    case EntryAction::SegmentUnmap: c.action = CudaTraceAction::SegmentUnmap; break;
    case EntryAction::Oom: c.action = CudaTraceAction::Oom; break;
    default: c.action = CudaTraceAction::Unknown; break;
  }
  c.device = doc_.device.index;
  c.addr = e.action == EntryAction::Oom ? e.device_free() : e.addr;
  c.size = e.size;
  c.stream = e.stream;
  return c;
}

void SnapshotEmitter::translate(const SnapshotEntry& e, std::size_t index, std::uint64_t t) {
  scratch_.clear();
  CudaTraceEntry entry = cuda_entry(e);
  if (e.legacy_free) {
    entry.action = CudaTraceAction::FreeRequested;
    translator_->translate(entry, &scratch_);
    entry.action = CudaTraceAction::FreeCompleted;
  }
  translator_->translate(entry, &scratch_);
  for (Event ev : scratch_) {
    if (ev.kind == EventKind::Alloc) {
      auto exact = start_.exact_bytes.find(index);
      const std::uint64_t bytes = exact != start_.exact_bytes.end() ? exact->second : ev.bytes;
      ++blocks_modelled_;
      if (bytes != doc_.rounded_block_bytes(e.size)) ++blocks_larger_than_rounded_;
      alloc(ev.addr, bytes, ev.requested_bytes, ev.stream, t, where(*e.frames), e.frames);
      tag_block(ev.addr, t, e.category(), e.frames, e.label(), e.category_inferred(), false);
      continue;
    }
    record_translated(ev, t, e.frames);
  }
}

void SnapshotEmitter::record_translated(Event ev, std::uint64_t t, const SnapshotFrames* frames) {
  ev.time_ns = t;
  ev.device = doc_.device;
  if (ev.kind == EventKind::Free) live_bytes_.erase(ev.addr);
  record(ev, frames);
}

void SnapshotEmitter::adopt_start_state() {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> segs = start_.segments;
  std::sort(segs.begin(), segs.end());
  std::vector<const SnapshotBlock*> blocks;
  for (const SnapshotBlock& b : start_.blocks) blocks.push_back(&b);
  std::sort(blocks.begin(), blocks.end(), [](const SnapshotBlock* a, const SnapshotBlock* b) { return a->addr < b->addr; });
  absl::flat_hash_set<const SnapshotBlock*> placed;
  auto emit_adopted = [&](const SnapshotBlock* b) {
    for (const Event& ev : scratch_) {
      if (ev.kind == EventKind::Alloc && b != nullptr) {
        alloc(ev.addr, ev.bytes, ev.requested_bytes, ev.stream, 0, where(*b->frames, b->frames_from_free),
            b->frames_from_free ? nullptr : b->frames);
        tag_block(ev.addr, 0, b->category, b->frames_from_free ? nullptr : b->frames, b->label,
                  b->category_inferred, true);
      } else {
        record_translated(ev, 0);
      }
    }
  };
  std::size_t bi = 0;
  for (const auto& [addr, size] : segs) {
    scratch_.clear();
    translator_->adopt_segment(doc_.device.index, addr, size, 0, start_.expandable_starts.contains(addr), &scratch_);
    emit_adopted(nullptr);
    while (bi < blocks.size() && blocks[bi]->addr < addr) ++bi;
    for (std::size_t j = bi; j < blocks.size() && blocks[j]->addr < addr + size; ++j) {
      const SnapshotBlock* b = blocks[j];
      scratch_.clear();
      translator_->adopt_block(doc_.device.index, b->addr, b->bytes, b->requested, true, 0, &scratch_);
      emit_adopted(b);
      placed.insert(b);
    }
  }
  for (const SnapshotBlock* b : blocks) {
    if (placed.contains(b)) continue;
    alloc(b->addr, b->bytes, b->requested, 0, 0, where(*b->frames, b->frames_from_free),
          b->frames_from_free ? nullptr : b->frames);
    tag_block(b->addr, 0, b->category, b->frames_from_free ? nullptr : b->frames, b->label, b->category_inferred,
              true);
  }
}

}  // namespace ridgescope::detail
