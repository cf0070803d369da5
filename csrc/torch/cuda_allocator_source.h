// cuda_allocator_source.h — the CUDA caching-allocator source: torch's allocator trace tracker
// (attachAllocatorTraceTracker) and out-of-memory observer, feeding the active session's
// Recorder (design.md §5; torch-internals.md §1.3, §1.4).
//
// Compiled in when torch has CUDA (RIDGESCOPE_WITH_CUDA, set by cmake/RidgescopeTorch.cmake
// when libc10_cuda and the CUDA runtime headers are found); without it every function reports
// that the source is not compiled in.
//
// How it works. start() initialises CUDA, checks the allocator backend ("native" only: the
// cudaMallocAsync backend has no trace tracker, so it is reported as unsupported and the session
// polls the allocator's statistics at phase boundaries instead), attaches — once per process,
// since torch has no detach — a static trampoline for trace entries and one for OOMs, then
// takes the allocator's snapshot (segments and blocks, exact sizes) to adopt what existed
// before the session, and switches the trampoline to live translation (core:
// ridgescope/cuda_trace.h). If any allocation happens while the snapshot is taken, the snapshot
// is retaken, so the adopted state and the first live entry meet exactly.
//
// Hot path (the trampoline): it runs under the allocator's per-device lock on whatever thread
// allocates or frees. It takes no GIL, calls no torch function, never throws, allocates only
// through the C++ heap (the translator's tables), and takes one leaf mutex and then the
// Recorder's leaf mutex. The Recorder can make it wait only when its writer thread is behind
// on disk I/O; that thread never takes an allocator lock, so no deadlock is possible. When no
// session runs it costs one relaxed atomic load.
// The OOM observer runs after torch released the allocator lock and before the
// OutOfMemoryError is thrown: it records what torch reports and flushes the trace to disk.
//
// Thread-safety: all functions are safe from any thread; start/stop are called by the thread
// that starts and stops the session, one session at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ridgescope/recorder.h"
#include "site_capture.h"

namespace ridgescope::sources {

// Whether this build has the CUDA source (torch with CUDA at build time).
bool cuda_source_compiled() noexcept;

// Starts tracking every CUDA device's caching allocator into `recorder` (not owned; must
// outlive stop). Returns "" when trace entries are being translated, else why not (no CUDA
// device, not compiled in, the cudaMallocAsync backend, a tracker torch refused); the reason is
// also written as `cuda_source` metadata. With an unsupported backend the allocator's
// statistics are still sampled at phase boundaries (samples `cuda_allocated_bytes`,
// `cuda_reserved_bytes`). `sites` (not owned, may be null; must outlive stop) gives every
// alloc entry its stack, read on the allocating thread under the allocator's lock
// (site_capture.h), and the blocks adopted at start the pre-existing one. Throws nothing.
std::string start_cuda_allocator_source(Recorder* recorder, SiteCapture* sites = nullptr) noexcept;

// Stops translating (the trampoline stays attached, disabled) and writes the source's counters
// as `cuda_source_stats` metadata.
void stop_cuda_allocator_source() noexcept;

// Whether trace entries are being translated now.
bool cuda_allocator_source_live() noexcept;

// The translator's serial of the block allocated at `addr` on CUDA device `device`
// (CudaTraceTranslator::block_serial), 0 when entries are not being translated or no block is
// allocated there. Takes the source's leaf mutex; never call it from an allocator callback.
std::uint64_t cuda_block_serial(std::int16_t device, std::uint64_t addr) noexcept;

// Records, for every CUDA device, the allocator's own allocated and reserved bytes
// (torch.cuda.memory_allocated() / memory_reserved()) as Sample events: `live_name_id` /
// `reserved_name_id` while entries are translated (the analysis checks its ledger against
// them), or `cuda_allocated_bytes` / `cuda_reserved_bytes` when polling an unsupported backend.
// Does nothing when the source is not running. Never call it from an allocator callback (it
// takes the allocator's lock).
void record_cuda_samples(std::uint32_t live_name_id, std::uint32_t reserved_name_id) noexcept;

// A cuBLAS or cuBLASLt workspace: a block torch allocates through the caching allocator for a
// (handle, stream) and keeps; it never backs a tensor.
struct CudaWorkspaceBlock {
  std::int16_t device = 0;   // CUDA ordinal
  std::uint64_t addr = 0;    // the block's address
  bool cublaslt = false;     // from the cuBLASLt map (torch 2.11's separate Lt workspaces)
  friend bool operator==(const CudaWorkspaceBlock& a, const CudaWorkspaceBlock& b) noexcept {
    return a.device == b.device && a.addr == b.addr && a.cublaslt == b.cublaslt;
  }
};
// The workspace blocks torch holds now (at::cuda::cublas_handle_stream_to_workspace and
// cublaslt_handle_stream_to_workspace, read under their own lock). record_cuda_samples tags
// them `workspace` at every phase boundary. Empty when this build has
// no workspace access (cuda_workspace_tags_compiled) or torch has none. Never call it from an
// allocator callback.
std::vector<CudaWorkspaceBlock> cuda_workspace_blocks() noexcept;
// Whether this build can read torch's workspace maps (the cuBLAS headers were found).
bool cuda_workspace_tags_compiled() noexcept;

// The allocator backend's name ("native", "cudaMallocAsync"), or "" without CUDA.
std::string cuda_allocator_backend() noexcept;

// The source's counters, as JSON text (entries, unknown actions, unsplit blocks, ...).
std::string cuda_source_stats_json() noexcept;

}  // namespace ridgescope::sources
