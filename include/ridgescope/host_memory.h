// ridgescope/host_memory.h — the process's resident set in three layers (docs/forensics.md,
// "Host memory: the three layers"): what PyTorch's live CPU tensors hold of it, what the C
// allocator keeps free, and everything else, with everything else itemised and its remainder
// named.
//
// The readings (HostReading) are taken when tracking starts, at phase ends (all of them while
// the readings cost little, then under a time budget that never skips a new high of torch's
// live CPU bytes: csrc/torch/host_memory_source.h) and when it stops, by the session
// (csrc/torch/host_memory_source.cpp) and written as CPU `sample` events under the keys below;
// the analysis decomposes each reading with decompose_host_memory(). Every figure but the
// remainder is measured:
//
//   resident                 /proc/self/status VmRSS (= RssAnon + RssFile + RssShmem)
//   PyTorch                  the resident part of the live blocks torch's CPU allocator handed
//                            out: mincore() over each block's pages, each block counting only
//                            its own bytes of a page (a tensor allocated but never written has
//                            no resident pages: its bytes are "untouched", not in the set)
//   allocator slack          glibc's free bytes in its arenas (mallinfo2().fordblks): freed
//                            chunks the C allocator keeps for reuse. An upper bound of their
//                            resident share (a chunk freed before it was ever written, or a
//                            trimmed top, holds no pages); capped so that the layers never
//                            exceed the anonymous resident set
//   everything else          resident − PyTorch − slack, itemised as
//     files and libraries    RssFile: shared libraries' code and data, memory-mapped files
//     shared memory          RssShmem: DataLoader workers' batches, /dev/shm, shared tensors
//     other heap             glibc's bytes in use (uordblks + hblkhd) − torch's live blocks:
//                            Python objects above 512 B, numpy arrays, other libraries' heaps
//                            (and malloc's own headers of torch's blocks)
//     remainder              what is left: anonymous memory outside malloc (Python's small-object
//                            arenas, thread stacks, libraries' own mappings, the CUDA driver's
//                            host allocations), less other heap pages never written. Signed.
//
// Thread-safety: pure functions and constants.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace ridgescope {

// Sample keys (device CPU). The source writes them in this order at one instant; the resident
// set comes last and completes the reading.
namespace host_sample {
inline constexpr std::string_view kTorchAllocated = "host_torch_allocated_bytes";  // live blocks torch's allocator made
inline constexpr std::string_view kTorchResident = "host_torch_resident_bytes";    // their resident part
inline constexpr std::string_view kMallocInUse = "host_malloc_in_use_bytes";       // uordblks + hblkhd
inline constexpr std::string_view kMallocFree = "host_malloc_free_bytes";          // fordblks
inline constexpr std::string_view kRssAnon = "host_rss_anon_bytes";
inline constexpr std::string_view kRssFile = "host_rss_file_bytes";
inline constexpr std::string_view kRssShmem = "host_rss_shmem_bytes";
// Phase ends the source's time budget left unread since the reading before this one (written
// only when not zero, before the resident set).
inline constexpr std::string_view kReadingsSkipped = "host_readings_skipped";
inline constexpr std::string_view kResident = "host_resident_bytes";  // VmRSS; completes a reading
}  // namespace host_sample

