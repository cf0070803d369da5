// snapshot_start_state.cpp — what was live before a snapshot's first entry (see
// snapshot_start_state.h).
#include "snapshot_start_state.h"

#include <map>

#include "address_intervals.h"

namespace ridgescope::detail {

SnapshotStartState prescan_start_state(const SnapshotDocument& doc) {
  SnapshotStartState start;
  absl::flat_hash_map<std::uint64_t, std::size_t> live;  // addr -> alloc entry index (or npos)
  absl::flat_hash_set<std::uint64_t> live_segments;
  absl::flat_hash_set<std::uint64_t> touched;  // block addresses the trace allocates or frees
  constexpr std::size_t kStart = static_cast<std::size_t>(-1);
  for (std::size_t i = 0; i < doc.entries.size(); ++i) {
    const SnapshotEntry& e = doc.entries[i];
    if (e.action == EntryAction::Alloc || e.action == EntryAction::FreeRequested || e.action == EntryAction::FreeCompleted) {
      touched.insert(e.addr);
    }
    switch (e.action) {
      case EntryAction::Alloc: live[e.addr] = i; break;
      case EntryAction::FreeRequested:
      case EntryAction::FreeCompleted:
        if (!live.contains(e.addr)) {
          SnapshotBlock sb;
          sb.addr = e.addr;
          sb.requested = e.size;
          sb.bytes = e.block_size().value_or(doc.rounded_block_bytes(e.size));
          sb.category = e.category();
          sb.frames = e.frames;
          sb.frames_from_free = true;
          sb.label = e.label();
          sb.module = e.module();
          sb.category_inferred = e.category_inferred();
          start.blocks.push_back(std::move(sb));
          live[e.addr] = kStart;
        }
        if (e.action == EntryAction::FreeCompleted) live.erase(e.addr);
        break;
      case EntryAction::SegmentAlloc: live_segments.insert(e.addr); break;
      case EntryAction::SegmentFree:
        if (!live_segments.contains(e.addr)) start.segments.emplace_back(e.addr, e.size);
        live_segments.erase(e.addr);
        break;
      default: break;
    }
  }
  for (const SnapshotBlock& b : doc.end_blocks) {
    auto it = live.find(b.addr);
    if (it == live.end()) {
      // Never in the trace: live throughout. Freed by the trace yet live in the segments: made
      // after the last entry (end_state() allocates it at the end).
      if (!touched.contains(b.addr)) start.blocks.push_back(b);
    } else if (it->second != kStart) {
      start.exact_bytes[it->second] = b.bytes;
    }
  }
  for (const auto& [addr, size] : doc.end_segments) {
    if (!live_segments.contains(addr)) start.segments.emplace_back(addr, size);
  }
  // Expandable segments map and unmap ranges that need not line up with each other: what
  // was mapped at the start is what is mapped at the end, walked back through the trace
  // (an unmap means the range was mapped before it; a map, that it was not).
  AddressIntervals mapped = doc.end_mapped;
  for (std::size_t i = doc.entries.size(); i-- > 0;) {
    const SnapshotEntry& e = doc.entries[i];
    if (e.action == EntryAction::SegmentUnmap) add_interval(mapped, e.addr, e.addr + e.size);
    if (e.action == EntryAction::SegmentMap) remove_interval(mapped, e.addr, e.addr + e.size);
  }
  for (const auto& [lo, hi] : mapped) {
    start.segments.emplace_back(lo, hi - lo);
    start.expandable_starts.insert(lo);
  }
  return start;
}

}  // namespace ridgescope::detail
