#include "host_memory_source.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "cpu_allocator_source.h"
#include "ridgescope/clock.h"
#include "ridgescope/host_memory.h"

namespace ridgescope::sources {

namespace {

// glibc's struct mallinfo2 (malloc.h, glibc 2.33+): declared here so that the build needs no
// particular glibc and the function is looked up at run time.
struct Mallinfo2 {
  std::size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
};
using Mallinfo2Fn = Mallinfo2 (*)();

constexpr std::uint64_t kMaxChunkPages = 16384;  // one mincore covers at most 64 MiB of 4 KiB pages
constexpr std::uint64_t kMaxGapPages = 64;       // blocks this close share one mincore (the pages
                                                 // between them cost less than another call)

}  // namespace

void measure_resident(std::pmr::vector<ResidentBlock>& blocks, std::pmr::vector<unsigned char>& pages) {
  for (ResidentBlock& b : blocks) b.resident = 0;
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (page_size <= 0 || blocks.empty()) return;
  const std::uint64_t P = static_cast<std::uint64_t>(page_size);
  if ((P & (P - 1)) != 0) return;  // page sizes are powers of two
  const int shift = __builtin_ctzll(P);
  std::sort(blocks.begin(), blocks.end(), [](const ResidentBlock& a, const ResidentBlock& b) { return a.addr < b.addr; });
  const auto first_page = [shift](const ResidentBlock& b) { return b.addr >> shift; };
  const auto end_page = [P, shift](const ResidentBlock& b) { return (b.addr + b.bytes + P - 1) >> shift; };
  // Adds to blocks [i, j] their bytes on the resident pages of one mincore answer for pages
  // [chunk, chunk_end): a partial first and last page by the overlap, the pages between whole.
  auto count = [&](std::size_t i, std::size_t j, std::uint64_t chunk, std::uint64_t chunk_end) {
    const unsigned char* resident = pages.data();  // resident[k]: page chunk + k
    for (std::size_t b = i; b <= j; ++b) {
      const std::uint64_t lo = std::max(blocks[b].addr, chunk << shift);
      const std::uint64_t hi = std::min(blocks[b].addr + blocks[b].bytes, chunk_end << shift);
      if (lo >= hi) continue;
      const std::uint64_t first = (lo >> shift) - chunk, last = ((hi - 1) >> shift) - chunk;
      std::uint64_t& total = blocks[b].resident;
      if (first == last) {
        if (resident[first] & 1) total += hi - lo;
        continue;
      }
      if (resident[first] & 1) total += ((first + chunk + 1) << shift) - lo;
      if (resident[last] & 1) total += hi - ((last + chunk) << shift);
      std::uint64_t whole = 0;
      for (std::uint64_t k = first + 1; k < last; ++k) whole += resident[k] & 1;
      total += whole << shift;
    }
  };
  // One mincore answers for a group of blocks at most kMaxGapPages apart whose pages lie within
  // kMaxChunkPages: blocks of the heap sit close together, and the system call costs more than
  // scanning the few pages between them. A group whose range is not wholly mapped (mincore
  // fails: large blocks are mappings of their own, with unmapped gaps between them) is asked
  // block by block, in chunks.
  std::size_t i = 0;
  while (i < blocks.size()) {
    const std::uint64_t first = first_page(blocks[i]);
    std::uint64_t end = end_page(blocks[i]);
    std::size_t j = i;
    while (j + 1 < blocks.size() && first_page(blocks[j + 1]) <= end + kMaxGapPages &&
           end_page(blocks[j + 1]) - first <= kMaxChunkPages) {
      end = std::max(end, end_page(blocks[++j]));
    }
    if (end - first <= kMaxChunkPages) {
      pages.resize(end - first);
      if (::mincore(reinterpret_cast<void*>(first << shift), (end - first) << shift, pages.data()) == 0) {
        count(i, j, first, end);
        i = j + 1;
        continue;
      }
    }
    for (std::size_t b = i; b <= j; ++b) {  // block by block (a large one in chunks)
      for (std::uint64_t chunk = first_page(blocks[b]); chunk < end_page(blocks[b]); chunk += kMaxChunkPages) {
        const std::uint64_t chunk_end = std::min(end_page(blocks[b]), chunk + kMaxChunkPages);
        pages.resize(chunk_end - chunk);
        if (::mincore(reinterpret_cast<void*>(chunk << shift), (chunk_end - chunk) << shift, pages.data()) != 0) {
          continue;  // freed meanwhile: not counted
        }
        count(b, b, chunk, chunk_end);
      }
    }
    i = j + 1;
  }
}

std::uint64_t resident_part(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges,
                            std::pmr::vector<unsigned char>& pages) {
  std::pmr::vector<ResidentBlock> blocks;
  blocks.reserve(ranges.size());
  for (const auto& [addr, bytes] : ranges) blocks.push_back({addr, bytes, 0});
  measure_resident(blocks, pages);
  std::uint64_t total = 0;
  for (const ResidentBlock& b : blocks) total += b.resident;
  return total;
}

HostMemorySampler::HostMemorySampler(Recorder* recorder) : recorder_(recorder) {
  namespace k = host_sample;
  const std::string_view keys[9] = {k::kTorchAllocated, k::kTorchResident, k::kMallocInUse,
                                    k::kMallocFree,      k::kRssAnon,        k::kRssFile,
                                    k::kRssShmem,        k::kReadingsSkipped, k::kResident};
  for (int i = 0; i < 9; ++i) ids_[i] = recorder->intern(keys[i]);
  mallinfo2_ = dlsym(RTLD_DEFAULT, "mallinfo2");
}

HostMemorySampler::~HostMemorySampler() {
  if (status_fd_ >= 0) ::close(status_fd_);
  if (statm_fd_ >= 0) ::close(statm_fd_);
}

// The whole of a /proc file, read from its start through a descriptor kept open (a /proc file
// is generated again at every read from offset 0). Reopened in a forked child: /proc/self was
// resolved to the parent when it was opened.
bool HostMemorySampler::read_proc(int* fd, const char* path, std::string* out) noexcept {
  if (*fd < 0) *fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (*fd < 0) return false;
  char buf[4096];
  out->clear();
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(*fd, buf, sizeof buf, at);
    if (n <= 0) break;
    out->append(buf, static_cast<std::size_t>(n));
    at += n;
    if (out->size() > (1u << 20)) break;  // /proc/self/status is a few KiB
  }
  return !out->empty();
}

