// ridgescope/allocator_settings.h — the settings of PyTorch's CUDA caching allocator that
// decide blocks and segments (the native-backend subset of PYTORCH_CUDA_ALLOC_CONF, plus the
// device capacity), their parser and canonical text, and the rules they imply: the block rules
// of cuda_rounding.h and the segment size cudaMalloc is asked for. The AllocatorModel
// (allocator_model.h) runs under these settings; `ridgescope fit` and `ridgescope whatif` take
// them from the command line.
//
// Errors: a malformed settings string is refused by parse_allocator_settings with a message
// naming the option.
//
// Thread-safety: plain values and pure functions; safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "ridgescope/cuda_rounding.h"

namespace ridgescope {

// torch's segment constants (c10/core/AllocatorConfig.h), in bytes. The block rules
// (round_size, pools, should_split, kMinBlockSize, kSmallSize) live in cuda_rounding.h and are
// the ones the model uses.
inline constexpr std::uint64_t kAllocSmallBuffer = 2ull << 20;       // small-pool segment
inline constexpr std::uint64_t kAllocMinLargeAlloc = 10ull << 20;    // below: kLargeBuffer segment
inline constexpr std::uint64_t kAllocLargeBuffer = 20ull << 20;      // default large segment
inline constexpr std::uint64_t kAllocRoundLarge = 2ull << 20;        // large segment rounding

// The allocator settings (the native-backend subset of PYTORCH_CUDA_ALLOC_CONF) plus the
// device the model runs against.
struct AllocatorSettings {
  // Blocks of at least this many bytes are "oversize": never split, never used for a smaller
  // request. 0 = unlimited (torch's default, SIZE_MAX). max_split_size_mb.
  std::uint64_t max_split_size_bytes = 0;
  // An oversize block serves a request >= max_split_size only if block < request + this.
  // max_non_split_rounding_mb; torch's default is 20 MiB.
  std::uint64_t max_non_split_rounding_bytes = kAllocLargeBuffer;
  // Segment size for 1-10 MiB requests and the large-pool page of expandable segments.
  // large_segment_size_mb (torch >= 2.12); default 20 MiB.
  std::uint64_t large_segment_bytes = kAllocLargeBuffer;
  // Divisions per power-of-two interval of the request: entry i covers [2^i MiB, 2^(i+1) MiB)
  // (entry 0 also everything below 2 MiB, entry 15 everything from 32 GiB). 0 or 1 = plain
  // 512-byte rounding. roundup_power2_divisions:N or [256:1,512:2,>:4].
  std::array<std::uint64_t, kCudaRoundupIntervals> roundup_power2_divisions{};
  bool expandable_segments = false;  // expandable_segments:True
  // garbage_collection_threshold in (0, 1); 0 = off. As in torch, it acts only when a memory
  // fraction is set (per_process_memory_fraction below).
  double garbage_collection_threshold = 0.0;
  // torch.cuda.set_per_process_memory_fraction (or per_process_memory_fraction:F): reserved
  // bytes may not exceed fraction * capacity_bytes. 0 = not set.
  double per_process_memory_fraction = 0.0;
  // Device memory the allocator may reserve, bytes (total minus what the CUDA context and
  // other non-PyTorch users hold). 0 = unlimited (no OOM, no release-and-retry).
  std::uint64_t capacity_bytes = 0;
  // The string this was parsed from, for reports ("" when built in code).
  std::string source;
};

// Parses a PYTORCH_CUDA_ALLOC_CONF-style string, e.g.
// "expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:4", onto a default
// AllocatorSettings. Options of other backends or of the pinned host allocator
// (backend:native, release_lock_on_cudamalloc, pinned_*, graph_capture_record_stream_reuse,
// throw_on_cudamalloc_oom) are accepted and ignored; backend:cudaMallocAsync is refused
// (not modelled). On error returns false and sets *error to a message naming the option.
bool parse_allocator_settings(std::string_view text, AllocatorSettings* out, std::string* error);

// The settings as a canonical PYTORCH_CUDA_ALLOC_CONF string (only non-default options).
std::string format_allocator_settings(const AllocatorSettings& settings);

// The block rules of these settings, for cuda_round_size / cuda_should_split
// (ridgescope/cuda_rounding.h), which the model applies.
CudaRoundingRules allocator_rounding_rules(const AllocatorSettings& s) noexcept;
// The segment size cudaMalloc is asked for when no cached block fits a block of
// `block_bytes` (get_allocation_size).
std::uint64_t allocator_segment_size(std::uint64_t block_bytes, const AllocatorSettings& s) noexcept;

}  // namespace ridgescope
