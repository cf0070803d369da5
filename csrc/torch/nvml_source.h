// nvml_source.h — the driver's view of device memory: an NVML sampler, loaded at run time.
//
// start() dlopens libnvidia-ml.so.1; where it is absent (a CPU machine, a container without
// the driver) it returns nullptr and says why, and nothing else changes. A reading records, per
// device and in this order, Sample events "nvml_total_bytes", "nvml_used_bytes",
// "nvml_process_count" (processes NVML lists on the device), "nvml_process_used_bytes" (this
// process, by PID, where the driver's NVML has the per-process query and lists it: a container
// with its own PID namespace may hide it) and "nvml_reading" (why: 0 periodic, 1 at a phase
// boundary, 2 after the device's memory changed), which completes it (docs/trace_format.md).
// Readings are taken by the sampler's own thread: every interval, soon (within 10 ms) after the
// CUDA or CUPTI source reports a change of what the driver holds (device_memory_epoch.h), and
// at once when a phase boundary asks for one (request_boundary(): the training thread only sets
// a flag and wakes the sampler, since the per-process query can take a good fraction of a
// millisecond). NVML's queries never synchronise the device. The analysis reconciles them with
// the allocator's reserved bytes and CUPTI's allocations (the device ledger), and says whether
// the device's memory changed between the peak and the reading taken for it.
//
// Thread-safety: start() and the destructor from the session's thread; request_boundary() and
// read_now() from any thread; one reading at a time (a mutex keeps a reading's records
// together).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ridgescope/recorder.h"

namespace ridgescope::sources {

class NvmlSampler {
 public:
  static std::unique_ptr<NvmlSampler> start(Recorder* recorder, std::uint32_t interval_ms,
                                            std::string* why_not);
  ~NvmlSampler();
  NvmlSampler(const NvmlSampler&) = delete;
  NvmlSampler& operator=(const NvmlSampler&) = delete;

  // Why a reading is taken (the value of its nvml_reading sample).
  enum class Reason : std::uint64_t { Periodic = 0, Boundary = 1, Change = 2 };
  // Takes one reading of every device now, on the calling thread. Never throws.
  void read_now(Reason reason) noexcept;
  // Asks the sampler thread for a Boundary reading now; returns at once. Never throws.
  void request_boundary() noexcept;

  struct Api;  // the NVML entry points, resolved with dlsym

 private:
  NvmlSampler() = default;
  void run();

  Recorder* recorder_ = nullptr;
  std::uint32_t interval_ms_ = 100;
  std::unique_ptr<Api> api_;
  std::mutex reading_mutex_;  // leaf lock (then the Recorder's): one reading at a time
  std::uint32_t total_id_ = 0, used_id_ = 0, count_id_ = 0, process_id_ = 0, reading_id_ = 0;
  std::vector<unsigned char> infos_;  // the process query's buffer (guarded by reading_mutex_)
  std::mutex wake_mutex_;  // leaf lock: guards boundary_requested_ (and the wait below)
  std::condition_variable wake_;
  bool boundary_requested_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ridgescope::sources
