// tracking_session.h — one tracking session of a torch process: the trace recorder, the CPU
// allocator source, and the tagging of tensors with categories and labels (design.md §3).
//
// Python (and later C++ trainers) decide *what* a tensor is; this class turns that decision
// into Tag events on the tensor's storage block, and owns the saved-tensor pack hook's work,
// which runs once per tensor saved for backward and so is done here in C++.
//
// Errors: misuse (a second session, an unwritable path) throws at the call. Anything that
// fails while recording is caught: the session degrades (stops recording, keeps the trace
// readable) and error() says why; nothing propagates into the training loop.
// Thread-safety: one session at a time per process. Tagging and phase calls may come from any
// thread (autograd runs backward hooks on worker threads); the module stack is per thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ridgescope/category.h"
#include "ridgescope/flight.h"
#include "ridgescope/recorder.h"
#include "site_capture.h"

namespace ridgescope::sources {

class NvmlSampler;
class HostMemorySampler;

class TrackingSession {
 public:
  // Creates the trace, installs the CPU allocator source. Throws std::runtime_error when a
  // session is already running or the path cannot be written.
  // capacity_bytes: a simulated CPU device capacity (0: none); see cpu_allocator_source.h.
  // stacks: what each allocation's site holds (site_capture.h; default the site alone).
  // flight: the flight recorder's options (ridgescope/flight.h): keep_steps 0 keeps every step.
  // host_memory: the host's resident set is read when tracking starts and at every phase end
  // (host_memory_source.h; set_host_memory() changes it later).
  // idle_writer: the trace writer thread runs at the idle scheduling class (RecorderOptions;
  // RIDGESCOPE_WRITER=idle from Python).
  explicit TrackingSession(const std::string& path, std::uint64_t capacity_bytes = 0,
                           StackMode stacks = StackMode::Site, FlightOptions flight = {},
                           bool host_memory = true, bool idle_writer = false);
  ~TrackingSession();
  TrackingSession(const TrackingSession&) = delete;
  TrackingSession& operator=(const TrackingSession&) = delete;

  // Stops recording, restores the allocator, writes the final sample and closes the trace.
  void stop() noexcept;
  bool active() const noexcept { return active_.load(); }

  std::uint32_t intern(const std::string& text) noexcept;
  void metadata(const std::string& key, const std::string& json) noexcept;
  // Phase markers; they also take the ledgers' readings (record_ledger_readings).
  void phase_begin(std::uint32_t name_id) noexcept;
  void phase_end(std::uint32_t name_id) noexcept;
  void step(std::uint64_t step) noexcept;
  // rs.mark(name): a moment the user names; its step is kept with the one before and after.
  void mark(std::uint32_t name_id) noexcept;
  std::uint64_t keep_steps() const noexcept { return keep_steps_; }
  // Starts the NVML sampler (every interval_ms). Returns "" when it runs, else why not; the
  // reason is also recorded as `driver_view` metadata, so reports say it was absent.
  std::string start_driver_view(std::uint32_t interval_ms) noexcept;

  // Writes everything recorded so far to the trace file and returns when it is there.
  void flush() noexcept { recorder_.flush(); }
  // Records the allocator's own live-byte count, checked against the ledger by the analysis
  // (on CUDA also its reserved bytes: torch.cuda.memory_allocated() / memory_reserved()).
  void sample_allocator() noexcept;
  // Starts the CUDA caching-allocator source (cuda_allocator_source.h) for this session.
  // Returns "" when CUDA blocks are tracked, else why not (also written as metadata).
  std::string start_cuda() noexcept;
  bool cuda_started() const noexcept { return cuda_started_.load(); }
  // Starts the CUPTI source (cupti_source.h): allocations outside PyTorch, by library. Returns ""
  // when subscribed, else why not (also written as `cupti_source` metadata). Call after
  // start_cuda().
  std::string start_cupti() noexcept;
  // Whether phase ends take a host-memory reading (host_memory_source.h; on by default).
  void set_host_memory(bool on) noexcept;

  // Tags the block behind `tensor` (its storage base). Weak tags apply only to blocks that no
  // strong tag explains. Tensors without storage (meta, fake, sparse) are ignored.
  void tag_tensor(const at::Tensor& tensor, Category category, std::uint32_t label_id,
                  bool weak) noexcept;

