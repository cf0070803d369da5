#include "cpu_allocator_source.h"
#include "module_context.h"

#include <algorithm>
#include <atomic>
#include <mutex>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace ridgescope::sources {
namespace {

struct Entry {
  std::uint64_t bytes;
  c10::DeleterFnPtr inner_deleter;
  std::uint32_t generation;  // the session that counts this block (0: none)
  std::uint64_t serial = 0;  // unique per allocation (an address is reused; a serial never is)
  bool resident = false;     // wholly resident at a host reading: not asked again (host_memory_source)
};

// Everything below is guarded by g_mutex, a leaf lock except for the Recorder's own leaf lock,
// which is always taken after it.
std::mutex g_mutex;
absl::flat_hash_map<void*, Entry>* g_blocks = nullptr;  // leaked: blocks outlive sessions
Recorder* g_recorder = nullptr;
SiteCapture* g_sites = nullptr;  // where allocations are made (may be null)
std::uint32_t g_generation = 0;
std::uint64_t g_live_bytes = 0;
std::uint64_t g_live_high = 0;  // the most g_live_bytes since the last cpu_take_live_high()
std::uint64_t g_serial = 0;  // the last Entry::serial given
// Simulated device capacity in bytes (0: none). Atomic because allocate() reads it before
// taking the lock, so that runs without a capacity pay one relaxed load and nothing more.
std::atomic<std::uint64_t> g_capacity{0};
// Adopted storages whose context is not ours to wrap (memory-mapped, shared, from_blob): counted
// from adoption on, their frees unobservable. Cleared per session.
absl::flat_hash_set<void*>* g_foreign = nullptr;

// Set while this thread is inside the source, so that an allocation made by the recording
// itself (none today: the recorder uses the C++ heap) could never recurse into the source.
thread_local bool t_in_source = false;

const Device kCpu{DeviceType::CPU, -1};

void record_locked(EventKind kind, void* ptr, std::uint64_t bytes, std::uint32_t stack = 0) noexcept {
  if (g_recorder == nullptr) return;
  Event e;
  e.kind = kind;
  e.device = kCpu;
  e.addr = reinterpret_cast<std::uint64_t>(ptr);
  e.bytes = bytes;
  e.requested_bytes = kind == EventKind::Alloc ? bytes : 0;
  if (kind == EventKind::Alloc) {
    e.string_id = current_module_context();
    e.stack_id = stack;
  }
  // By reference: an Event passed by value was copied with 16-byte loads right after its fields'
  // narrower stores, a store-forwarding stall on every allocation and free (docs/performance.md).
  g_recorder->record(e);
}

// The stack of a storage adopted at session start (it existed before tracking).
std::uint32_t pre_existing_locked() noexcept { return g_sites != nullptr ? g_sites->pre_existing() : 0; }

void tracked_delete(void* ptr) {
  c10::DeleterFnPtr inner = &c10::free_cpu;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_blocks->find(ptr);
    if (it != g_blocks->end()) {
      inner = it->second.inner_deleter;
      // Recorded before the memory is released, so no other thread can be handed this address
      // and record its allocation ahead of this free.
      if (g_recorder != nullptr && it->second.generation == g_generation && !t_in_source) {
        g_live_bytes -= it->second.bytes;
        record_locked(EventKind::Free, ptr, it->second.bytes);
      }
      g_blocks->erase(it);
    }
  }
  inner(ptr);
}

class TrackingCpuAllocator final : public c10::Allocator {
 public:
  c10::Allocator* inner = nullptr;

