// host_memory_source.h — the host's resident set at every phase boundary, for the three layers
// of ridgescope/host_memory.h (docs/forensics.md, "Host memory: the three layers").
//
// record_now() reads /proc/self/status (VmRSS, RssAnon, RssFile, RssShmem), glibc's allocator
// counters (mallinfo2, resolved at run time: absent before glibc 2.33 or with another libc) and
// the resident part of torch's live CPU blocks (mincore over each block's pages; a page shared
// with another allocation counts only the block's own bytes of it), and writes them as CPU
// `sample` events under the keys of ridgescope/host_memory.h, the resident set last. Nothing is
// synchronised with the training loop: a thread allocating meanwhile moves the figures by what
// it allocates.
//
// Cost: one read of /proc/self/status, one mallinfo2 (it walks glibc's free lists), and one
// mincore per run of adjacent torch blocks (at most 64 MiB of pages each). Not a hot path: it
// runs at phase boundaries on the thread that crosses them.
// Thread-safety: record_now() from any thread; one reading at a time.
#pragma once

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "ridgescope/recorder.h"

namespace ridgescope::sources {

class HostMemorySampler {
 public:
  explicit HostMemorySampler(Recorder* recorder);
  void record_now() noexcept;

 private:
  Recorder* recorder_;
  std::mutex mutex_;  // leaf lock (then the CPU source's, then the Recorder's)
  std::uint32_t ids_[8] = {};
  void* mallinfo2_ = nullptr;  // glibc's mallinfo2, when present
  std::vector<unsigned char> pages_;  // mincore's buffer
};

// The bytes of `blocks` (address, bytes) whose pages are resident, each block counting only its
// own bytes of a page. Blocks must not overlap; unmapped ranges count as not resident.
// `pages` is scratch space.
std::uint64_t resident_part(std::vector<std::pair<std::uint64_t, std::uint64_t>> blocks,
                            std::vector<unsigned char>& pages);

}  // namespace ridgescope::sources
