// ridgescope/allocator_model.h — a model of PyTorch's CUDA caching allocator (the "native"
// backend of c10/cuda/CUDACachingAllocator.cpp) that turns a sequence of allocation requests
// and frees into the blocks, segments, allocated and reserved bytes the real allocator would
// have, without a GPU. It is what `ridgescope fit` / `rs.estimate` use to predict reserved
// memory, and what `ridgescope whatif` uses to replay a recorded run under other settings
// ("what if I set expandable_segments:True on this run?").
//
// Modelled exactly (the rules of torch's DeviceCachingAllocator, see docs/fit.md "The
// allocator model"): round_size (512-byte blocks, roundup_power2_divisions; the rules of
// cuda_rounding.h), the small (<= 1 MiB) and large pools, segment sizes (get_allocation_size: 2 MiB small buffers, a
// 20 MiB buffer for 1-10 MiB requests, 2 MiB rounding above 10 MiB), best-fit search ordered
// by (stream, size, address), should_split, max_split_size and max_non_split_rounding,
// merging of free neighbours, per-stream pools, release_available_cached_blocks and
// release_cached_blocks with retry when the capacity is exhausted, garbage_collection_threshold
// (active only with a memory fraction, as in torch), expandable segments (one segment per
// stream and pool mapped in 2 MiB / 20 MiB pages), empty_cache.
// Not modelled: cross-stream uses (record_stream events delay a free; here a free is
// immediate), CUDA graph private pools / MemPool, the free-memory callbacks. Addresses are
// synthetic and deterministic (segments laid out upwards from kModelBaseAddress in creation
// order, never reused), so a tie between equal-size free blocks in different segments is
// broken by creation order where torch breaks it by the driver's address, unless the recorded
// addresses are given (hint_next_segment_address, AllocatorAction::Kind::SegmentHint). A
// recorded run's releases can be replayed one by one (release_cached_segment).
//
// The settings it runs under, their parser and the rules they imply are in
// allocator_settings.h (included here).
//
// Errors: malloc/free never throw: failure is reported in the result. A request
// above 1 EiB, or with expandable segments one larger than the segment's address space (1 1/8
// of capacity_bytes; of 1 TiB when no capacity is set), fails as OutOfMemory, as on a device.
//
// Thread-safety: an AllocatorModel is not synchronised; use one from one thread at a time
// (the real allocator's lock is not modelled because replay is sequential). The free functions
// are thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ridgescope/allocator_settings.h"
#include "ridgescope/cuda_rounding.h"

