// ridgescope/cuda_rounding.h — the block size PyTorch's CUDA caching allocator (the "native"
// backend, c10/cuda/CUDACachingAllocator.cpp) hands out for a request, recomputed exactly.
//
// The allocator's trace reports the *requested* bytes of an allocation; what
// torch.cuda.memory_allocated() counts is the block's size. This header holds the pure rules
// (DeviceCachingAllocator::round_size, get_pool and should_split of torch 2.11-2.14, see
// /work/shared/reference/torch-internals.md §6), self-contained so that any model of the
// allocator can reuse them:
//
//   round_size:  below 512 B -> 512 B; else, when the request's roundup_power2_divisions entry
//                d is > 1 and the request is > 512 * d bytes, the next of d equal divisions of
//                its power-of-two interval; else the next multiple of 512 B.
//   pool:        a rounded size <= 1 MiB goes to the small pool, else to the large pool.
//   should_split (a free block of B bytes serving a rounded size R): small pool or
//                expandable_segments -> split when B - R >= 512; large pool -> split only when
//                R < max_split_size and B - R > 1 MiB. An unsplit block is handed out whole,
//                so a large allocation's block can be up to 1 MiB (or, for oversize blocks, up
//                to max_non_split_rounding) bigger than R.
//
// Thread-safety: pure functions on values; safe from any thread.
#pragma once

#include <array>
#include <cstdint>

namespace ridgescope {

// torch's constants (c10/core/AllocatorConfig.h), in bytes.
inline constexpr std::uint64_t kCudaMinBlockSize = 512;         // every block is a multiple
inline constexpr std::uint64_t kCudaSmallSize = 1ull << 20;     // largest small-pool block
inline constexpr std::size_t kCudaRoundupIntervals = 16;        // 1 MiB .. 64 GiB

// The allocator settings that decide block sizes (read from the allocator at session start;
// PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF).
struct CudaRoundingRules {
  // roundup_power2_divisions per power-of-two interval of the *requested* size: entry 0 covers
  // sizes below 2 MiB, entry i (1..14) covers [2^i MiB, 2^(i+1) MiB), entry 15 everything from
  // 32 GiB. 0 or 1 means plain 512-byte rounding. torch requires powers of two.
  std::array<std::uint64_t, kCudaRoundupIntervals> roundup_power2_divisions{};
  // max_split_size_mb in bytes: blocks at or above it are never split. UINT64_MAX: no limit
  // (torch's default).
  std::uint64_t max_split_size = UINT64_MAX;
  // expandable_segments:True — every pool splits like the small pool.
  bool expandable_segments = false;
};

// The roundup_power2_divisions entry that applies to a request of `bytes` (index as above).
std::uint64_t cuda_roundup_divisions(std::uint64_t bytes, const CudaRoundingRules& rules) noexcept;

// torch's roundup_power2_next_division: `bytes` rounded up to the next of `divisions` equal
// steps between the powers of two around it (a power of two stays as it is).
std::uint64_t cuda_roundup_power2_next_division(std::uint64_t bytes,
                                                std::uint64_t divisions) noexcept;

// The rounded size of a request of `requested_bytes` (round_size). 0 -> 512, as in torch.
std::uint64_t cuda_round_size(std::uint64_t requested_bytes, const CudaRoundingRules& rules) noexcept;

// Whether a block of `rounded_bytes` (a round_size result) belongs to the small pool.
inline bool cuda_is_small_pool(std::uint64_t rounded_bytes) noexcept {
  return rounded_bytes <= kCudaSmallSize;
}

// Whether a free block of `free_block_bytes` serving `rounded_bytes` is split (the rest stays
// cached) or handed out whole (should_split).
bool cuda_should_split(std::uint64_t free_block_bytes, std::uint64_t rounded_bytes,
                       const CudaRoundingRules& rules) noexcept;

// The size of the block the allocator hands out for a request, given the free block it takes
// (`free_block_bytes`, which starts at the allocation's address): the rounded size when the
// block is split, else the whole free block. A free block smaller than the rounded size (an
// inconsistent input) gives the rounded size.
std::uint64_t cuda_block_size(std::uint64_t requested_bytes, std::uint64_t free_block_bytes,
                              const CudaRoundingRules& rules) noexcept;

}  // namespace ridgescope
