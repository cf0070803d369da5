#include "ridgescope/cuda_trace.h"

#include <algorithm>
#include <map>

namespace ridgescope {

struct CudaTraceTranslator::DeviceState {
  struct Range {
    std::uint64_t bytes = 0;
    std::uint64_t stream = 0;
    bool mapped = false;  // a mapped range of an expandable segment
  };
  struct Block {
    std::uint64_t bytes = 0;
    std::uint64_t requested = 0;
    bool allocated = false;  // false: freed by the caller, free not yet completed
    std::uint64_t serial = 0;  // this allocation's (block_serial); an address is reused, a serial never
  };
  std::map<std::uint64_t, Range> segments;  // by address
  std::map<std::uint64_t, Block> blocks;    // allocated or pending blocks, by address
  std::uint64_t allocated = 0;
  std::uint64_t reserved = 0;
};

namespace {

Event make_event(EventKind kind, std::int16_t device, std::uint64_t addr, std::uint64_t bytes,
                 std::uint64_t stream) {
  Event e;
  e.kind = kind;
  e.device = Device{DeviceType::CUDA, device};
  e.addr = addr;
  e.bytes = bytes;
  e.stream = stream;
  return e;
}

}  // namespace

CudaTraceTranslator::CudaTraceTranslator(CudaRoundingRules rules) : rules_(rules) {}
CudaTraceTranslator::~CudaTraceTranslator() = default;

CudaTraceTranslator::DeviceState& CudaTraceTranslator::state(std::int16_t device) {
  const std::size_t index = device < 0 ? 0 : static_cast<std::size_t>(device);
  if (index >= devices_.size()) devices_.resize(index + 1);
  if (!devices_[index]) devices_[index] = std::make_unique<DeviceState>();
  return *devices_[index];
}

const CudaTraceTranslator::DeviceState* CudaTraceTranslator::find_state(
    std::int16_t device) const noexcept {
  const std::size_t index = device < 0 ? 0 : static_cast<std::size_t>(device);
  return index < devices_.size() ? devices_[index].get() : nullptr;
}

std::uint64_t CudaTraceTranslator::allocated_bytes(std::int16_t device) const noexcept {
  const DeviceState* s = find_state(device);
  return s ? s->allocated : 0;
}

std::uint64_t CudaTraceTranslator::reserved_bytes(std::int16_t device) const noexcept {
  const DeviceState* s = find_state(device);
  return s ? s->reserved : 0;
}

std::uint64_t CudaTraceTranslator::block_bytes(std::int16_t device, std::uint64_t addr) const noexcept {
  const DeviceState* s = find_state(device);
  if (s == nullptr) return 0;
  auto it = s->blocks.find(addr);
  return it == s->blocks.end() ? 0 : it->second.bytes;
}

std::uint64_t CudaTraceTranslator::block_serial(std::int16_t device, std::uint64_t addr) const noexcept {
  const DeviceState* s = find_state(device);
  if (s == nullptr) return 0;
  auto it = s->blocks.find(addr);
  return it == s->blocks.end() || !it->second.allocated ? 0 : it->second.serial;
}

void CudaTraceTranslator::adopt_segment(std::int16_t device, std::uint64_t addr,
                                        std::uint64_t bytes, std::uint64_t stream, bool mapped,
                                        std::vector<Event>* out) {
  CudaTraceEntry e;
  e.action = mapped ? CudaTraceAction::SegmentMap : CudaTraceAction::SegmentAlloc;
  e.device = device;
  e.addr = addr;
  e.size = bytes;
  e.stream = stream;
  on_segment_alloc(e, mapped, out);
}

void CudaTraceTranslator::adopt_block(std::int16_t device, std::uint64_t addr, std::uint64_t bytes,
                                      std::uint64_t requested_bytes, bool allocated,
                                      std::uint64_t stream, std::vector<Event>* out) {
  DeviceState& s = state(device);
  auto [it, inserted] = s.blocks.insert_or_assign(
      addr, DeviceState::Block{bytes, requested_bytes, allocated, allocated ? ++last_serial_ : 0});
  (void)it;
  (void)inserted;
  if (!allocated) return;
  s.allocated += bytes;
  Event ev = make_event(EventKind::Alloc, device, addr, bytes, stream);
  ev.requested_bytes = requested_bytes;
  out->push_back(ev);
}

void CudaTraceTranslator::translate(const CudaTraceEntry& entry, std::vector<Event>* out) noexcept {
  ++stats_.entries;
  const std::size_t mark = out->size();
  try {
    switch (entry.action) {
      case CudaTraceAction::Alloc: on_alloc(entry, out); break;
      case CudaTraceAction::FreeRequested: on_free_requested(entry, out); break;
      case CudaTraceAction::FreeCompleted: on_free_completed(entry, out); break;
      case CudaTraceAction::SegmentAlloc: on_segment_alloc(entry, false, out); break;
      case CudaTraceAction::SegmentMap: on_segment_alloc(entry, true, out); break;
      case CudaTraceAction::SegmentFree: on_segment_free(entry, out); break;
      case CudaTraceAction::SegmentUnmap: on_segment_unmap(entry, out); break;
      case CudaTraceAction::Snapshot: ++stats_.snapshots; break;
      case CudaTraceAction::Oom: {
        Event ev = make_event(EventKind::Oom, entry.device, 0, entry.size, entry.stream);
        ev.value = entry.addr;  // the device's free bytes
        out->push_back(ev);
        break;
      }
      case CudaTraceAction::Unknown:
      default: ++stats_.unknown_actions; break;
    }
  } catch (...) {
    // Out of memory in the model's maps: the entry is lost and counted; the events of a
    // half-translated entry are withdrawn so the stream stays consistent with the model.
    out->resize(mark);
    ++stats_.internal_errors;
  }
}

void CudaTraceTranslator::on_alloc(const CudaTraceEntry& e, std::vector<Event>* out) {
  DeviceState& s = state(e.device);
  const std::uint64_t rounded = cuda_round_size(e.size, rules_);
  std::uint64_t bytes = rounded;
  // Only a large block outside expandable segments can be handed out unsplit (bigger than its
  // rounded size); find the free block it took: from its address to the next occupied block or
  // the end of its segment.
  if (!cuda_is_small_pool(rounded) && !rules_.expandable_segments) {
    auto seg = s.segments.upper_bound(e.addr);
    bool inside = false;
    std::uint64_t end = 0;
    if (seg != s.segments.begin()) {
      --seg;
      end = seg->first + seg->second.bytes;
      inside = e.addr < end;
    }
    if (inside) {
      auto next = s.blocks.upper_bound(e.addr);
      if (next != s.blocks.end()) end = std::min(end, next->first);
      bytes = cuda_block_size(e.size, end - e.addr, rules_);
      if (bytes > rounded) ++stats_.unsplit_blocks;
    } else {
      ++stats_.allocs_outside_segments;
    }
  }
  auto it = s.blocks.find(e.addr);
  if (it != s.blocks.end()) {
    // A block the model thought occupied (a missed free): replace it.
    if (it->second.allocated) s.allocated -= it->second.bytes;
    ++stats_.unmatched_frees;
    it->second = DeviceState::Block{bytes, e.size, true, ++last_serial_};
  } else {
    s.blocks.emplace(e.addr, DeviceState::Block{bytes, e.size, true, ++last_serial_});
  }
  s.allocated += bytes;
  Event ev = make_event(EventKind::Alloc, e.device, e.addr, bytes, e.stream);
  ev.requested_bytes = e.size;
  out->push_back(ev);
}

void CudaTraceTranslator::on_free_requested(const CudaTraceEntry& e, std::vector<Event>* out) {
  DeviceState& s = state(e.device);
  auto it = s.blocks.find(e.addr);
  std::uint64_t bytes = 0;
  if (it == s.blocks.end() || !it->second.allocated) {
    ++stats_.unmatched_frees;
    bytes = it == s.blocks.end() ? cuda_round_size(e.size, rules_) : it->second.bytes;
  } else {
    bytes = it->second.bytes;
    it->second.allocated = false;  // occupied until free_completed
    s.allocated -= bytes;
  }
  out->push_back(make_event(EventKind::Free, e.device, e.addr, bytes, e.stream));
}

void CudaTraceTranslator::on_free_completed(const CudaTraceEntry& e, std::vector<Event>* out) {
  DeviceState& s = state(e.device);
  auto it = s.blocks.find(e.addr);
  if (it == s.blocks.end()) {
    ++stats_.unmatched_frees;
    return;
  }
  if (it->second.allocated) {
    // free_requested was missed: the block stopped being allocated all the same.
    ++stats_.unmatched_frees;
    s.allocated -= it->second.bytes;
    out->push_back(make_event(EventKind::Free, e.device, e.addr, it->second.bytes, e.stream));
  }
  s.blocks.erase(it);
}

void CudaTraceTranslator::on_segment_alloc(const CudaTraceEntry& e, bool mapped,
                                           std::vector<Event>* out) {
  DeviceState& s = state(e.device);
  auto it = s.segments.find(e.addr);
  if (it != s.segments.end()) {
    // Reserved twice without a release in between (a missed segment_free): replace it.
    s.reserved -= it->second.bytes;
    out->push_back(make_event(EventKind::SegmentFree, e.device, e.addr, it->second.bytes, it->second.stream));
    s.segments.erase(it);
  }
  s.segments.emplace(e.addr, DeviceState::Range{e.size, e.stream, mapped});
  s.reserved += e.size;
  out->push_back(make_event(EventKind::SegmentAlloc, e.device, e.addr, e.size, e.stream));
}

void CudaTraceTranslator::on_segment_free(const CudaTraceEntry& e, std::vector<Event>* out) {
  DeviceState& s = state(e.device);
  auto it = s.segments.find(e.addr);
  if (it == s.segments.end()) {
    ++stats_.unmatched_segment_frees;
    out->push_back(make_event(EventKind::SegmentFree, e.device, e.addr, e.size, e.stream));
    return;
  }
  const std::uint64_t end = e.addr + it->second.bytes;
  s.reserved -= it->second.bytes;
  out->push_back(make_event(EventKind::SegmentFree, e.device, e.addr, it->second.bytes, e.stream));
  s.segments.erase(it);
  // A released segment holds no block; drop any the model still had (missed frees).
  for (auto b = s.blocks.lower_bound(e.addr); b != s.blocks.end() && b->first < end;) {
    if (b->second.allocated) {
      s.allocated -= b->second.bytes;
      ++stats_.unmatched_frees;
      out->push_back(make_event(EventKind::Free, e.device, b->first, b->second.bytes, e.stream));
    }
    b = s.blocks.erase(b);
  }
}

void CudaTraceTranslator::on_segment_unmap(const CudaTraceEntry& e, std::vector<Event>* out) {
  DeviceState& s = state(e.device);
  const std::uint64_t lo = e.addr;
  const std::uint64_t hi = e.addr + e.size;
  auto it = s.segments.upper_bound(lo);
  if (it != s.segments.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.bytes > lo) it = prev;
  }
  bool any = false;
  while (it != s.segments.end() && it->first < hi) {
    const std::uint64_t start = it->first;
    const DeviceState::Range range = it->second;
    const std::uint64_t end = start + range.bytes;
    if (end <= lo) {
      ++it;
      continue;
    }
    any = true;
    out->push_back(make_event(EventKind::SegmentFree, e.device, start, range.bytes, range.stream));
    s.reserved -= range.bytes;
    it = s.segments.erase(it);
    // What stays mapped on either side of the unmapped range is a range of its own.
    if (start < lo) {
      s.segments.emplace(start, DeviceState::Range{lo - start, range.stream, range.mapped});
      s.reserved += lo - start;
      out->push_back(make_event(EventKind::SegmentAlloc, e.device, start, lo - start, range.stream));
    }
    if (end > hi) {
      it = s.segments.emplace(hi, DeviceState::Range{end - hi, range.stream, range.mapped}).first;
      s.reserved += end - hi;
      out->push_back(make_event(EventKind::SegmentAlloc, e.device, hi, end - hi, range.stream));
      ++it;
    }
  }
  if (!any) ++stats_.unmatched_segment_frees;
}

const char* cuda_trace_action_name(CudaTraceAction action) noexcept {
  switch (action) {
    case CudaTraceAction::Alloc: return "alloc";
    case CudaTraceAction::FreeRequested: return "free_requested";
    case CudaTraceAction::FreeCompleted: return "free_completed";
    case CudaTraceAction::SegmentAlloc: return "segment_alloc";
    case CudaTraceAction::SegmentFree: return "segment_free";
    case CudaTraceAction::SegmentMap: return "segment_map";
    case CudaTraceAction::SegmentUnmap: return "segment_unmap";
    case CudaTraceAction::Snapshot: return "snapshot";
    case CudaTraceAction::Oom: return "oom";
    case CudaTraceAction::Unknown: break;
  }
  return "unknown";
}

}  // namespace ridgescope