  // Adopts the storage of a tensor that existed before the session, then tags it (strongly, or
  // weakly: what a strong tag explains keeps its category, as a kept gradient does when it is
  // taken for a copy of the weights). Returns the storage bytes newly counted (0 when already
  // counted).
  std::uint64_t register_tensor(const at::Tensor& tensor, Category category,
                                std::uint32_t label_id, bool weak = false) noexcept;

  // Remembers the parameters whose gradients tag_gradients() reports, with each gradient's
  // label. Replaces any earlier list.
  void watch_parameters(std::vector<at::Tensor> parameters,
                        std::vector<std::uint32_t> gradient_label_ids) noexcept;
  // Tags the gradient of every watched parameter whose .grad block changed since the last call
  // (one pass in C++; called when backward ends and before an optimizer step). Returns the
  // number of tags written.
  std::size_t tag_gradients() noexcept;

  // The saved-tensor pack hook's work: a weak activation tag labelled with the innermost module
  // entered on this thread. Returns the tensor itself, so nothing extra is kept alive.
  const at::Tensor& on_saved_tensor(const at::Tensor& tensor) noexcept;
  // A module starts (ends) running on this thread: its activation label and its name's id.
  void enter_module(std::uint32_t activation_label_id, std::uint32_t context_id) noexcept;
  void exit_module() noexcept;

  // Stops recording after an internal error; the first reason is kept.
  void degrade(const std::string& reason) noexcept;
  bool degraded() const noexcept { return degraded_.load(); }
  std::string error() const;

  const std::string& path() const noexcept { return recorder_.path(); }
  StackMode stacks() const noexcept { return sites_->mode(); }
  RecorderStats stats() const { return recorder_.stats(); }

  // Testing aids: make the next tag throw inside the session as an internal bug would
  // ("tag"), or the next trace write fail as a full disk would ("write").
  void inject_fault(const std::string& kind);

 private:
  void check_recorder() noexcept;
  void marker(EventKind kind, std::uint32_t name_id, std::uint64_t value) noexcept;
  void sample_allocator_unchecked() noexcept;
  // The ledgers' readings of a phase's end (ridgescope/memory_layers.h): the host's resident
  // set, CUPTI's module counts and the driver's figure (NVML, asked of its sampler; it is asked
  // at every begin too). Also taken when the session starts (the host's) and stops.
  void record_ledger_readings() noexcept;

  const std::uint64_t keep_steps_;
  Recorder recorder_;
  std::unique_ptr<SiteCapture> sites_;  // used by the sources until they are stopped
  std::atomic<bool> active_{false};
  std::atomic<bool> degraded_{false};
  std::atomic<bool> fault_tag_{false};
  mutable std::mutex error_mutex_;
  std::string error_;
  std::unique_ptr<NvmlSampler> nvml_;
  std::mutex watch_mutex_;
  std::vector<at::Tensor> watched_;
  std::vector<std::uint32_t> watched_labels_;
  // The gradient block last tagged per parameter: a gradient freed by zero_grad(set_to_none=True)
  // and made anew at the same address is a new block to tag. Known by the allocator source's
  // serial for the block (address reuse gives a new one), so nothing of the gradient is held:
  // a weak reference would keep its StorageImpl's memory, and ~40 of them made in backward pin
  // the top of glibc's heap so that it is never trimmed (docs/performance.md, "What pinned the
  // heap"). A block no source numbers (a storage with a context of its own, the cudaMallocAsync
  // backend) falls back to a weak reference to its storage.
  struct TaggedGradient {
    Device device{};
    std::uint64_t addr = 0;    // the block's address (its storage's data pointer)
    std::uint64_t serial = 0;  // the source's serial for it; 0: identified by `storage`
    c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
  };
  std::vector<TaggedGradient> watched_grads_;
  std::uint32_t sample_name_id_ = 0;
  std::uint32_t reserved_sample_id_ = 0;
  std::atomic<bool> cuda_started_{false};
  std::atomic<bool> cupti_started_{false};
  std::unique_ptr<HostMemorySampler> host_;  // host-memory readings at boundaries (null: off)
  std::uint32_t outside_label_id_ = 0;
};

}  // namespace ridgescope::sources
