#include "host_memory_source.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "cpu_allocator_source.h"
#include "ridgescope/host_memory.h"

namespace ridgescope::sources {

namespace {

// glibc's struct mallinfo2 (malloc.h, glibc 2.33+): declared here so that the build needs no
// particular glibc and the function is looked up at run time.
struct Mallinfo2 {
  std::size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
};
using Mallinfo2Fn = Mallinfo2 (*)();

bool read_file(const char* path, std::string* out) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[4096];
  out->clear();
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out->append(buf, static_cast<std::size_t>(n));
    if (out->size() > (1u << 20)) break;  // /proc/self/status is a few KiB
  }
  ::close(fd);
  return !out->empty();
}

constexpr std::uint64_t kMaxChunkPages = 16384;  // one mincore covers at most 64 MiB of 4 KiB pages

}  // namespace

std::uint64_t resident_part(std::vector<std::pair<std::uint64_t, std::uint64_t>> blocks,
                            std::vector<unsigned char>& pages) {
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (page_size <= 0 || blocks.empty()) return 0;
  const std::uint64_t P = static_cast<std::uint64_t>(page_size);
  std::sort(blocks.begin(), blocks.end());
  std::uint64_t total = 0;
  std::size_t i = 0;
  while (i < blocks.size()) {
    // A run of blocks whose pages touch: one range of pages [first, end), all mapped.
    const std::uint64_t first = blocks[i].first / P;
    std::uint64_t end = (blocks[i].first + blocks[i].second + P - 1) / P;
    std::size_t j = i;
    while (j + 1 < blocks.size() && blocks[j + 1].first / P <= end) {
      ++j;
      end = std::max(end, (blocks[j].first + blocks[j].second + P - 1) / P);
    }
    std::size_t k = i;  // the first block that may overlap the chunk
    for (std::uint64_t chunk = first; chunk < end; chunk += kMaxChunkPages) {
      const std::uint64_t chunk_end = std::min(end, chunk + kMaxChunkPages);
      const std::uint64_t n = chunk_end - chunk;
      pages.resize(n);
      if (::mincore(reinterpret_cast<void*>(chunk * P), n * P, pages.data()) != 0) continue;  // freed meanwhile
      while (k <= j && blocks[k].first + blocks[k].second <= chunk * P) ++k;
      for (std::size_t b = k; b <= j && blocks[b].first < chunk_end * P; ++b) {
        const std::uint64_t lo = std::max(blocks[b].first, chunk * P);
        const std::uint64_t hi = std::min(blocks[b].first + blocks[b].second, chunk_end * P);
        for (std::uint64_t at = lo; at < hi;) {
          const std::uint64_t page = at / P;
          const std::uint64_t next = std::min(hi, (page + 1) * P);
          if (pages[page - chunk] & 1) total += next - at;
          at = next;
        }
      }
    }
    i = j + 1;
  }
  return total;
}

HostMemorySampler::HostMemorySampler(Recorder* recorder) : recorder_(recorder) {
  namespace k = host_sample;
  const std::string_view keys[8] = {k::kTorchAllocated, k::kTorchResident, k::kMallocInUse, k::kMallocFree,
                                    k::kRssAnon,        k::kRssFile,       k::kRssShmem,    k::kResident};
  for (int i = 0; i < 8; ++i) ids_[i] = recorder->intern(keys[i]);
  mallinfo2_ = dlsym(RTLD_DEFAULT, "mallinfo2");
}

void HostMemorySampler::record_now() noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::pair<std::uint64_t, std::uint64_t>> blocks = cpu_allocator_blocks();
    std::uint64_t allocated = 0;
    for (const auto& b : blocks) allocated += b.second;
    const std::uint64_t resident = resident_part(std::move(blocks), pages_);
    Mallinfo2 m{};
    if (mallinfo2_ != nullptr) m = reinterpret_cast<Mallinfo2Fn>(mallinfo2_)();
    // The resident set last, nearest to the moment the reading stands for.
    std::string text;
    if (!read_file("/proc/self/status", &text)) return;
    const ProcStatus status = parse_proc_status(text);
    if (!status.ok) return;
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
    if (mallinfo2_ != nullptr) {
      record(2, m.uordblks + m.hblkhd);
      record(3, m.fordblks);
    }
    if (status.anon + status.file + status.shmem != 0) {
      record(4, status.anon);
      record(5, status.file);
      record(6, status.shmem);
    }
    record(7, status.resident);  // last: completes the reading
  } catch (...) {
    // out of memory copying the block list: no reading this time
  }
}

}  // namespace ridgescope::sources
