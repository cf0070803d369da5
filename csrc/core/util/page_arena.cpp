// page_arena.cpp — PageArena and InternTable (page_arena.h).
#include "page_arena.h"

#include <algorithm>
#include <cstring>
#include <new>

#if defined(_WIN32)
#include <cstdlib>
#else
#include <sys/mman.h>
#endif

namespace ridgescope::detail {

struct PageArena::Block {
  Block* next;
  std::size_t bytes;  // the whole mapping, this header included
};

namespace {

constexpr std::size_t kMaxBlockBytes = 4 * 1024 * 1024;

// Page mappings where the platform has mmap; elsewhere (Windows, not a supported platform for
// tracking) the C heap, so that the core still builds and behaves the same, minus the placement.
void* map_pages(std::size_t bytes) noexcept {
#if defined(_WIN32)
  return std::malloc(bytes);
#else
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
#endif
}

void unmap_pages(void* p, std::size_t bytes) noexcept {
#if defined(_WIN32)
  (void)bytes;
  std::free(p);
#else
  munmap(p, bytes);
#endif
}

}  // namespace

void* PageArena::do_allocate(std::size_t bytes, std::size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) throw std::bad_alloc();
  auto aligned = [&](char* p) {
    const auto v = reinterpret_cast<std::uintptr_t>(p);
    return reinterpret_cast<char*>((v + alignment - 1) & ~(static_cast<std::uintptr_t>(alignment) - 1));
  };
  if (next_ != nullptr) {
    char* p = aligned(next_);
    if (p <= end_ && static_cast<std::size_t>(end_ - p) >= bytes) {
      next_ = p + bytes;
      return p;
    }
  }
  // A new block, large enough for this request; what was left of the last one is not reused.
  const std::size_t header = (sizeof(Block) + alignof(std::max_align_t) - 1) & ~(alignof(std::max_align_t) - 1);
  const std::size_t need = header + bytes + alignment;
  if (need < bytes) throw std::bad_alloc();  // overflow
  std::size_t size = std::max(next_block_bytes_, need);
  constexpr std::size_t kPage = 4096;
  size = (size + kPage - 1) & ~(kPage - 1);
  void* mapping = map_pages(size);
  if (mapping == nullptr) throw std::bad_alloc();
  blocks_ = new (mapping) Block{blocks_, size};
  mapped_bytes_ += size;
  next_block_bytes_ = std::min(next_block_bytes_ * 2, kMaxBlockBytes);
  char* base = static_cast<char*>(mapping);
  end_ = base + size;
  char* p = aligned(base + header);
  next_ = p + bytes;
  return p;
}

namespace {

class PageMappings final : public std::pmr::memory_resource {
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    if (alignment > 4096) throw std::bad_alloc();  // a mapping is page-aligned
    void* p = map_pages(bytes == 0 ? 1 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t) noexcept override { unmap_pages(p, bytes == 0 ? 1 : bytes); }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }
};

}  // namespace

std::pmr::memory_resource* page_mappings() noexcept {
  static PageMappings resource;  // stateless: safe to use during static destruction
  return &resource;
}

void PageArena::release() noexcept {
  while (blocks_ != nullptr) {
    Block* b = blocks_;
    blocks_ = b->next;
    unmap_pages(b, b->bytes);
  }
  next_ = end_ = nullptr;
  next_block_bytes_ = kFirstBlockBytes;
  mapped_bytes_ = 0;
}

std::string_view PageArena::copy(std::string_view text) {
  char* out = static_cast<char*>(allocate(text.empty() ? 1 : text.size(), 1));
  if (!text.empty()) std::memcpy(out, text.data(), text.size());
  return {out, text.size()};
}

void InternTable::add(std::string_view text, std::uint32_t id) { map_.emplace(arena_.copy(text), id); }

}  // namespace ridgescope::detail
