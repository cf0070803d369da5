// host_memory_source.h — the host's resident set at every phase end, for the three layers
// of ridgescope/host_memory.h (docs/forensics.md, "Host memory: the three layers").
//
// record_now() reads the resident set and its split (VmRSS, RssAnon, RssFile, RssShmem), glibc's allocator
// counters (mallinfo2, resolved at run time: absent before glibc 2.33 or with another libc) and
// the resident part of torch's live CPU blocks (mincore over each block's pages; a page shared
// with another allocation counts only the block's own bytes of it; a block wholly resident at
// the last reading is not asked again), and writes them as CPU
// `sample` events under the keys of ridgescope/host_memory.h, the resident set last. Nothing is
// synchronised with the training loop: a thread allocating meanwhile moves the figures by what
// it allocates.
//
// The split comes from /proc/self/statm (resident and shared pages) while its shared part is
// what the last /proc/self/status reading said, and from the status file when it moved
// (status_from_statm, ridgescope/host_memory.h): the status file costs ~60 us to read in a
// training process, statm a few. Both stay open (read with pread, reopened in a forked child).
//
// Cost (docs/performance.md): one read of /proc/self/statm (and of /proc/self/status when the
// shared pages moved), one mincore per group of nearby torch blocks not known wholly resident (at
// most 64 MiB of pages each), and mallinfo2, which walks every free chunk of glibc's arenas
// (30-100 us on a training process's fragmented heap). Both are taken under budgets
// (ridgescope/host_memory.h, host_budget; one time rule, host_budget::within):
//
//   * mallinfo2 at every reading until it has cost its allowance (1 ms: a short run's readings
//     are all exact), then only while it has taken at most 0.05 % of the time since the first
//     reading, and always at a complete reading (record_now(true): tracking's start and end). A
//     reading without it writes no host_malloc_* samples, and the analysis carries the last
//     figures forward, saying when they were read (HostSample::malloc_time_ns);
//   * a phase end (record_now(false)): the session's first 32 (a short run has every phase end
//     read, however loaded the machine), then only while the readings, mallinfo2's time aside,
//     have taken at most 0.1 % of the time since the first reading, and always when torch's live CPU
//     bytes reached a new high since the previous phase end (cpu_take_live_high(): higher than in
//     any interval before), so that the reading just after the run's peak is always there. A
//     skipped phase end writes nothing; the next reading says how many were skipped
//     (host_sample::kReadingsSkipped).
//
// Why: most of a reading's cost is its system calls, slow on the training thread right after
// the step's compute (10-40 us each, docs/performance.md), so four readings a step cost ~1 % of
// a 20 ms CPU step; a GPU step of 100 ms or more is read at every phase end.
// Not a hot path: it runs at the end of every phase, on the thread that ends it.
// Thread-safety: record_now() from any thread; one reading at a time.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cpu_allocator_source.h"
#include "page_arena.h"
#include "ridgescope/host_memory.h"
#include "ridgescope/recorder.h"

namespace ridgescope::sources {

// A block whose resident bytes are asked: address and bytes in, resident bytes out; `tag` is
// the caller's (kept with the block when the list is sorted).
struct ResidentBlock {
  std::uint64_t addr = 0, bytes = 0;
  std::uint64_t tag = 0;
  std::uint64_t resident = 0;
};

class HostMemorySampler {
 public:
  explicit HostMemorySampler(Recorder* recorder);
  ~HostMemorySampler();
  HostMemorySampler(const HostMemorySampler&) = delete;
  HostMemorySampler& operator=(const HostMemorySampler&) = delete;
  // One reading; `complete`: a reading and glibc's counters whatever the budgets (tracking's
  // start and end). The budgets: ridgescope/host_memory.h, host_budget.
  void record_now(bool complete = false) noexcept;

 private:
  Recorder* recorder_;
  std::mutex mutex_;  // leaf lock (then the CPU source's, then the Recorder's)
  std::uint32_t ids_[9] = {};
  void* mallinfo2_ = nullptr;  // glibc's mallinfo2, when present
  std::uint64_t first_reading_ns_ = 0;  // steady-clock ns of the first reading (0: none yet)
  std::uint64_t malloc_ns_ = 0;         // ns spent in mallinfo2 since then
  std::uint64_t reading_ns_ = 0;        // ns spent in readings since then, mallinfo2's aside
  std::uint64_t skipped_ = 0;           // phase ends left unread since the last reading
  std::uint64_t phase_end_readings_ = 0;  // phase ends read (the first kReadingsAlwaysTaken always)
  std::uint64_t live_high_ = 0;         // the highest live bytes of any interval so far
  // The reading's buffers, kept to reuse their memory, in memory of their own (page_arena.h:
  // they grow at the first readings, in the user's first steps, and would otherwise stay between
  // their tensors in the C heap).
  detail::PageArena arena_;  // declared before the buffers: outlives them
  std::pmr::vector<unsigned char> pages_{&arena_};  // mincore's buffer
  std::pmr::vector<CpuBlock> unmeasured_{&arena_};
  std::pmr::vector<ResidentBlock> ask_{&arena_};
  // /proc/self/status and /proc/self/statm, open in process pid_ (-1: not yet, or not readable).
  int status_fd_ = -1, statm_fd_ = -1;
  int pid_ = -1;
  ProcStatus last_status_;  // the last reading of the status file
  bool read_proc(int* fd, const char* path, std::string* out) noexcept;
  ProcStatus read_status() noexcept;
};

// Fills each block's resident bytes (its own bytes on resident pages: a page shared with another
// block counts for each only its part) and sorts the list by address. Blocks must not overlap;
// unmapped ranges count as not resident. `pages` is scratch space.
void measure_resident(std::pmr::vector<ResidentBlock>& blocks, std::pmr::vector<unsigned char>& pages);
// The sum of measure_resident over (address, bytes) ranges.
std::uint64_t resident_part(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges,
                            std::pmr::vector<unsigned char>& pages);

}  // namespace ridgescope::sources