namespace ridgescope {

inline constexpr std::uint64_t kModelBaseAddress = 0x7f0000000000ull;  // first synthetic address

enum class MallocStatus : std::uint8_t {
  Ok = 0,
  OutOfMemory = 1,  // no cached block, and the capacity could not hold a new segment
  DuplicateId = 2,  // alloc_id is already live (the request is ignored)
};

struct MallocResult {
  MallocStatus status = MallocStatus::Ok;
  std::uint64_t requested_bytes = 0;
  std::uint64_t block_bytes = 0;     // rounded block size handed out (0 for a 0-byte request)
  std::uint64_t address = 0;         // synthetic block address (0 for a 0-byte request)
  std::uint64_t segment_bytes = 0;   // bytes newly reserved by this call (segment or pages)
  std::uint64_t released_bytes = 0;  // cached bytes released to make room (retry path, gc)
  bool segment_created = false;      // a new segment was reserved or pages were mapped
  bool small_pool = false;
  bool ok() const noexcept { return status == MallocStatus::Ok; }
};

// One segment change, as torch's trace would record it (segment_alloc / segment_free, or
// segment_map / segment_unmap with expandable segments).
struct AllocatorSegmentEvent {
  enum class Kind : std::uint8_t { Alloc, Free, Map, Unmap };
  Kind kind = Kind::Alloc;
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  std::uint64_t stream = 0;
  std::uint64_t reserved_after = 0;  // reserved bytes once this change is applied
};
std::string_view allocator_segment_event_name(AllocatorSegmentEvent::Kind kind) noexcept;

struct AllocatorBlockInfo {
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  std::uint64_t requested_bytes = 0;  // 0 when free
  bool allocated = false;
};

// One segment as torch.cuda.memory_snapshot() lists it (for expandable segments: one entry
// per contiguous mapped range).
struct AllocatorSegmentInfo {
  std::uint64_t address = 0;
  std::uint64_t total_bytes = 0;
  std::uint64_t allocated_bytes = 0;
  std::uint64_t requested_bytes = 0;
  std::uint64_t stream = 0;
  bool is_large = false;
  bool is_expandable = false;
  std::vector<AllocatorBlockInfo> blocks;  // in address order
};

// Counters, all bytes unless named *_count. Peaks are since construction or reset_peaks().
struct AllocatorStats {
  std::uint64_t allocated_bytes = 0;   // sum of live block sizes (torch: allocated_bytes)
  std::uint64_t requested_bytes = 0;   // sum of live requests (torch: requested_bytes)
  std::uint64_t reserved_bytes = 0;    // segments and mapped pages (torch: reserved_bytes)
  std::uint64_t peak_allocated_bytes = 0;
  std::uint64_t peak_reserved_bytes = 0;
  std::uint64_t peak_requested_bytes = 0;
  std::uint64_t small_allocated_bytes = 0;
  std::uint64_t large_allocated_bytes = 0;
  std::uint64_t small_reserved_bytes = 0;
  std::uint64_t large_reserved_bytes = 0;
  std::uint64_t inactive_split_bytes = 0;  // free blocks inside split segments (not expandable)
  std::uint64_t inactive_split_count = 0;
  std::uint64_t largest_free_small_bytes = 0;  // largest cached free block, small pool
  std::uint64_t largest_free_large_bytes = 0;  // largest cached free block, large pool
  std::uint64_t active_count = 0;              // live allocations
  std::uint64_t segment_count = 0;             // as a snapshot lists them (see segments())
  std::uint64_t device_alloc_count = 0;        // cudaMalloc / page maps (num_device_alloc)
  std::uint64_t device_free_count = 0;         // cudaFree / unmaps (num_device_free)
  std::uint64_t alloc_retries = 0;             // num_alloc_retries
  std::uint64_t oom_count = 0;                 // num_ooms
};

class AllocatorModel {
 public:
  explicit AllocatorModel(AllocatorSettings settings = {});
  ~AllocatorModel();
  AllocatorModel(const AllocatorModel&) = delete;
  AllocatorModel& operator=(const AllocatorModel&) = delete;
  AllocatorModel(AllocatorModel&&) noexcept;
  AllocatorModel& operator=(AllocatorModel&&) noexcept;

  // Requests `requested_bytes` on `stream` for the caller's `alloc_id` (any unique number,
  // e.g. a trace address). Never throws.
  MallocResult malloc(std::uint64_t alloc_id, std::uint64_t requested_bytes,
                      std::uint64_t stream = 0) noexcept;
  // Frees a live allocation; returns false (and changes nothing) for an unknown id.
  bool free(std::uint64_t alloc_id) noexcept;
  // torch.cuda.empty_cache(): releases every cached segment that is wholly free (and unmaps
  // the free pages of expandable segments). Returns the bytes released.
  std::uint64_t empty_cache() noexcept;
  void reset_peaks() noexcept;

  std::uint64_t allocated_bytes() const noexcept;
  std::uint64_t reserved_bytes() const noexcept;
  std::uint64_t peak_allocated_bytes() const noexcept;
  std::uint64_t peak_reserved_bytes() const noexcept;
  std::uint64_t segment_count() const noexcept;
  AllocatorStats stats() const;
  // The segments, sorted by address (like torch.cuda.memory_snapshot()["segments"]).
  std::vector<AllocatorSegmentInfo> segments() const;
  // The block handed to a live id, or nullptr-equivalent (bytes == 0) if unknown.
  AllocatorBlockInfo block_of(std::uint64_t alloc_id) const noexcept;
  const AllocatorSettings& settings() const noexcept;

  // Places the next segment this model creates (cudaMalloc, or a new expandable segment) at
  // `address`, the address the real allocator recorded, if that overlaps no live segment; the
  // hint expires with the next malloc. Replaying a snapshot with its segment addresses makes
  // best-fit ties between equal free blocks fall as they fell in the recorded run.
  void hint_next_segment_address(std::uint64_t address) noexcept;

  // Releases what torch releases for a cached block starting at `address`: a wholly free,
  // unsplit segment is freed (cudaFree); in an expandable segment, the whole free pages of the
  // free block at `address` are unmapped. Returns the bytes released (0: nothing there is
  // releasable). Used to replay a recorded run's releases one by one.
  std::uint64_t release_cached_segment(std::uint64_t address) noexcept;

