// caching_allocator_model.cpp — the CUDA caching allocator model (see
// include/ridgescope/allocator_model.h and docs/fit.md "The allocator model"): malloc and free,
// best fit, splitting and merging of blocks, the segment view, and the public AllocatorModel
// API. Expandable segments and the release of cached segments are in expandable_segments.cpp
// and cache_release.cpp; the state they share is caching_allocator.h.
#include <algorithm>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

#include "caching_allocator.h"
#include "ridgescope/allocator_model.h"

namespace ridgescope {

using detail::caching::Block;
using detail::caching::kMaxRequestBytes;
using detail::caching::Pool;
using detail::caching::Segment;

std::string_view allocator_segment_event_name(AllocatorSegmentEvent::Kind kind) noexcept {
  switch (kind) {
    case AllocatorSegmentEvent::Kind::Alloc: return "segment_alloc";
    case AllocatorSegmentEvent::Kind::Free: return "segment_free";
    case AllocatorSegmentEvent::Kind::Map: return "segment_map";
    case AllocatorSegmentEvent::Kind::Unmap: return "segment_unmap";
  }
  return "segment_unknown";
}

std::uint64_t AllocatorModel::Impl::try_merge(Block* dst, Block* src) {
  if (!src || src->allocated || dst->mapped != src->mapped) return 0;
  if (dst->prev == src) {
    dst->addr = src->addr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
  } else {
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  const std::uint64_t subsumed = src->size;
  dst->size += subsumed;
  if (src->mapped) {
    src->pool->blocks.erase(src);
  } else {
    src->pool->unmapped.erase(src);
  }
  delete src;
  return subsumed;
}

Block* AllocatorModel::Impl::get_free_block(Pool& pool, std::uint64_t size, std::uint64_t stream) {
  if (gc_enabled) ++pool.get_free_blocks_call_count;
  Block key;
  key.stream = stream;
  key.size = size;
  key.addr = 0;
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream != stream) return nullptr;
  if ((*it)->expandable()) {
    // The expandable block that can grow the least beyond its size is the best fit.
    auto expandable_size = [](const Block* b) {
      return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
    };
    auto next = std::next(it);
    while ((*it)->expandable() && next != pool.blocks.end() && (*next)->stream == stream &&
           expandable_size(*next) < expandable_size(*it)) {
      it = next++;
    }
  }
  if (size < max_split && (*it)->size >= max_split) return nullptr;
  if (size >= max_split && (*it)->size >= size + settings.max_non_split_rounding_bytes) {
    return nullptr;
  }
  Block* b = *it;
  pool.blocks.erase(it);
  return b;
}

Block* AllocatorModel::Impl::alloc_block(Pool& pool, std::uint64_t size, std::uint64_t alloc_size,
                                         std::uint64_t stream, bool is_retry) {
  if (is_retry) ++st.alloc_retries;
  if (fraction_set && st.reserved_bytes + alloc_size > allowed_max) return nullptr;
  if (settings.expandable_segments) return try_allocate_expandable(pool, size, stream);
  if (!device_has_room(alloc_size)) return nullptr;
  Block* b = new_segment(pool, alloc_size, stream, /*page=*/0);
  ++st.device_alloc_count;
  add_reserved(b, alloc_size);
  event(AllocatorSegmentEvent::Kind::Alloc, b->addr, alloc_size, stream);
  return b;
}

Block* AllocatorModel::Impl::new_segment(Pool& pool, std::uint64_t bytes, std::uint64_t stream,
                                         std::uint64_t page) {
  auto seg = std::make_unique<Segment>();
  seg->base = take_va(bytes);
  seg->size = bytes;
  seg->page = page;
  seg->stream = stream;
  seg->small = pool.small;
  seg->expandable = page != 0;
  auto* b = new Block;
  b->addr = seg->base;
  b->size = bytes;
  b->stream = stream;
  b->segment = seg.get();
  b->pool = &pool;
  b->mapped = !seg->expandable;
  segments.emplace(seg->base, std::move(seg));
  return b;
}

Block* AllocatorModel::Impl::alloc_found_block(Block* b, Pool& pool, std::uint64_t size,
                                               std::uint64_t requested, std::uint64_t stream) {
  const bool already_split = b->is_split();
  const bool track_split = !b->expandable();
  if (should_split(b, size)) {
    Block* rest = b;
    b = new Block;
    b->addr = rest->addr;
    b->size = size;
    b->stream = stream;
    b->segment = rest->segment;
    b->pool = &pool;
    b->prev = rest->prev;
    if (b->prev) b->prev->next = b;
    b->next = rest;
    rest->prev = b;
    rest->addr += size;
    rest->size -= size;
    pool.insert(rest);
    if (track_split) {
      if (already_split) {
        st.inactive_split_bytes -= size;
      } else {
        st.inactive_split_bytes += rest->size;
        ++st.inactive_split_count;
      }
    }
  } else if (already_split && track_split) {
    st.inactive_split_bytes -= b->size;
    --st.inactive_split_count;
  }
  b->allocated = true;
  b->requested = requested;
  st.allocated_bytes += b->size;
  st.requested_bytes += requested;
  (pool.small ? st.small_allocated_bytes : st.large_allocated_bytes) += b->size;
  ++st.active_count;
  st.peak_allocated_bytes = std::max(st.peak_allocated_bytes, st.allocated_bytes);
  st.peak_requested_bytes = std::max(st.peak_requested_bytes, st.requested_bytes);
  return b;
}

void AllocatorModel::Impl::free_block(Block* b) {
  Pool& pool = *b->pool;
  b->allocated = false;
  st.allocated_bytes -= b->size;
  st.requested_bytes -= b->requested;
  (pool.small ? st.small_allocated_bytes : st.large_allocated_bytes) -= b->size;
  --st.active_count;
  b->requested = 0;
  std::int64_t net_blocks = 0;
  std::int64_t net_bytes = 0;
  for (Block* candidate : {b->prev, b->next}) {
    const std::uint64_t subsumed = try_merge(b, candidate);
    if (subsumed > 0) {
      net_blocks -= 1;
      net_bytes -= static_cast<std::int64_t>(subsumed);
    }
  }
  pool.insert(b);
  if (b->is_split()) {
    net_blocks += 1;
    net_bytes += static_cast<std::int64_t>(b->size);
  }
  if (!b->expandable()) {
    st.inactive_split_count =
        static_cast<std::uint64_t>(static_cast<std::int64_t>(st.inactive_split_count) + net_blocks);
    st.inactive_split_bytes =
        static_cast<std::uint64_t>(static_cast<std::int64_t>(st.inactive_split_bytes) + net_bytes);
  }
}

MallocResult AllocatorModel::Impl::malloc(std::uint64_t id, std::uint64_t requested, std::uint64_t stream) {
  MallocResult r = malloc_inner(id, requested, stream);
  segment_hint = 0;  // a hint serves only the request right after it
  return r;
}

MallocResult AllocatorModel::Impl::malloc_inner(std::uint64_t id, std::uint64_t requested,
                                                std::uint64_t stream) {
  MallocResult r;
  r.requested_bytes = requested;
  if (live.contains(id)) {
    r.status = MallocStatus::DuplicateId;
    return r;
  }
  if (requested == 0) {  // torch hands out a null pointer without touching the pools
    live.emplace(id, nullptr);
    return r;
  }
  call_segment_bytes = 0;
  call_released_bytes = 0;
  if (requested > kMaxRequestBytes) {  // no device has it; rounding it would wrap past 2^64
    ++st.oom_count;
    r.status = MallocStatus::OutOfMemory;
    return r;
  }
  const std::uint64_t size = cuda_round_size(requested, rules);
  Pool& pool = pool_for(size);
  const std::uint64_t alloc_size = allocator_segment_size(size, settings);
  r.small_pool = pool.small;
  Block* b = get_free_block(pool, size, stream);
  if (!b) {
    if (gc_enabled) garbage_collect();
    b = alloc_block(pool, size, alloc_size, stream, false);
    if (!b && release_available(pool, size, stream)) {
      b = alloc_block(pool, size, alloc_size, stream, false);
    }
    if (!b && release_cached()) b = alloc_block(pool, size, alloc_size, stream, true);
  }
  r.segment_bytes = call_segment_bytes;
  r.released_bytes = call_released_bytes;
  r.segment_created = call_segment_bytes > 0;
  if (!b) {
    ++st.oom_count;
    r.status = MallocStatus::OutOfMemory;
    return r;
  }
  b = alloc_found_block(b, pool, size, requested, stream);
  live.emplace(id, b);
  r.block_bytes = b->size;
  r.address = b->addr;
  return r;
}

bool AllocatorModel::Impl::free(std::uint64_t id) {
  auto it = live.find(id);
  if (it == live.end()) return false;
  Block* b = it->second;
  live.erase(it);
  if (b) free_block(b);
  return true;
}

std::vector<AllocatorSegmentInfo> AllocatorModel::Impl::snapshot() const {
  std::vector<const Block*> all;
  all.reserve(live.size() + small.blocks.size() + large.blocks.size());
  for (const auto& [id, b] : live) {
    if (b) all.push_back(b);
  }
  for (const Pool* p : {&small, &large}) {
    all.insert(all.end(), p->blocks.begin(), p->blocks.end());
    all.insert(all.end(), p->unmapped.begin(), p->unmapped.end());
  }
  std::sort(all.begin(), all.end(),
            [](const Block* a, const Block* b) { return a->addr < b->addr; });
  std::vector<AllocatorSegmentInfo> out;
  const Block* prev = nullptr;
  for (const Block* b : all) {
    if (!b->mapped) {
      prev = b;
      continue;
    }
    // A new snapshot segment starts at a segment head or after an unmapped range.
    if (!prev || prev->segment != b->segment || !prev->mapped || b->prev == nullptr) {
      AllocatorSegmentInfo s;
      s.address = b->addr;
      s.stream = b->stream;
      s.is_large = !b->pool->small;
      s.is_expandable = b->expandable();
      out.push_back(std::move(s));
    }
    AllocatorSegmentInfo& s = out.back();
    s.blocks.push_back({b->addr, b->size, b->requested, b->allocated});
    s.total_bytes += b->size;
    if (b->allocated) {
      s.allocated_bytes += b->size;
      s.requested_bytes += b->requested;
    }
    prev = b;
  }
  return out;
}

std::uint64_t AllocatorModel::Impl::count_segments() const {
  std::uint64_t n = 0;
  for (const auto& [base, seg] : segments) {
    if (!seg->expandable) ++n;
  }
  // Expandable segments: one per contiguous mapped range, as the snapshot lists them.
  auto run_start = [](const Block* b) {
    return b->expandable() && b->mapped && (!b->prev || !b->prev->mapped);
  };
  for (const Pool* p : {&small, &large}) {
    for (const Block* b : p->blocks) n += run_start(b) ? 1 : 0;
  }
  for (const auto& [id, b] : live) n += (b && run_start(b)) ? 1 : 0;
  return n;
}

AllocatorModel::AllocatorModel(AllocatorSettings settings)
    : impl_(std::make_unique<Impl>(std::move(settings))) {}
AllocatorModel::~AllocatorModel() = default;
AllocatorModel::AllocatorModel(AllocatorModel&&) noexcept = default;
AllocatorModel& AllocatorModel::operator=(AllocatorModel&&) noexcept = default;

MallocResult AllocatorModel::malloc(std::uint64_t alloc_id, std::uint64_t requested_bytes,
                                    std::uint64_t stream) noexcept {
  try {
    return impl_->malloc(alloc_id, requested_bytes, stream);
  } catch (...) {  // std::bad_alloc of the model's own bookkeeping
    MallocResult r;
    r.status = MallocStatus::OutOfMemory;
    r.requested_bytes = requested_bytes;
    return r;
  }
}
bool AllocatorModel::free(std::uint64_t alloc_id) noexcept {
  try {
    return impl_->free(alloc_id);
  } catch (...) {
    return false;
  }
}
std::uint64_t AllocatorModel::empty_cache() noexcept {
  try {
    return impl_->empty_cache();
  } catch (...) {
    return 0;
  }
}
void AllocatorModel::reset_peaks() noexcept {
  impl_->st.peak_allocated_bytes = impl_->st.allocated_bytes;
  impl_->st.peak_reserved_bytes = impl_->st.reserved_bytes;
  impl_->st.peak_requested_bytes = impl_->st.requested_bytes;
}
std::uint64_t AllocatorModel::allocated_bytes() const noexcept { return impl_->st.allocated_bytes; }
std::uint64_t AllocatorModel::reserved_bytes() const noexcept { return impl_->st.reserved_bytes; }
std::uint64_t AllocatorModel::peak_allocated_bytes() const noexcept {
  return impl_->st.peak_allocated_bytes;
}
std::uint64_t AllocatorModel::peak_reserved_bytes() const noexcept {
  return impl_->st.peak_reserved_bytes;
}
std::uint64_t AllocatorModel::segment_count() const noexcept { return impl_->count_segments(); }

AllocatorStats AllocatorModel::stats() const {
  AllocatorStats s = impl_->st;
  s.segment_count = impl_->count_segments();
  for (const Pool* p : {&impl_->small, &impl_->large}) {
    std::uint64_t largest = 0;
    for (const Block* b : p->blocks) largest = std::max(largest, b->size);
    (p->small ? s.largest_free_small_bytes : s.largest_free_large_bytes) = largest;
  }
  return s;
}
std::vector<AllocatorSegmentInfo> AllocatorModel::segments() const { return impl_->snapshot(); }
AllocatorBlockInfo AllocatorModel::block_of(std::uint64_t alloc_id) const noexcept {
  auto it = impl_->live.find(alloc_id);
  if (it == impl_->live.end() || !it->second) return {};
  const Block* b = it->second;
  return {b->addr, b->size, b->requested, true};
}
const AllocatorSettings& AllocatorModel::settings() const noexcept { return impl_->settings; }
void AllocatorModel::record_segment_events(bool enabled) noexcept { impl_->record_events = enabled; }
void AllocatorModel::hint_next_segment_address(std::uint64_t address) noexcept {
  impl_->segment_hint = address;
}
std::uint64_t AllocatorModel::release_cached_segment(std::uint64_t address) noexcept {
  try {
    return impl_->release_at(address);
  } catch (...) {
    return 0;
  }
}
const std::vector<AllocatorSegmentEvent>& AllocatorModel::segment_events() const noexcept {
  return impl_->events;
}

}  // namespace ridgescope