  c10::DataPtr allocate(size_t n) override {
    bool& in_source = t_in_source;  // one TLS access for the whole call
    if (g_capacity.load(std::memory_order_relaxed) != 0 && !in_source) check_capacity(n);
    c10::DataPtr dp = inner->allocate(n);
    void* ptr = dp.get();
    if (ptr == nullptr || in_source || dp.get_context() != ptr) {
      // Empty, reentrant, or a wrapped context we cannot adopt without changing its meaning.
      return dp;
    }
    in_source = true;
    try {
      std::lock_guard<std::mutex> lock(g_mutex);
      const std::uint32_t generation = g_recorder != nullptr ? g_generation : 0;
      g_blocks->insert_or_assign(ptr, Entry{n, dp.get_deleter(), generation, ++g_serial});
      if (dp.compare_exchange_deleter(dp.get_deleter(), &tracked_delete)) {
        if (generation != 0) {
          g_live_bytes += n;
          if (g_live_bytes > g_live_high) g_live_high = g_live_bytes;
          // Where it is being made: read on this thread (no GIL; site_capture.h), under this
          // source's lock, which session stop also takes, so the capture never outlives it.
          record_locked(EventKind::Alloc, ptr, n, g_sites != nullptr ? g_sites->capture() : 0);
        }
      } else {
        g_blocks->erase(ptr);
      }
    } catch (...) {
      // Out of memory in the table: the block is simply not tracked.
    }
    in_source = false;
    return dp;
  }

  c10::DeleterFnPtr raw_deleter() const override { return &tracked_delete; }

  // The simulated capacity: records the failed request with what was live, makes sure the trace
  // is on disk, then fails the allocation as a device out of memory would.
  [[gnu::cold, gnu::noinline]] static void check_capacity(std::size_t n) {
    Recorder* recorder = nullptr;
    std::uint64_t live = 0, capacity = 0;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      capacity = g_capacity.load(std::memory_order_relaxed);
      if (g_recorder == nullptr || capacity == 0 || g_live_bytes + n <= capacity) return;
      live = g_live_bytes;
      Event e;
      e.kind = EventKind::Oom;
      e.device = kCpu;
      e.bytes = n;
      e.value = capacity > live ? capacity - live : 0;  // what the "device" reports free
      g_recorder->record(e);
      recorder = g_recorder;
    }
    // Outside the source's lock: other threads keep allocating and freeing while this waits.
    recorder->flush();
    TORCH_CHECK_WITH(OutOfMemoryError, false,
                     "CPU out of memory (ridgescope's simulated capacity of ", capacity,
                     " bytes). Tried to allocate ", n, " bytes with ", live,
                     " bytes in use. The trace holds what was live: `ridgescope report ",
                     recorder->path(), "`.");
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

// A function-local static that is never destroyed: storages allocated through it may be freed
// during interpreter shutdown, after static destructors ran.
TrackingCpuAllocator& tracking_allocator() {
  static auto* allocator = new TrackingCpuAllocator();
  return *allocator;
}

c10::Allocator* g_previous = nullptr;
std::uint8_t g_priority = 0;

}  // namespace

bool install_cpu_allocator_source(Recorder* recorder, std::uint64_t capacity_bytes, SiteCapture* sites) {
  TrackingCpuAllocator& tracking = tracking_allocator();
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_recorder != nullptr) return false;
    if (g_blocks == nullptr) g_blocks = new absl::flat_hash_map<void*, Entry>();
    if (g_foreign == nullptr) g_foreign = new absl::flat_hash_set<void*>();
    g_foreign->clear();
    g_recorder = recorder;
    g_sites = sites;
    ++g_generation;
    g_live_bytes = 0;
    g_live_high = 0;
    g_capacity = capacity_bytes;
  }
  c10::Allocator* current = c10::GetCPUAllocator();
  if (current != &tracking) {
    tracking.inner = current;
    g_previous = current;
    // c10 replaces a registered allocator only at an equal or higher priority; find the lowest
    // that takes, so that restoring at the same priority later works.
    for (int priority = 0; priority <= 255; ++priority) {
      c10::SetCPUAllocator(&tracking, static_cast<std::uint8_t>(priority));
      if (c10::GetCPUAllocator() == &tracking) {
        g_priority = static_cast<std::uint8_t>(priority);
        break;
      }
    }
  }
  return true;
}