// The source's budgets (csrc/torch/host_memory_source.h), carried in the report
// (host_memory.reading_share, ...) so that every reporter says the same. Two, each on its own
// part of a reading: the first kReadingsAlwaysTaken phase ends of a session are read (a short
// run has every one; a count, so that a loaded machine, which stretches the readings' wall time,
// cannot take them away), then a phase end only while the readings (glibc's counters aside)
// have taken at most 1/kReadingBudget of the session's time, a new high of torch's live CPU
// bytes whatever the budget; glibc's counters, within a reading, after kMallocAllowanceNs only
// while they take at most 1/kMallocBudget of it. Together at most 0.15 % of the session's time
// once the first readings are paid for.
namespace host_budget {
inline constexpr std::uint64_t kReadingsAlwaysTaken = 32;     // phase ends
inline constexpr std::uint64_t kReadingBudget = 1000;         // 0.1 %
inline constexpr std::uint64_t kMallocBudget = 2000;          // 0.05 %
inline constexpr std::uint64_t kMallocAllowanceNs = 1000000;  // 1 ms

// The one time rule of both: whether a part that has cost `spent_ns` so far may run again,
// `elapsed_ns` after the session's first reading: while under its allowance, then while it has
// taken at most 1/`budget` of the elapsed time.
constexpr bool within(std::uint64_t spent_ns, std::uint64_t allowance_ns, std::uint64_t budget,
                      std::uint64_t elapsed_ns) noexcept {
  return spent_ns < allowance_ns || spent_ns * budget <= elapsed_ns;
}
}  // namespace host_budget

// What /proc/self/status says (bytes). ok is false when VmRSS was not found.
struct ProcStatus {
  bool ok = false;
  std::uint64_t resident = 0, anon = 0, file = 0, shmem = 0;
};
// Parses the text of /proc/self/status ("VmRSS:   123 kB" lines; kB are KiB). Lines it does not
// know are ignored; a kernel without the split counters (RssAnon, ...; before Linux 4.5) gives
// resident alone.
ProcStatus parse_proc_status(std::string_view text) noexcept;

// What /proc/self/statm says, in pages: the resident set and its shared part (RssFile +
// RssShmem; the kernel's own sums, the same counters /proc/self/status reads). ok is false
// when the text has not at least three numbers.
struct ProcStatm {
  bool ok = false;
  std::uint64_t resident_pages = 0, shared_pages = 0;
};
ProcStatm parse_proc_statm(std::string_view text) noexcept;

// A reading from /proc/self/statm (two counters, several times cheaper to read than the
// status file) and the last /proc/self/status reading with the split: while the shared part
// (file + shmem pages) is what that status reading said, the split is that reading's file and
// shmem with anon = resident - shared, and *status_needed is false; otherwise (the shared part
// moved, the last reading had no split, or statm is unreadable) *status_needed is true and the
// result is not ok: the caller reads /proc/self/status instead. page_bytes is the page size.
ProcStatus status_from_statm(const ProcStatm& statm, const ProcStatus& last, std::uint64_t page_bytes,
                             bool* status_needed) noexcept;

// One reading, in bytes. Absent figures were not available where it was taken.
struct HostReading {
  std::uint64_t resident = 0;
  std::optional<std::uint64_t> rss_anon, rss_file, rss_shmem;
  std::uint64_t torch_allocated = 0;  // live bytes of the blocks torch's CPU allocator made
  std::optional<std::uint64_t> torch_resident;  // their resident part (mincore)
  std::optional<std::uint64_t> malloc_in_use, malloc_free;  // glibc mallinfo2
};

struct HostLayers {
  std::uint64_t resident = 0;          // = pytorch + slack + outside
  std::uint64_t pytorch = 0;           // resident bytes of torch's live CPU blocks
  std::uint64_t untouched = 0;         // torch's live bytes with no resident page (not in resident)
  std::uint64_t slack = 0;             // the C allocator's free bytes (capped)
  std::uint64_t outside = 0;           // everything else
  // outside, itemised (files + shared_memory + other_heap + remainder = outside)
  std::uint64_t files = 0, shared_memory = 0, other_heap = 0;
  std::int64_t remainder = 0;
  bool residency_known = false;  // torch's blocks were measured with mincore (else pytorch =
                                 // their live bytes, capped at the resident set)
  bool split_known = false;   // the kernel gave RssFile and RssShmem
  bool malloc_known = false;  // glibc's counters were read
  // glibc's in-use bytes were below torch's live blocks: another allocator (jemalloc, tcmalloc)
  // serves malloc, and its memory is in the remainder, not in the slack or the other heap
  bool malloc_misses_torch = false;
};

HostLayers decompose_host_memory(const HostReading& reading) noexcept;

}  // namespace ridgescope
