// caching_allocator.h — the state of the CUDA caching allocator model (internal to the
// allocator layer; the public API is ridgescope/allocator_model.h): blocks chained to their
// segment neighbours, per-pool free sets ordered by (stream, size, address), segments at
// synthetic addresses, and AllocatorModel::Impl, whose operations are defined by concept:
// caching_allocator_model.cpp (malloc, free, splitting and merging, the segment view),
// expandable_segments.cpp (mapping and unmapping pages), cache_release.cpp (cudaFree of cached
// segments: release-and-retry, empty_cache, garbage collection). The structure follows torch's
// DeviceCachingAllocator (c10/cuda/CUDACachingAllocator.cpp) rule by rule.
//
// Thread-safety: none; an Impl belongs to one AllocatorModel, used from one thread at a time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ridgescope/allocator_model.h"

namespace ridgescope {
namespace detail::caching {

inline constexpr std::uint64_t kNoLimit = std::numeric_limits<std::uint64_t>::max();
// Address space given to one expandable segment when no capacity is set (torch reserves
// 1 1/8 of the device's memory).
inline constexpr std::uint64_t kUnlimitedVaBytes = 1ull << 40;
// Alignment of the synthetic segment addresses (cudaMalloc returns 2 MiB-aligned ranges for
// the sizes the allocator asks for).
inline constexpr std::uint64_t kVaAlignment = 2ull << 20;
// Requests above this (1 EiB) fail as out of memory, as cudaMalloc would on any device: it
// keeps every rounding and address sum below 2^64.
inline constexpr std::uint64_t kMaxRequestBytes = 1ull << 60;

inline std::uint64_t round_up(std::uint64_t v, std::uint64_t m) { return (v + m - 1) / m * m; }

struct Segment;
struct Pool;

struct Block {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t requested = 0;
  std::uint64_t stream = 0;
  Block* prev = nullptr;
  Block* next = nullptr;
  Segment* segment = nullptr;
  Pool* pool = nullptr;
  std::int64_t gc_count_base = 0;
  bool allocated = false;
  bool mapped = true;
  bool is_split() const { return prev != nullptr || next != nullptr; }
  bool expandable() const;
};

struct Segment {
  std::uint64_t base = 0;
  std::uint64_t size = 0;       // cudaMalloc size; expandable: the address space
  std::uint64_t page = 0;       // expandable: the mapping granularity
  std::uint64_t stream = 0;
  bool small = false;
  bool expandable = false;
};

inline bool Block::expandable() const { return segment->expandable; }

struct BySize {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->addr < b->addr;
  }
};
struct ByAddress {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    return a->addr < b->addr;
  }
};

struct Pool {
  explicit Pool(bool s) : small(s) {}
  bool small;
  std::set<Block*, BySize> blocks;       // free, mapped
  std::set<Block*, ByAddress> unmapped;  // expandable address space not backed by pages
  std::int64_t get_free_blocks_call_count = 0;
  void insert(Block* b) {
    b->gc_count_base = get_free_blocks_call_count;
    blocks.insert(b);
  }
};

}  // namespace detail::caching

struct AllocatorModel::Impl {
  using Block = detail::caching::Block;
  using Segment = detail::caching::Segment;
  using Pool = detail::caching::Pool;

  explicit Impl(AllocatorSettings s)
      : settings(std::move(s)),
        rules(allocator_rounding_rules(settings)),
        max_split(rules.max_split_size) {
    if (settings.large_segment_bytes == 0) settings.large_segment_bytes = kAllocLargeBuffer;
    if (settings.capacity_bytes != 0 && settings.per_process_memory_fraction > 0) {
      allowed_max = static_cast<std::uint64_t>(settings.per_process_memory_fraction *
                                               static_cast<double>(settings.capacity_bytes));
      fraction_set = true;
    }
    gc_enabled = fraction_set && settings.garbage_collection_threshold > 0;
  }
  ~Impl() {
    for (auto& [id, b] : live) delete b;
    for (Pool* p : {&small, &large}) {
      for (Block* b : p->blocks) delete b;
      for (Block* b : p->unmapped) delete b;
    }
  }

  AllocatorSettings settings;
  CudaRoundingRules rules;
  std::uint64_t max_split;
  std::uint64_t allowed_max = 0;
  bool fraction_set = false;
  bool gc_enabled = false;

  Pool small{true};
  Pool large{false};
  absl::flat_hash_map<std::uint64_t, Block*> live;  // alloc_id -> block (nullptr: 0 bytes)
  std::map<std::uint64_t, std::unique_ptr<Segment>> segments;  // by base address
  std::uint64_t next_va = kModelBaseAddress;
  std::uint64_t segment_hint = 0;  // where the next new segment goes (0: synthetic)

  AllocatorStats st;
  bool record_events = false;
  std::vector<AllocatorSegmentEvent> events;

  // Per-call scratch for the result.
  std::uint64_t call_segment_bytes = 0;
  std::uint64_t call_released_bytes = 0;

