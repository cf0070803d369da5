// cache_release.cpp — how the CUDA caching allocator model gives cached segments back to the
// device (see include/ridgescope/allocator_model.h): release_available_cached_blocks and
// release_cached_blocks on the retry path, empty_cache, garbage_collection_threshold, and the
// release of one recorded segment (replay of a run's releases).
#include <algorithm>
#include <iterator>
#include <vector>

#include "caching_allocator.h"

namespace ridgescope {

using detail::caching::Block;
using detail::caching::kNoLimit;
using detail::caching::Pool;

void AllocatorModel::Impl::release_block(Block* b) {
  ++st.device_free_count;
  b->pool->blocks.erase(b);
  sub_reserved(b, b->size);
  event(AllocatorSegmentEvent::Kind::Free, b->addr, b->size, b->stream);
  segments.erase(b->segment->base);
  delete b;
}

bool AllocatorModel::Impl::release_available(Pool& pool, std::uint64_t size, std::uint64_t stream) {
  if (max_split == kNoLimit) return false;
  Block key;
  key.stream = stream;
  key.size = std::max(size, max_split);
  key.addr = 0;
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream != stream) {
    if (it == pool.blocks.begin()) return false;
    std::uint64_t released = 0;
    --it;
    while (released < key.size && (*it)->size >= max_split && (*it)->stream == stream) {
      auto cur = it;
      const bool at_begin = it == pool.blocks.begin();
      if (!at_begin) --it;
      if (releasable(*cur)) {
        released += (*cur)->size;
        release_block(*cur);
      }
      if (at_begin) break;
    }
    return released >= key.size;
  }
  if (!releasable(*it)) return false;
  release_block(*it);
  return true;
}

void AllocatorModel::Impl::release_blocks(Pool& pool) {
  std::vector<Block*> to_unmap;
  for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
    Block* b = *it++;
    if (b->expandable()) {
      to_unmap.push_back(b);
    } else if (!b->is_split()) {
      release_block(b);
    }
  }
  for (Block* b : to_unmap) {
    unmap_block(b);
    if (!b->mapped && !b->prev && !b->next) release_expandable_segment(b);
  }
}

bool AllocatorModel::Impl::release_cached() {
  release_blocks(large);
  release_blocks(small);
  return true;
}

void AllocatorModel::Impl::garbage_collect() {
  const auto threshold = static_cast<std::uint64_t>(settings.garbage_collection_threshold *
                                                    static_cast<double>(allowed_max));
  if (st.reserved_bytes <= threshold) return;
  const std::uint64_t target = st.reserved_bytes - threshold;
  std::uint64_t reclaimed = 0;
  double total_age = 0;
  int count = 0;
  auto age = [&](const Block* b) {
    return static_cast<double>(large.get_free_blocks_call_count - b->gc_count_base);
  };
  for (Block* b : large.blocks) {
    if (releasable(b)) {
      total_age += age(b);
      ++count;
    }
  }
  if (count == 0) return;
  bool freed = true;
  while (reclaimed < target && freed && count > 0) {
    const double threshold_age = total_age / count;
    freed = false;
    for (auto it = large.blocks.begin(); it != large.blocks.end();) {
      Block* b = *it++;
      if (releasable(b) && age(b) >= threshold_age) {
        freed = true;
        reclaimed += b->size;
        total_age -= age(b);
        --count;
        release_block(b);
      }
    }
  }
}

std::uint64_t AllocatorModel::Impl::empty_cache() {
  call_released_bytes = 0;
  release_cached();
  return call_released_bytes;
}

std::uint64_t AllocatorModel::Impl::release_at(std::uint64_t address) {
  call_released_bytes = 0;
  for (Pool* p : {&small, &large}) {
    Block* found = nullptr;
    for (Block* b : p->blocks) {
      // torch records a segment's base for cudaFree, the first unmapped page for an unmap
      const bool hit = b->expandable() ? (b->addr <= address && address - b->addr < b->size)
                                       : b->addr == address;
      if (hit) {
        found = b;
        break;
      }
    }
    if (!found) continue;
    if (found->expandable()) {
      unmap_block(found);
      if (!found->mapped && !found->prev && !found->next) release_expandable_segment(found);
    } else if (!found->is_split()) {
      release_block(found);
    }
    break;
  }
  return call_released_bytes;
}

}  // namespace ridgescope
