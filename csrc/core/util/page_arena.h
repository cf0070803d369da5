// page_arena.h — memory for ridgescope's own long-lived bookkeeping, kept out of the C heap.
//
// A session's tables (interned strings, frames and stacks; the site caches; the module ranges)
// grow while the user's first steps run and live as long as the session. Made with malloc, each
// of those small blocks lands between the step's tensors in glibc's heap and stays there: it
// changes where glibc places the step's blocks and when it trims and regrows the heap top, and
// so how many pages the training loop faults in (docs/performance.md, "Long-lived blocks made
// mid-step"). PageArena takes its memory from the kernel in blocks of whole pages (mmap) and
// hands it out by bumping a pointer: nothing it holds is ever in the C heap, and nothing is
// given back until the arena is destroyed or released. A container that frees (a hash table
// that grows) wastes what it frees; the tables here only grow, so the waste is under the size of
// the final table.
//
// Thread-safety: none; the owner serialises every use (the recorder's lock, a thread's own
// cache).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <string_view>

#include "absl/container/flat_hash_map.h"

namespace ridgescope::detail {

class PageArena final : public std::pmr::memory_resource {
 public:
  static constexpr std::size_t kFirstBlockBytes = 64 * 1024;  // then doubling, up to 4 MiB
  PageArena() noexcept = default;
  ~PageArena() override { release(); }
  PageArena(const PageArena&) = delete;
  PageArena& operator=(const PageArena&) = delete;

  // Gives every block back to the kernel. Whatever was allocated from the arena is gone.
  void release() noexcept;
  // A copy of `text` in the arena (throws std::bad_alloc).
  std::string_view copy(std::string_view text);
  std::uint64_t mapped_bytes() const noexcept { return mapped_bytes_; }  // from the kernel, bytes

 private:
  struct Block;  // a mapping's header: the next (older) mapping and its size
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;  // throws std::bad_alloc
  void do_deallocate(void*, std::size_t, std::size_t) noexcept override {}
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }

  Block* blocks_ = nullptr;  // newest first
  char* next_ = nullptr;     // free space of the newest block: [next_, end_)
  char* end_ = nullptr;
  std::size_t next_block_bytes_ = kFirstBlockBytes;
  std::uint64_t mapped_bytes_ = 0;
};

// A memory resource that maps every allocation on its own pages and unmaps it when it is freed:
// for large buffers that come and go (the recorder's chunks), kept out of the C heap like the
// arena's tables. Thread-safe (stateless).
std::pmr::memory_resource* page_mappings() noexcept;

// A hash map whose table lives in a PageArena: ArenaHashMap<K, V> m{&arena}.
template <class K, class V>
using ArenaAllocator = std::pmr::polymorphic_allocator<std::pair<const K, V>>;
template <class K, class V, class Hash = typename absl::flat_hash_map<K, V>::hasher,
          class Eq = typename absl::flat_hash_map<K, V>::key_equal>
using ArenaHashMap = absl::flat_hash_map<K, V, Hash, Eq, ArenaAllocator<K, V>>;

// Empties every map (their tables given back to `arena`, a no-op) and then gives the arena's pages
// back to the kernel: for a cache whose maps are the arena's only users (a new session's).
template <class... Maps>
void empty_and_release(PageArena& arena, Maps&... maps) {
  (Maps(&arena).swap(maps), ...);
  arena.release();
}

// An append-only map from text to a number, its keys and table in a PageArena of its own (the
// recorder's interned strings, frames and stacks).
class InternTable {
 public:
  InternTable() : map_(ArenaAllocator<std::string_view, std::uint32_t>(&arena_)) {}
  // The number `text` was added with, or 0 when it was not.
  std::uint32_t find(std::string_view text) const {
    auto it = map_.find(text);
    return it == map_.end() ? 0 : it->second;
  }
  // Adds `text` (not present) with `id` (non-zero). Throws std::bad_alloc.
  void add(std::string_view text, std::uint32_t id);
  std::size_t size() const noexcept { return map_.size(); }
  std::uint64_t mapped_bytes() const noexcept { return arena_.mapped_bytes(); }

 private:
  PageArena arena_;  // declared first: destroyed after the map that uses it
  ArenaHashMap<std::string_view, std::uint32_t> map_;
};

}  // namespace ridgescope::detail