  // Segment events are kept only when enabled (replay of a snapshot compares them).
  void record_segment_events(bool enabled) noexcept;
  const std::vector<AllocatorSegmentEvent>& segment_events() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// --- Replay ------------------------------------------------------------------------------

// One allocator action of a recorded run: a ridgescope trace's alloc/free events, or the
// alloc / free_completed entries of a torch memory snapshot's device_traces (segment entries
// are the reference the model's own segment events are compared with; they are not fed in).
struct AllocatorAction {
  // SegmentHint: the recorded run reserved a segment at `address` here (a snapshot's
  // segment_alloc, or the first segment_map of an expandable segment): see
  // AllocatorModel::hint_next_segment_address. It changes no bytes.
  // ReleaseSegment: the recorded run released the cached segment (or unmapped the free pages)
  // at `address` here, whatever the cause (empty_cache, release-and-retry, garbage
  // collection): see AllocatorModel::release_cached_segment.
  enum class Kind : std::uint8_t { Alloc, Free, EmptyCache, SegmentHint, ReleaseSegment };
  Kind kind = Kind::Alloc;
  std::uint64_t address = 0;  // the recorded block address: identifies the allocation
  std::uint64_t bytes = 0;    // alloc: the requested bytes
  std::uint64_t stream = 0;
  std::uint64_t time_ns = 0;
};

struct ReplayPoint {
  std::uint64_t index = 0;    // first action of the bucket (0-based)
  std::uint64_t time_ns = 0;  // time of that action
  std::uint64_t allocated_bytes = 0;  // highest in the bucket
  std::uint64_t reserved_bytes = 0;   // highest in the bucket
};

struct ReplayOptions {
  // Timeline resolution: at most this many points (buckets of consecutive actions, each with
  // its highest allocated and reserved bytes); 0 = one point per action.
  std::size_t timeline_points = 512;
  // Trace replay: which device's events to use. -2 = the first CUDA device seen, else the
  // CPU; -1 = the CPU; n >= 0 = cuda:n.
  int device = -2;
  bool keep_segment_events = false;  // copy the model's segment events into the result
  // Trace replay: place the model's segments at the trace's SegmentAlloc addresses and
  // release them at its SegmentFree events (use when replaying with the settings the run had,
  // to reproduce it; not for a what-if).
  bool use_recorded_segment_addresses = false;
};

struct ReplayResult {
  AllocatorSettings settings;
  std::uint64_t actions = 0;
  std::uint64_t allocs = 0;
  std::uint64_t frees = 0;
  std::uint64_t unmatched_frees = 0;  // frees of blocks allocated before the recording began
  std::uint64_t duplicate_allocs = 0;  // allocs of a live address (its free was not recorded)
  std::uint64_t failed_allocs = 0;    // requests the model could not serve (capacity)
  std::uint64_t first_failure_index = 0;  // action index of the first one (if any)
  std::uint64_t recorded_peak_bytes = 0;  // peak of the recorded block bytes (trace replay)
  AllocatorStats final_stats;             // includes peaks
  std::uint64_t peak_allocated_time_ns = 0;
  std::uint64_t peak_reserved_time_ns = 0;
  std::vector<ReplayPoint> timeline;
  std::vector<AllocatorSegmentEvent> segment_events;  // with keep_segment_events
  bool truncated = false;   // the trace ended in a torn chunk (replayed up to it)
  std::string problem;      // why, if truncated
};

// Replays actions through a fresh model. Never throws for bad sequences (double frees and
// unknown frees are counted).
ReplayResult replay_allocator_actions(const std::vector<AllocatorAction>& actions,
                                      const AllocatorSettings& settings,
                                      const ReplayOptions& options = {});

// Replays a ridgescope trace's alloc/free events (one device, see ReplayOptions::device)
// through a fresh model. The request is the event's requested_bytes (its bytes where the
// source records no request). A run of recorded segment releases that no segment allocation
// follows (so not a release-and-retry) replays as empty_cache(); with
// use_recorded_segment_addresses every recorded release replays at its address instead.
// Throws TraceError for a file that is not a trace.
ReplayResult replay_trace_through_allocator(const std::string& trace_path,
                                            const AllocatorSettings& settings,
                                            const ReplayOptions& options = {});

}  // namespace ridgescope