  // --- helpers -----------------------------------------------------------------------------
  Pool& pool_for(std::uint64_t size) { return cuda_is_small_pool(size) ? small : large; }

  void add_reserved(const Block* b, std::uint64_t bytes) {
    st.reserved_bytes += bytes;
    (b->pool->small ? st.small_reserved_bytes : st.large_reserved_bytes) += bytes;
    st.peak_reserved_bytes = std::max(st.peak_reserved_bytes, st.reserved_bytes);
    call_segment_bytes += bytes;
  }
  void sub_reserved(const Block* b, std::uint64_t bytes) {
    st.reserved_bytes -= bytes;
    (b->pool->small ? st.small_reserved_bytes : st.large_reserved_bytes) -= bytes;
    call_released_bytes += bytes;
  }
  void event(AllocatorSegmentEvent::Kind kind, std::uint64_t addr, std::uint64_t bytes,
             std::uint64_t stream) {
    if (!record_events) return;
    events.push_back({kind, addr, bytes, stream, st.reserved_bytes});
  }
  bool device_has_room(std::uint64_t bytes) const {
    return settings.capacity_bytes == 0 || st.reserved_bytes + bytes <= settings.capacity_bytes;
  }
  // The address of a new segment of `bytes`: the hinted (recorded) one when it overlaps no
  // live segment, else the next synthetic one. Synthetic addresses stay above every segment.
  std::uint64_t take_va(std::uint64_t bytes) {
    std::uint64_t addr = next_va;
    if (segment_hint != 0 && !overlaps(segment_hint, bytes)) addr = segment_hint;
    segment_hint = 0;
    next_va = std::max(next_va, detail::caching::round_up(addr + bytes, detail::caching::kVaAlignment));
    return addr;
  }
  bool overlaps(std::uint64_t addr, std::uint64_t bytes) const {
    if (addr > detail::caching::kNoLimit - bytes) return true;
    auto it = segments.lower_bound(addr + bytes);  // first segment starting at or after the end
    if (it == segments.begin()) return false;
    --it;
    return it->first + it->second->size > addr;
  }
  bool should_split(const Block* b, std::uint64_t size) const {
    return cuda_should_split(b->size, size, rules);
  }
  static bool releasable(const Block* b) { return !b->is_split() && !b->expandable(); }

  // --- caching_allocator_model.cpp -------------------------------------------------------------
  // try_merge_blocks: folds `src` into `dst` when it is a free neighbour in the same mapping
  // state. Returns the bytes subsumed.
  std::uint64_t try_merge(Block* dst, Block* src);
  // get_free_block: best fit from the cached blocks of the request's stream.
  Block* get_free_block(Pool& pool, std::uint64_t size, std::uint64_t stream);
  // A new segment of `bytes` at the next address, as one free block (the caller accounts for
  // it). `page` 0: a cudaMalloc segment, its block mapped; else an expandable segment of that
  // page size, its block unmapped address space.
  Block* new_segment(Pool& pool, std::uint64_t bytes, std::uint64_t stream, std::uint64_t page);
  // alloc_block: a new segment (cudaMalloc) or new pages of an expandable segment.
  Block* alloc_block(Pool& pool, std::uint64_t size, std::uint64_t alloc_size, std::uint64_t stream,
                     bool is_retry);
  // Hands out `b` for a rounded `size`, splitting off the rest when should_split says so.
  Block* alloc_found_block(Block* b, Pool& pool, std::uint64_t size, std::uint64_t requested,
                           std::uint64_t stream);
  void free_block(Block* b);
  MallocResult malloc(std::uint64_t id, std::uint64_t requested, std::uint64_t stream);
  MallocResult malloc_inner(std::uint64_t id, std::uint64_t requested, std::uint64_t stream);
  bool free(std::uint64_t id);
  // All blocks grouped by segment, in address order.
  std::vector<AllocatorSegmentInfo> snapshot() const;
  std::uint64_t count_segments() const;

  // --- expandable_segments.cpp -----------------------------------------------------------------
  Block* find_expandable_block(Pool& pool, std::uint64_t size, std::uint64_t stream);
  bool map_block(Block* to_map, std::uint64_t size);
  Block* try_allocate_expandable(Pool& pool, std::uint64_t size, std::uint64_t stream);
  // unmap_block: returns the whole pages inside a free expandable block to the device.
  void unmap_block(Block* b);
  void release_expandable_segment(Block* b);

  // --- cache_release.cpp -----------------------------------------------------------------------
  // release_block: cudaFree of a wholly free, unsplit, non-expandable segment.
  void release_block(Block* b);
  // release_available_cached_blocks: frees oversize cached blocks, enough for the request.
  bool release_available(Pool& pool, std::uint64_t size, std::uint64_t stream);
  void release_blocks(Pool& pool);
  bool release_cached();
  // garbage_collect_cached_blocks: frees the least recently reused unsplit large blocks once
  // reserved memory passes threshold * allowed maximum.
  void garbage_collect();
  std::uint64_t empty_cache();
  std::uint64_t release_at(std::uint64_t address);
};

}  // namespace ridgescope
