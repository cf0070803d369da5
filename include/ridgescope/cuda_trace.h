// ridgescope/cuda_trace.h — translation of PyTorch CUDA caching-allocator trace entries
// (c10::CachingDeviceAllocator::TraceEntry, delivered to attachAllocatorTraceTracker) into
// ridgescope events (design.md §2, §5). Pure: no torch, no CUDA; the torch adapter
// (csrc/torch/cuda_allocator_source.cpp) copies each TraceEntry's fields into a CudaTraceEntry.
//
// What each action becomes (torch-internals.md §1.2):
//   alloc           -> alloc: bytes = the block's size (memory_allocated() counts it), which the
//                      trace does not carry: recomputed from the requested size with
//                      cuda_rounding.h and, for an unsplit large block, the free block the
//                      allocation took (its start is the address; it ends at the next live or
//                      pending block or the segment's end, since free neighbours are merged).
//   free_requested  -> free (memory_allocated() drops here). The block stays occupied in the
//                      model until free_completed (record_stream may delay the real free).
//   free_completed  -> no event; the block's space becomes free in the model.
//   segment_alloc   -> segment_alloc; segment_free -> segment_free (reserved bytes).
//   segment_map     -> segment_alloc of the mapped range (expandable segments).
//   segment_unmap   -> segment_free of every mapped range it covers, and segment_alloc of the
//                      parts of those ranges that stay mapped, so the ledger's segments always
//                      match what is mapped.
//   oom             -> oom: bytes = the request (rounded, as the allocator records it),
//                      value = the free bytes the device reported.
//   snapshot        -> nothing (counted).
//   anything else   -> nothing (counted in unknown_actions: the action set is open).
//
// Thread-safety: none. One translator serves all devices (state per device) and is used under
// the caller's lock.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ridgescope/cuda_rounding.h"
#include "ridgescope/event.h"

namespace ridgescope {

enum class CudaTraceAction : std::uint8_t {
  Alloc,
  FreeRequested,
  FreeCompleted,
  SegmentAlloc,
  SegmentFree,
  SegmentMap,
  SegmentUnmap,
  Snapshot,
  Oom,
  Unknown,  // an action this build does not know (a newer torch)
};

// The fields of one TraceEntry that matter here, as plain values.
struct CudaTraceEntry {
  CudaTraceAction action = CudaTraceAction::Unknown;
  std::int16_t device = 0;   // CUDA ordinal
  std::uint64_t addr = 0;    // block / segment / mapped-range address; oom: device free bytes
  std::uint64_t size = 0;    // alloc, free_*: requested bytes; segment_*: bytes of the segment or
                             // range; oom: the request's bytes; snapshot: active bytes
  std::uint64_t stream = 0;  // the CUDA stream handle as an integer
};

struct CudaTranslatorStats {
  std::uint64_t entries = 0;                  // trace entries translated
  std::uint64_t unknown_actions = 0;          // entries with an action this build does not know
  std::uint64_t snapshots = 0;                // snapshot entries (no event)
  std::uint64_t unsplit_blocks = 0;           // allocs handed a whole free block (> rounded size)
  std::uint64_t unmatched_frees = 0;          // free_* of an address the model did not hold
  std::uint64_t unmatched_segment_frees = 0;  // segment_free / unmap of an unknown range
  std::uint64_t allocs_outside_segments = 0;  // large allocs in no known segment (rounded size used)
  std::uint64_t internal_errors = 0;          // entries dropped (out of memory in the tables)
};

class CudaTraceTranslator {
 public:
  explicit CudaTraceTranslator(CudaRoundingRules rules = {});
  ~CudaTraceTranslator();
  CudaTraceTranslator(const CudaTraceTranslator&) = delete;
  CudaTraceTranslator& operator=(const CudaTraceTranslator&) = delete;

  // The state that existed before tracking began (from the allocator's snapshot): a segment
  // (or, for expandable segments, a mapped range) and a block inside it. `allocated` false with
  // `occupied` true is a block freed by the caller whose free has not completed. Each appends
  // the events that make a ledger start from this state (segment_alloc; alloc for an allocated
  // block). Blocks are given in address order after their segment.
  void adopt_segment(std::int16_t device, std::uint64_t addr, std::uint64_t bytes,
                     std::uint64_t stream, bool mapped, std::vector<Event>* out);
  void adopt_block(std::int16_t device, std::uint64_t addr, std::uint64_t bytes,
                   std::uint64_t requested_bytes, bool allocated, std::uint64_t stream,
                   std::vector<Event>* out);

  // Appends the events for one entry to *out (zero or more). Never throws: a failure inside is
  // counted in internal_errors and the entry dropped.
  void translate(const CudaTraceEntry& entry, std::vector<Event>* out) noexcept;

  // The model's own totals for a device: bytes of allocated blocks and of reserved memory.
  std::uint64_t allocated_bytes(std::int16_t device) const noexcept;
  std::uint64_t reserved_bytes(std::int16_t device) const noexcept;
  // The block size the model holds for a live or pending block (0 when none).
  std::uint64_t block_bytes(std::int16_t device, std::uint64_t addr) const noexcept;
  // A number unique to the allocation of the block allocated at `addr` now (adopted or
  // translated; numbers grow from 1 over all devices), 0 when no block is allocated there: an
  // address reused by a later allocation gets a new one.
  std::uint64_t block_serial(std::int16_t device, std::uint64_t addr) const noexcept;

  const CudaTranslatorStats& stats() const noexcept { return stats_; }
  const CudaRoundingRules& rules() const noexcept { return rules_; }

 private:
  struct DeviceState;
  DeviceState& state(std::int16_t device);
  const DeviceState* find_state(std::int16_t device) const noexcept;
  void on_alloc(const CudaTraceEntry& e, std::vector<Event>* out);
  void on_free_requested(const CudaTraceEntry& e, std::vector<Event>* out);
  void on_free_completed(const CudaTraceEntry& e, std::vector<Event>* out);
  void on_segment_alloc(const CudaTraceEntry& e, bool mapped, std::vector<Event>* out);
  void on_segment_free(const CudaTraceEntry& e, std::vector<Event>* out);
  void on_segment_unmap(const CudaTraceEntry& e, std::vector<Event>* out);

  CudaRoundingRules rules_;
  std::vector<std::unique_ptr<DeviceState>> devices_;  // indexed by CUDA ordinal
  CudaTranslatorStats stats_;
  std::uint64_t last_serial_ = 0;  // the last Block serial given
};

// The action names of torch's snapshot format ("alloc", "free_requested", ..., "oom"), for
// reports and tests; "unknown" for Unknown.
const char* cuda_trace_action_name(CudaTraceAction action) noexcept;

}  // namespace ridgescope
