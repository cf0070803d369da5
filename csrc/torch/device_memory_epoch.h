// device_memory_epoch.h — a process-wide counter of changes to what the CUDA driver holds for
// this process: the CUDA source bumps it when PyTorch reserves or releases a segment, the CUPTI
// source when a library allocates or frees device memory outside PyTorch. The NVML sampler
// watches it and takes a reading soon after a change, so the driver's figure is read near every
// high-water mark (docs/forensics.md, "The device ledger").
//
// Hot path: bump() is one relaxed atomic increment, safe under any lock and from any thread.
#pragma once

#include <atomic>
#include <cstdint>

namespace ridgescope::sources {

inline std::atomic<std::uint64_t>& device_memory_epoch() noexcept {
  static std::atomic<std::uint64_t> epoch{0};
  return epoch;
}
inline void bump_device_memory_epoch() noexcept {
  device_memory_epoch().fetch_add(1, std::memory_order_relaxed);
}

}  // namespace ridgescope::sources