ProcStatus HostMemorySampler::read_status() noexcept {
  const int pid = static_cast<int>(::getpid());
  if (pid != pid_) {
    if (status_fd_ >= 0) ::close(status_fd_);
    if (statm_fd_ >= 0) ::close(statm_fd_);
    status_fd_ = statm_fd_ = -1;
    last_status_ = ProcStatus{};
    pid_ = pid;
  }
  std::string text;
  bool needed = true;
  if (last_status_.ok && read_proc(&statm_fd_, "/proc/self/statm", &text)) {
    const long page = ::sysconf(_SC_PAGESIZE);
    const ProcStatus s = status_from_statm(parse_proc_statm(text), last_status_,
                                           page > 0 ? static_cast<std::uint64_t>(page) : 0, &needed);
    if (!needed) return s;
  }
  if (!read_proc(&status_fd_, "/proc/self/status", &text)) return {};
  last_status_ = parse_proc_status(text);
  return last_status_;
}

void HostMemorySampler::record_now(bool complete) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::uint64_t start = monotonic_now_ns();
    if (first_reading_ns_ == 0) first_reading_ns_ = start;
    const std::uint64_t high = cpu_take_live_high();
    const bool new_high = high > live_high_;
    if (new_high) live_high_ = high;
    namespace b = host_budget;
    if (!complete && !new_high && phase_end_readings_ >= b::kReadingsAlwaysTaken &&
        !b::within(reading_ns_, 0, b::kReadingBudget, start - first_reading_ns_)) {
      ++skipped_;
      return;
    }
    // Blocks wholly resident at an earlier reading are resident still (anonymous pages stay
    // until freed; a swapped-out page is the exception, not seen here): only the others are
    // asked, and the CPU source keeps the mark with the block.
    std::pmr::vector<CpuBlock>& unmeasured = unmeasured_;
    const CpuBlockCensus census = cpu_allocator_unmeasured_blocks(&unmeasured);
    const std::uint64_t allocated = census.allocated_bytes;
    std::uint64_t resident = census.resident_bytes;
    std::pmr::vector<ResidentBlock>& ask = ask_;
    ask.clear();
    for (const CpuBlock& b : unmeasured) ask.push_back({b.addr, b.bytes, b.serial});
    measure_resident(ask, pages_);
    std::pmr::vector<CpuBlock>& full = unmeasured;  // reused: the ones found wholly resident now
    full.clear();
    for (const ResidentBlock& b : ask) {
      resident += b.resident;
      if (b.resident == b.bytes) full.push_back({b.addr, b.bytes, b.tag});
    }
    mark_cpu_blocks_resident(full);
    Mallinfo2 m{};
    const std::uint64_t now = monotonic_now_ns();
    const bool with_malloc = mallinfo2_ != nullptr &&
                             (complete || b::within(malloc_ns_, b::kMallocAllowanceNs, b::kMallocBudget,
                                                    now - first_reading_ns_));
    std::uint64_t malloc_spent = 0;  // counted in mallinfo2's budget, not the reading's
    if (with_malloc) {
      m = reinterpret_cast<Mallinfo2Fn>(mallinfo2_)();
      malloc_spent = monotonic_now_ns() - now;
      malloc_ns_ += malloc_spent;
    }
    // The resident set last, nearest to the moment the reading stands for.
    const ProcStatus status = read_status();
    if (!status.ok) {
      reading_ns_ += monotonic_now_ns() - start - malloc_spent;
      return;
    }
    Event e;
    e.kind = EventKind::Sample;
    e.device = Device{DeviceType::CPU, -1};
    auto record = [&](int key, std::uint64_t value) {
      e.string_id = ids_[key];
      e.value = value;
      recorder_->record(e);
    };
    record(0, allocated);
    record(1, resident);
    if (with_malloc) {
      record(2, m.uordblks + m.hblkhd);
      record(3, m.fordblks);
    }
    if (status.anon + status.file + status.shmem != 0) {
      record(4, status.anon);
      record(5, status.file);
      record(6, status.shmem);
    }
    if (skipped_ != 0) record(7, skipped_);
    skipped_ = 0;
    record(8, status.resident);  // last: completes the reading
    reading_ns_ += monotonic_now_ns() - start - malloc_spent;
    if (!complete) ++phase_end_readings_;
  } catch (...) {
    // out of memory copying the block list: no reading this time
  }
}

}  // namespace ridgescope::sources
