#include "ridgescope/cuda_rounding.h"

#include <algorithm>
#include <bit>

namespace ridgescope {

std::uint64_t cuda_roundup_divisions(std::uint64_t bytes, const CudaRoundingRules& rules) noexcept {
  // AcceleratorAllocatorConfig::roundup_power2_divisions(size): intervals start at 1 MiB
  // (log2 = 20); index = log2(size) - 20 when log2(size) > 20, else 0; capped at 15.
  if (bytes == 0) return rules.roundup_power2_divisions[0];
  const std::uint64_t log_size = 63 - static_cast<std::uint64_t>(std::countl_zero(bytes));
  constexpr std::uint64_t kIntervalStart = 20;
  std::uint64_t index = log_size > kIntervalStart ? log_size - kIntervalStart : 0;
  index = std::min<std::uint64_t>(index, kCudaRoundupIntervals - 1);
  return rules.roundup_power2_divisions[index];
}

std::uint64_t cuda_roundup_power2_next_division(std::uint64_t bytes,
                                                std::uint64_t divisions) noexcept {
  if (bytes <= 4 || divisions <= 1) return bytes;
  if (std::has_single_bit(bytes)) return bytes;
  // Divide the space between the two powers of two into `divisions` equal steps (torch uses
  // the largest power of two not above `divisions`).
  const std::uint64_t power2_floor = std::bit_floor(bytes);
  const std::uint64_t step =
      power2_floor >> (63 - static_cast<std::uint64_t>(std::countl_zero(divisions)));
  if (step == 0) return power2_floor << 1;
  const std::uint64_t floor = bytes & ~(step - 1);
  return floor == bytes ? bytes : floor + step;
}

std::uint64_t cuda_round_size(std::uint64_t requested_bytes, const CudaRoundingRules& rules) noexcept {
  if (requested_bytes < kCudaMinBlockSize) return kCudaMinBlockSize;
  const std::uint64_t divisions = cuda_roundup_divisions(requested_bytes, rules);
  if (divisions > 1 && requested_bytes > kCudaMinBlockSize * divisions) {
    return cuda_roundup_power2_next_division(requested_bytes, divisions);
  }
  return kCudaMinBlockSize * ((requested_bytes + kCudaMinBlockSize - 1) / kCudaMinBlockSize);
}

bool cuda_should_split(std::uint64_t free_block_bytes, std::uint64_t rounded_bytes,
                       const CudaRoundingRules& rules) noexcept {
  if (free_block_bytes < rounded_bytes) return false;
  const std::uint64_t remaining = free_block_bytes - rounded_bytes;
  if (cuda_is_small_pool(rounded_bytes) || rules.expandable_segments) {
    return remaining >= kCudaMinBlockSize;
  }
  return rounded_bytes < rules.max_split_size && remaining > kCudaSmallSize;
}

std::uint64_t cuda_block_size(std::uint64_t requested_bytes, std::uint64_t free_block_bytes,
                              const CudaRoundingRules& rules) noexcept {
  const std::uint64_t rounded = cuda_round_size(requested_bytes, rules);
  if (free_block_bytes <= rounded) return rounded;
  return cuda_should_split(free_block_bytes, rounded, rules) ? rounded : free_block_bytes;
}

}  // namespace ridgescope
