// cupti_source.h — memory outside PyTorch, itemised: CUPTI's callback API on the CUDA runtime's
// and driver's allocation entry points (design.md §5; docs/gpu.md, "Memory outside PyTorch").
//
// Compiled in where CUPTI's headers are found at build time (RIDGESCOPE_WITH_CUPTI, set by
// cmake/RidgescopeCupti.cmake from the nvidia-cuda-cupti wheel torch depends on); CUPTI itself
// is loaded at run time with dlopen (torch's own libtorch_cpu already loads it). Where it is
// absent, or refuses a subscriber because another tool holds it (Nsight Systems, a
// torch.profiler that was started earlier in the process: CUPTI takes one subscriber),
// start() returns why, the `cupti_source` metadata records it, and the report says the layer is
// not itemised. Nothing else changes.
//
// What it sees: cudaMalloc, cudaMallocPitch, cudaMalloc3D, cudaMallocManaged, cudaMallocAsync,
// cudaMallocFromPoolAsync and their frees; cuMemAlloc_v2, cuMemAllocPitch_v2,
// cuMemAllocManaged, cuMemAllocAsync, cuMemAllocFromPoolAsync and their frees; the
// virtual-memory route cuMemCreate (device memory only), cuMemRetainAllocationHandle,
// cuMemMap, cuMemUnmap, cuMemRelease; and, from the resource domain, kernel modules loaded.
// A runtime call's own driver calls are not counted twice (a thread-local depth). Each call is
// attributed to the library of the first native frame outside libcuda, libcudart, libcupti and
// this library (backtrace + dladdr, cached by address); calls from libc10_cuda are PyTorch's
// caching allocator (its segments are already in the trace) and are counted and dropped
// (classify_caller, ridgescope/external_alloc.h, explains why). The translation itself is core
// (ExternalAllocTranslator) and unit-tested on the CPU.
//
// The activity API is not used: its buffers are process-wide (one registration, which
// torch.profiler's Kineto also takes), its records arrive late and carry no call stack, and the
// callbacks above see the same calls at the moment they happen, on the calling thread.
//
// Hot path (the callback): it copies the call's fields, walks the calling thread's native
// stack (no lock of ours is held during the walk or dladdr, so a loader lock held by a thread
// that allocates in a library constructor cannot deadlock with it), then translates and records
// under one leaf mutex (then the Recorder's). No GIL, no torch call, no exception escapes.
// When no session runs it costs one relaxed atomic load (CUPTI is unsubscribed at stop anyway).
//
// Thread-safety: start/stop from the session's thread; the callback from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "ridgescope/recorder.h"
#include "site_capture.h"

namespace ridgescope::sources {

// Whether this build has the CUPTI source (CUPTI's headers were found at build time).
bool cupti_source_compiled() noexcept;

// Subscribes to CUPTI and starts recording allocations outside PyTorch into `recorder` (not
// owned; must outlive stop). `sites` (may be null) gives each allocation its stack. Returns ""
// when subscribed, else why not; either way writes `cupti_source` metadata
// ({"available": bool, "reason": str}). Call after CUDA is initialised. Throws nothing.
std::string start_cupti_source(Recorder* recorder, SiteCapture* sites = nullptr) noexcept;

// Unsubscribes (so that a later torch.profiler can subscribe) and writes `cupti_source_stats`
// metadata (calls, PyTorch's calls dropped, unmatched frees, ...).
void stop_cupti_source() noexcept;

// Records the kernel modules loaded so far (samples `cupti_modules_loaded` and
// `cupti_module_bytes` of cuda:0), at phase boundaries. Nothing when not running.
void record_cupti_samples() noexcept;

}  // namespace ridgescope::sources
