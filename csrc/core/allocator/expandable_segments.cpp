// expandable_segments.cpp — expandable segments in the CUDA caching allocator model
// (expandable_segments:True; see include/ridgescope/allocator_model.h): one segment of address
// space per stream and pool, mapped and unmapped in pages (2 MiB small, large_segment_size
// large), as torch's ExpandableSegment.
#include <algorithm>

#include "caching_allocator.h"

namespace ridgescope {

using detail::caching::Block;
using detail::caching::kMaxRequestBytes;
using detail::caching::kUnlimitedVaBytes;
using detail::caching::Pool;
using detail::caching::round_up;
using detail::caching::Segment;

Block* AllocatorModel::Impl::find_expandable_block(Pool& pool, std::uint64_t size, std::uint64_t stream) {
  auto allocatable = [](const Block* b) { return b && !b->allocated; };
  auto has_room = [&](const Block* b) {
    std::uint64_t bytes = 0;
    while (bytes < size && allocatable(b)) {
      bytes += b->size;
      b = b->next;
    }
    return bytes >= size;
  };
  Block key;
  key.stream = stream;
  key.addr = 0;
  for (auto it = pool.unmapped.lower_bound(&key);
       it != pool.unmapped.end() && (*it)->stream == stream; ++it) {
    Block* c = *it;
    if (allocatable(c->prev)) c = c->prev;
    if (has_room(c)) return c;
  }
  const std::uint64_t page = pool.small ? kAllocSmallBuffer : settings.large_segment_bytes;
  // Capped so that the sum and the rounding below cannot wrap past 2^64.
  const std::uint64_t total =
      std::min(settings.capacity_bytes ? settings.capacity_bytes : kUnlimitedVaBytes, kMaxRequestBytes);
  const std::uint64_t va = round_up(total + total / 8, page);
  if (va < size) return nullptr;  // larger than the address space torch reserves: cannot map
  Block* b = new_segment(pool, va, stream, page);
  pool.unmapped.insert(b);
  return b;
}

bool AllocatorModel::Impl::map_block(Block* to_map, std::uint64_t size) {
  const Segment& seg = *to_map->segment;
  const std::uint64_t begin = (to_map->addr - seg.base) / seg.page;
  const std::uint64_t end = (to_map->addr + size - seg.base + seg.page - 1) / seg.page;
  const std::uint64_t mapped = (end - begin) * seg.page;
  if (mapped == 0) return true;
  if (!device_has_room(mapped)) return false;  // cuMemCreate fails: nothing is mapped
  Pool& pool = *to_map->pool;
  pool.unmapped.erase(to_map);
  to_map->mapped = true;
  if (mapped < to_map->size) {
    auto* rest = new Block;
    rest->addr = to_map->addr + mapped;
    rest->size = to_map->size - mapped;
    rest->stream = to_map->stream;
    rest->segment = to_map->segment;
    rest->pool = &pool;
    rest->mapped = false;
    rest->prev = to_map;
    rest->next = to_map->next;
    if (rest->next) rest->next->prev = rest;
    to_map->next = rest;
    pool.unmapped.insert(rest);
    to_map->size = mapped;
  }
  try_merge(to_map, to_map->prev);
  try_merge(to_map, to_map->next);
  pool.insert(to_map);
  ++st.device_alloc_count;
  add_reserved(to_map, mapped);
  event(AllocatorSegmentEvent::Kind::Map, seg.base + begin * seg.page, mapped, to_map->stream);
  return true;
}

Block* AllocatorModel::Impl::try_allocate_expandable(Pool& pool, std::uint64_t size, std::uint64_t stream) {
  Block* c = find_expandable_block(pool, size, stream);
  if (c == nullptr) return nullptr;
  if (!c->mapped && !map_block(c, std::min(c->size, size))) return nullptr;
  while (c->size < size) {
    Block* next = c->next;
    if (!map_block(next, std::min(size - c->size, next->size))) return nullptr;
    c = next;  // map_block merged the free block before it into `next`
  }
  pool.blocks.erase(c);
  return c;
}

void AllocatorModel::Impl::unmap_block(Block* b) {
  const Segment& seg = *b->segment;
  const std::uint64_t begin = (b->addr - seg.base + seg.page - 1) / seg.page;
  const std::uint64_t end = (b->addr + b->size - seg.base) / seg.page;
  if (begin >= end) return;
  Pool& pool = *b->pool;
  pool.blocks.erase(b);
  const std::uint64_t un_addr = seg.base + begin * seg.page;
  const std::uint64_t un_size = (end - begin) * seg.page;
  const std::uint64_t before = un_addr - b->addr;
  if (before > 0) {
    auto* f = new Block;
    f->addr = b->addr;
    f->size = before;
    f->stream = b->stream;
    f->segment = b->segment;
    f->pool = &pool;
    f->prev = b->prev;
    f->next = b;
    if (f->prev) f->prev->next = f;
    b->prev = f;
    pool.insert(f);
  }
  const std::uint64_t after = b->size - before - un_size;
  if (after > 0) {
    auto* f = new Block;
    f->addr = un_addr + un_size;
    f->size = after;
    f->stream = b->stream;
    f->segment = b->segment;
    f->pool = &pool;
    f->prev = b;
    f->next = b->next;
    if (f->next) f->next->prev = f;
    b->next = f;
    pool.insert(f);
  }
  b->addr = un_addr;
  b->size = un_size;
  b->mapped = false;
  try_merge(b, b->prev);
  try_merge(b, b->next);
  pool.unmapped.insert(b);
  sub_reserved(b, un_size);
  ++st.device_free_count;
  event(AllocatorSegmentEvent::Kind::Unmap, un_addr, un_size, b->stream);
}

void AllocatorModel::Impl::release_expandable_segment(Block* b) {
  b->pool->unmapped.erase(b);
  segments.erase(b->segment->base);
  delete b;
}

}  // namespace ridgescope
