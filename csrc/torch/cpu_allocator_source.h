// cpu_allocator_source.h — the CPU allocator source: a delegating c10::Allocator that reports
// every CPU block's allocation and free to the active session's Recorder (design.md §5).
//
// install() puts the tracking allocator in front of whatever CPU allocator is registered and
// uninstall() restores it. Blocks allocated while installed keep the tracking deleter for their
// whole life, so the tracking allocator and its table live for the process; after uninstall()
// they free normally and report nothing. Storages that existed before install() (parameters,
// gradients, optimizer state) are adopted with register_storage() so their frees are seen too.
//
// Hot path (allocate and the deleter): no GIL, no torch call besides the delegated allocation,
// no exception escapes, one leaf mutex (then the Recorder's own leaf mutex).
// Thread-safety: all functions are safe from any thread; install/uninstall follow c10's rule
// that SetCPUAllocator is not synchronised with concurrent GetCPUAllocator callers, so they
// are called from the thread that starts and stops the session.
#pragma once

#include <cstdint>
#include <memory_resource>
#include <vector>

#include <c10/core/StorageImpl.h>

#include "ridgescope/recorder.h"
#include "site_capture.h"

namespace ridgescope::sources {

// Starts reporting to `recorder` (not owned; must outlive uninstall()). Returns false when a
// session is already installed. A non-zero `capacity_bytes` simulates a device of that size:
// an allocation that would take the session's live bytes past it records an `oom` event,
// flushes the trace and throws c10::OutOfMemoryError (torch.OutOfMemoryError in Python), as a
// real device would (tests and teaching). `sites` (not owned; may be null) gives every
// allocation its stack (site_capture.h) and adopted storages the pre-existing one.
bool install_cpu_allocator_source(Recorder* recorder, std::uint64_t capacity_bytes = 0,
                                  SiteCapture* sites = nullptr);

// Stops reporting and restores the previous CPU allocator.
void uninstall_cpu_allocator_source();

// Adopts a storage that existed before install(): records its allocation now and makes its
// free visible. Returns the storage's bytes, or 0 when it was already adopted, is empty, or is
// not a CPU storage.
std::uint64_t register_cpu_storage(c10::StorageImpl* storage);

// Whether the tracking allocator is the registered CPU allocator now.
bool cpu_allocator_source_installed();

// Bytes of CPU blocks live now by the source's own count (independent of the trace and of the
// ledger that replays it).
std::uint64_t cpu_live_bytes();
// The most bytes live at once since the previous call (or since the session started), and the
// start of a new interval: the host reading's budget never skips a new high (host_memory_source.h).
std::uint64_t cpu_take_live_high();

// A live block of this session that the tracking allocator handed out or adopted: the blocks
// whose resident pages make PyTorch's layer of the host's resident set (host_memory_source.h).
// Storages with a context of their own (memory-mapped, shared, from_blob) are counted in
// cpu_live_bytes() but not listed.
struct CpuBlock {
  std::uint64_t addr = 0, bytes = 0;
  std::uint64_t serial = 0;  // unique per allocation: a block at a reused address is a new one
};

// The serial of the block this session counts at data pointer `addr` (CpuBlock::serial), 0
// when there is none (freed, never seen, or a storage with a context of its own): whether a
// block seen earlier at an address is still the same allocation, without holding the storage.
std::uint64_t cpu_block_serial(std::uint64_t addr);

// The host reading's census of those blocks, in one pass under the source's lock: their bytes,
// the bytes of those marked wholly resident at an earlier reading (mark_cpu_blocks_resident;
// anonymous pages stay resident until freed), and into `unmeasured` the others, whose pages
// the reading asks the kernel about. Marks end with the block's free.
struct CpuBlockCensus {
  std::uint64_t allocated_bytes = 0;  // every listed block
  std::uint64_t resident_bytes = 0;   // the marked ones
};
CpuBlockCensus cpu_allocator_unmeasured_blocks(std::pmr::vector<CpuBlock>* unmeasured);
// Marks these blocks (address and serial, from the census) wholly resident; a block freed
// since (its address reused by a new serial) is left alone.
void mark_cpu_blocks_resident(const std::pmr::vector<CpuBlock>& blocks);

// Records a Sample event "allocator_live_bytes" with cpu_live_bytes(), ordered with the
// allocation events, so the analysis can check the ledger against it.
void record_cpu_live_sample(std::uint32_t sample_name_id);

}  // namespace ridgescope::sources
