// nvml_source.h — the driver's view of device memory: an NVML sampler, loaded at run time.
//
// start() dlopens libnvidia-ml.so.1; where it is absent (a CPU machine, a container without
// the driver) it returns nullptr and says why, and nothing else changes. While it runs, a
// thread records Sample events "nvml_used_bytes" and "nvml_total_bytes" per device every
// interval, and "nvml_process_used_bytes" (this process's usage) where the driver's NVML has
// the per-process query; the analysis reconciles them against the allocator's reserved bytes:
// the rest is memory outside PyTorch (CUDA context, NCCL, libraries).
//
// Thread-safety: start() and the destructor from the session's thread; the sampler thread only
// calls NVML and Recorder::record.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "ridgescope/recorder.h"

namespace ridgescope::sources {

class NvmlSampler {
 public:
  static std::unique_ptr<NvmlSampler> start(Recorder* recorder, std::uint32_t interval_ms,
                                            std::string* why_not);
  ~NvmlSampler();
  NvmlSampler(const NvmlSampler&) = delete;
  NvmlSampler& operator=(const NvmlSampler&) = delete;

  struct Api;  // the NVML entry points, resolved with dlsym

 private:
  NvmlSampler() = default;
  void run();

  Recorder* recorder_ = nullptr;
  std::uint32_t interval_ms_ = 100;
  std::unique_ptr<Api> api_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ridgescope::sources