void uninstall_cpu_allocator_source() {
  if (g_previous != nullptr && c10::GetCPUAllocator() == &tracking_allocator()) {
    c10::SetCPUAllocator(g_previous, g_priority);
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_recorder = nullptr;
  g_sites = nullptr;
  g_live_bytes = 0;
  g_live_high = 0;
  g_capacity = 0;
}

std::uint64_t register_cpu_storage(c10::StorageImpl* storage) {
  if (storage == nullptr || storage->device_type() != c10::DeviceType::CPU) return 0;
  c10::DataPtr& dp = storage->_mutable_data_ptr_no_checks();
  void* ptr = dp.get();
  if (ptr == nullptr) return 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_recorder == nullptr) return 0;
  auto it = g_blocks->find(ptr);
  if (dp.get_deleter() == &tracked_delete && it != g_blocks->end()) {
    if (it->second.generation == g_generation) return 0;  // already counted in this session
    it->second.generation = g_generation;
    it->second.resident = false;
    g_live_bytes += it->second.bytes;
    record_locked(EventKind::Alloc, ptr, it->second.bytes, pre_existing_locked());
    return it->second.bytes;
  }
  const std::uint64_t bytes = storage->nbytes();
  if (dp.get_context() == ptr) {
    const c10::DeleterFnPtr inner = dp.get_deleter();
    g_blocks->insert_or_assign(ptr, Entry{bytes, inner, g_generation, ++g_serial});
    if (!dp.compare_exchange_deleter(inner, &tracked_delete)) {
      g_blocks->erase(ptr);
      return 0;
    }
    g_live_bytes += bytes;
    record_locked(EventKind::Alloc, ptr, bytes, pre_existing_locked());
    return bytes;
  }
  // A storage with a context of its own (memory-mapped, shared, from_blob): counted from now
  // on, but its free cannot be observed.
  if (!g_foreign->insert(ptr).second) return 0;
  g_live_bytes += bytes;
  record_locked(EventKind::Alloc, ptr, bytes, pre_existing_locked());
  return bytes;
}

bool cpu_allocator_source_installed() {
  return c10::GetCPUAllocator() == &tracking_allocator();
}

std::uint64_t cpu_live_bytes() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_live_bytes;
}

std::uint64_t cpu_take_live_high() {
  std::lock_guard<std::mutex> lock(g_mutex);
  const std::uint64_t high = std::max(g_live_high, g_live_bytes);
  g_live_high = g_live_bytes;
  return high;
}

std::uint64_t cpu_block_serial(std::uint64_t addr) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_recorder == nullptr || g_blocks == nullptr) return 0;
  auto it = g_blocks->find(reinterpret_cast<void*>(addr));
  return it != g_blocks->end() && it->second.generation == g_generation ? it->second.serial : 0;
}

CpuBlockCensus cpu_allocator_unmeasured_blocks(std::pmr::vector<CpuBlock>* unmeasured) {
  CpuBlockCensus census;
  unmeasured->clear();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_recorder == nullptr || g_blocks == nullptr) return census;
  for (const auto& [ptr, entry] : *g_blocks) {
    if (entry.generation != g_generation) continue;
    census.allocated_bytes += entry.bytes;
    if (entry.resident) {
      census.resident_bytes += entry.bytes;
    } else {
      unmeasured->push_back({reinterpret_cast<std::uint64_t>(ptr), entry.bytes, entry.serial});
    }
  }
  return census;
}

void mark_cpu_blocks_resident(const std::pmr::vector<CpuBlock>& blocks) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_recorder == nullptr || g_blocks == nullptr) return;
  for (const CpuBlock& b : blocks) {
    auto it = g_blocks->find(reinterpret_cast<void*>(b.addr));
    // The same allocation still (freed meanwhile and its address reused: a new serial).
    if (it != g_blocks->end() && it->second.serial == b.serial && it->second.generation == g_generation) {
      it->second.resident = true;
    }
  }
}

void record_cpu_live_sample(std::uint32_t sample_name_id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_recorder == nullptr) return;
  Event e;
  e.kind = EventKind::Sample;
  e.device = kCpu;
  e.string_id = sample_name_id;
  e.value = g_live_bytes;
  g_recorder->record(e);
}

}  // namespace ridgescope::sources
