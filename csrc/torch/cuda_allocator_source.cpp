#include "cuda_allocator_source.h"

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "device_memory_epoch.h"
#include "json_writer.h"
#include "module_context.h"
#include "ridgescope/cuda_trace.h"

#ifdef RIDGESCOPE_WITH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/version.h>
// The cuBLAS / cuBLASLt workspace maps (at::cuda::cublas_handle_stream_to_workspace), to tell
// workspace blocks from tensors. The header pulls in the cuBLAS, cuSPARSE and cuSOLVER
// headers; where the CUDA headers found lack them, workspaces are simply not tagged.
#if __has_include(<cublas_v2.h>) && __has_include(<cublasLt.h>) && __has_include(<cusparse.h>) && \
    __has_include(<cusolverDn.h>)
#include <ATen/cuda/CUDAContextLight.h>
#include <dlfcn.h>
#include <shared_mutex>
#define RIDGESCOPE_CUBLAS_WORKSPACES 1
#endif
#endif

namespace ridgescope::sources {
namespace {

// Trampoline modes. Off: no session (one relaxed load, nothing else). Counting: the start-up
// snapshot is being taken; entries are only counted, so that an allocation racing with it is
// detected and the snapshot retaken. Live: entries are translated and recorded.
enum Mode : int { kOff = 0, kCounting = 1, kLive = 2 };

std::atomic<int> g_mode{kOff};
std::atomic<bool> g_polling{false};  // unsupported backend: statistics sampled at boundaries

// Guarded by g_mutex, a leaf lock except for the Recorder's own leaf lock, always taken after
// it. The trampoline takes it while torch holds the allocator's device lock, so nothing here
// may call into torch's allocator while holding it (lock order: allocator, then g_mutex).
std::mutex g_mutex;
Recorder* g_recorder = nullptr;
SiteCapture* g_sites = nullptr;  // where allocations are made (may be null)
// Leaked on purpose, like the CPU source's table: torch may free CUDA memory (and call the
// trampoline) during static destruction, after our own statics would have been destroyed.
CudaTraceTranslator* g_translator = nullptr;
std::vector<Event>* const g_events = new std::vector<Event>();  // reused: no allocation per entry once warm
std::uint64_t g_counted = 0;      // non-snapshot entries seen in Counting mode
std::uint64_t g_oom_reports = 0;  // OOM observer calls
std::uint64_t g_dropped_reentrant = 0;
int g_devices = 0;
std::string g_backend;

// Set while this thread is inside the trampoline. Nothing the trampoline does allocates through
// torch today; if that ever changed, a nested call would re-enter the allocator (its mutex is
// recursive) and this source's non-recursive mutex would deadlock. The guard makes that a
// counted drop instead.
thread_local bool t_in_trampoline = false;

void record_all_locked() noexcept {
  if (g_recorder == nullptr) return;
  for (const Event& e : *g_events) g_recorder->record(e);
}

#ifdef RIDGESCOPE_WITH_CUDA
namespace cca = c10::cuda::CUDACachingAllocator;
using TorchTraceEntry = cca::TraceEntry;

// Every torch this file supports (2.11 through 2.14, design.md §8) has what the `if constexpr`
// adapters below prefer; checked here so that a header change fails the build instead of
// silently taking a fallback (no include_traces: a snapshot that copies the whole trace ring; a
// missing settings field: wrong block sizes). All hold against the 2.11.0 and 2.14.1 headers.
template <class A> constexpr bool kHasSnapshotWithoutTraces = requires(A* a) { a->snapshot({0, 0}, false); };
template <class C> constexpr bool kHasRoundingSettings = requires(const C& c) {
  c.roundup_power2_divisions.size();
  c.max_split_size;
  c.expandable_segments;
};
template <class Ctx> constexpr bool kHasLazyInitDevice = requires(Ctx& c) { c.lazyInitDevice(c10::DeviceType::CUDA); };
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11)
static_assert(kHasSnapshotWithoutTraces<cca::CUDAAllocator>, "torch >= 2.11: CUDAAllocator::snapshot(MempoolId_t, bool include_traces)");
static_assert(kHasRoundingSettings<cca::AllocatorConfigInfo>,
              "torch >= 2.11: AllocatorConfigInfo has roundup_power2_divisions, max_split_size, expandable_segments");
static_assert(kHasLazyInitDevice<at::Context>, "torch >= 2.11: at::Context::lazyInitDevice");
#endif

CudaTraceAction to_action(const TorchTraceEntry& te) noexcept {
  // TraceEntry::Action grows between releases (ANNOTATE in 2.14): anything not listed here is
  // Unknown and counted.
  switch (te.action_) {
    case TorchTraceEntry::ALLOC: return CudaTraceAction::Alloc;
    case TorchTraceEntry::FREE_REQUESTED: return CudaTraceAction::FreeRequested;
    case TorchTraceEntry::FREE_COMPLETED: return CudaTraceAction::FreeCompleted;
    case TorchTraceEntry::SEGMENT_ALLOC: return CudaTraceAction::SegmentAlloc;
    case TorchTraceEntry::SEGMENT_FREE: return CudaTraceAction::SegmentFree;
    case TorchTraceEntry::SEGMENT_MAP: return CudaTraceAction::SegmentMap;
    case TorchTraceEntry::SEGMENT_UNMAP: return CudaTraceAction::SegmentUnmap;
    case TorchTraceEntry::SNAPSHOT: return CudaTraceAction::Snapshot;
    case TorchTraceEntry::OOM: return CudaTraceAction::Oom;
    default: return CudaTraceAction::Unknown;
  }
}

// The thin adapter: reads fields, never constructs a TraceEntry (its constructor changes in
// nearly every release). stream_ is cudaStream_t before 2.11 and void* from 2.11 on (seen in the
// 2.11.0 headers); both cast.
CudaTraceEntry adapt(const TorchTraceEntry& te) noexcept {
  CudaTraceEntry e;
  e.action = to_action(te);
  e.device = static_cast<std::int16_t>(te.device_);
  e.addr = static_cast<std::uint64_t>(te.addr_);
  e.size = static_cast<std::uint64_t>(te.size_);
  e.stream = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(te.stream_));
  return e;
}

// The static trampoline torch calls for every trace entry, under the allocator's device lock.
void on_trace_entry(const TorchTraceEntry& te) noexcept {
  if (g_mode.load(std::memory_order_relaxed) == kOff) return;
  if (t_in_trampoline) {
    ++g_dropped_reentrant;  // racy count; diagnostic only
    return;
  }
  t_in_trampoline = true;
  const CudaTraceEntry entry = adapt(te);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    const int mode = g_mode.load(std::memory_order_relaxed);
    if (mode == kCounting) {
      if (entry.action != CudaTraceAction::Snapshot) ++g_counted;
    } else if (mode == kLive && g_translator != nullptr && g_recorder != nullptr) {
      g_events->clear();
      g_translator->translate(entry, g_events);
      if (entry.action == CudaTraceAction::Alloc) {
        // An alloc entry comes on the allocating thread: stamp the module running there, as the
        // CPU source does (a thread-local read), so untagged CUDA blocks carry it too, and
        // where it is being made (site_capture.h: this thread's own Python frames or autograd
        // node; no GIL, no torch call).
        const std::uint32_t context = current_module_context();
        const std::uint32_t stack = g_sites != nullptr ? g_sites->capture() : 0;
        for (Event& e : *g_events) {
          if (e.kind == EventKind::Alloc) {
            e.string_id = context;
            e.stack_id = stack;
          }
        }
      }
      record_all_locked();
      // What the driver holds changed: the NVML sampler takes a reading soon (device_memory_epoch.h).
      if (entry.action == CudaTraceAction::SegmentAlloc || entry.action == CudaTraceAction::SegmentFree ||
          entry.action == CudaTraceAction::SegmentMap || entry.action == CudaTraceAction::SegmentUnmap) {
        bump_device_memory_epoch();
      }
    }
  }
  t_in_trampoline = false;
}

// Called by torch after it released the allocator lock and before it throws
// OutOfMemoryError: the OOM entry is already recorded; write what torch reports and make sure
// the trace is on disk, so the report exists even if the process then dies.
void on_out_of_memory(std::int64_t device, std::size_t segment_bytes, std::size_t device_limit,
                      std::size_t device_free) noexcept {
  if (g_mode.load(std::memory_order_relaxed) != kLive) return;
  try {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_recorder == nullptr) return;
    ++g_oom_reports;
    detail::JsonWriter w;
    w.begin_object()
        .field("device", device)
        .field("segment_request_bytes", static_cast<std::uint64_t>(segment_bytes))
        .field("device_limit_bytes", static_cast<std::uint64_t>(device_limit))
        .field("device_free_bytes", static_cast<std::uint64_t>(device_free))
        .end_object();
    g_recorder->metadata("cuda_oom", w.take());
    g_recorder->flush();  // the writer thread never takes g_mutex or an allocator lock
  } catch (...) {
  }
}

// CUDA's lazy initialisation: lazyInitDevice (2.6+), lazyInitCUDA before.
template <class Ctx>
void init_cuda(Ctx& ctx) {
  if constexpr (requires { ctx.lazyInitDevice(c10::DeviceType::CUDA); }) {
    ctx.lazyInitDevice(c10::DeviceType::CUDA);
  } else {
    ctx.lazyInitCUDA();
  }
}

// The allocator's snapshot without its trace ring buffer where torch can leave it out (2.11+;
// with 100k entries the copy costs ~0.7 s).
template <class Alloc>
cca::SnapshotInfo take_snapshot(Alloc* allocator) {
  if constexpr (requires { allocator->snapshot({0, 0}, false); }) {
    return allocator->snapshot({0, 0}, false);
  } else {
    return allocator->snapshot();
  }
}

// The rounding rules from the snapshot's allocator settings (fields checked per release).
template <class Config>
CudaRoundingRules rules_from(const Config& cfg) {
  CudaRoundingRules rules;
  if constexpr (requires { cfg.roundup_power2_divisions; }) {
    for (std::size_t i = 0; i < rules.roundup_power2_divisions.size() && i < cfg.roundup_power2_divisions.size(); ++i) {
      rules.roundup_power2_divisions[i] = static_cast<std::uint64_t>(cfg.roundup_power2_divisions[i]);
    }
  }
  if constexpr (requires { cfg.max_split_size; }) {
    rules.max_split_size = static_cast<std::uint64_t>(cfg.max_split_size);
  }
  if constexpr (requires { cfg.expandable_segments; }) {
    rules.expandable_segments = cfg.expandable_segments;
  }
  return rules;
}

std::once_flag g_attach_once;
bool g_attached = false;
std::string g_attach_error;

void attach_once() {
  std::call_once(g_attach_once, [] {
    try {
      // No detach exists: these live for the process and are switched by g_mode.
      cca::attachAllocatorTraceTracker([](const TorchTraceEntry& te) { on_trace_entry(te); });
      cca::attachOutOfMemoryObserver(
          [](std::int64_t device, std::size_t allocated, std::size_t total, std::size_t free) {
            on_out_of_memory(device, allocated, total, free);
          });
      g_attached = true;
    } catch (const std::exception& ex) {
      g_attach_error = ex.what();
    }
  });
}

std::string settings_json(const CudaRoundingRules& rules) {
  detail::JsonWriter w;
  w.begin_object().field("expandable_segments", rules.expandable_segments);
  w.key("max_split_size_bytes");
  if (rules.max_split_size == UINT64_MAX) w.null(); else w.value(rules.max_split_size);
  w.key("roundup_power2_divisions").begin_array();
  for (std::uint64_t d : rules.roundup_power2_divisions) w.value(d);
  w.end_array().end_object();
  return w.take();
}

std::string start_impl(Recorder* recorder, SiteCapture* sites, int* attempts, std::string* settings) {
  if (c10::cuda::device_count() <= 0) return "no CUDA device is visible";
  init_cuda(at::globalContext());
  g_devices = c10::cuda::device_count();
  g_backend = cca::name();
  if (g_backend != "native") {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_recorder = recorder;
    g_polling = true;
    return "the " + g_backend + " allocator backend has no trace tracker (only the native caching "
           "allocator has one): blocks are not tracked; the allocator's allocated and reserved bytes "
           "are sampled at phase boundaries instead";
  }
  attach_once();
  if (!g_attached) return "torch refused the allocator trace tracker: " + g_attach_error;

  constexpr int kMaxAttempts = 5;
  for (int attempt = 1; attempt <= kMaxAttempts; ++attempt) {
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_counted = 0;
      g_mode = kCounting;
    }
    // Outside g_mutex: snapshot() takes every device lock, and the trampoline runs under them.
    cca::SnapshotInfo snap = take_snapshot(cca::get());
    std::lock_guard<std::mutex> lock(g_mutex);
    // An entry counted since Counting began may or may not be in the snapshot: take it again.
    // After the last attempt, go live anyway (the consistency samples will show any gap).
    if (g_counted != 0 && attempt < kMaxAttempts) continue;
    *attempts = attempt;
    const CudaRoundingRules rules = rules_from(snap.config_metadata);
    *settings = settings_json(rules);
    delete g_translator;
    g_translator = new CudaTraceTranslator(rules);
    g_events->clear();
    g_events->reserve(64);
    for (const auto& seg : snap.segments) {
      const auto device = static_cast<std::int16_t>(seg.device);
      const auto stream = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(seg.stream));
      const auto base = static_cast<std::uint64_t>(seg.address);
      g_translator->adopt_segment(device, base, seg.total_size, stream, seg.is_expandable, g_events);
      std::uint64_t addr = base;
      for (const auto& b : seg.blocks) {
        if (b.allocated || b.active) {
          g_translator->adopt_block(device, addr, b.size, b.requested_size, b.allocated, stream, g_events);
        }
        addr += b.size;
      }
    }
    g_recorder = recorder;
    g_sites = sites;
    if (sites != nullptr) {  // the blocks adopted from the snapshot existed before tracking
      for (Event& e : *g_events) {
        if (e.kind == EventKind::Alloc) e.stack_id = sites->pre_existing();
      }
    }
    record_all_locked();
    g_events->clear();
    g_mode = kLive;
    return "";
  }
  return "unreachable";
}
#endif  // RIDGESCOPE_WITH_CUDA

}  // namespace

bool cuda_source_compiled() noexcept {
#ifdef RIDGESCOPE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::string start_cuda_allocator_source(Recorder* recorder, SiteCapture* sites) noexcept {
  std::string reason;
  int attempts = 0;
  std::string settings;
#ifdef RIDGESCOPE_WITH_CUDA
  try {
    reason = start_impl(recorder, sites, &attempts, &settings);
  } catch (const std::exception& ex) {
    reason = std::string("the CUDA source failed to start: ") + ex.what();
  } catch (...) {
    reason = "the CUDA source failed to start";
  }
#else
  (void)sites;
  reason = "ridgescope was built without CUDA support (torch without CUDA at build time)";
#endif
  try {
    detail::JsonWriter w;
    w.begin_object()
        .field("compiled", cuda_source_compiled())
        .field("tracking", reason.empty())
        .field("backend", g_backend)
        .field("devices", g_devices);
    if (!reason.empty()) w.field("reason", reason);
    if (attempts > 0) w.field("snapshot_attempts", attempts);
    if (!settings.empty()) w.key("allocator_settings").raw(settings);
#ifdef RIDGESCOPE_WITH_CUDA
    w.key("torch_version").value(std::to_string(TORCH_VERSION_MAJOR) + "." +
                                 std::to_string(TORCH_VERSION_MINOR) + "." +
                                 std::to_string(TORCH_VERSION_PATCH));
#endif
    w.end_object();
    recorder->metadata("cuda_source", w.take());
  } catch (...) {
  }
  return reason;
}

void stop_cuda_allocator_source() noexcept {
  const bool was_running = g_mode.load() == kLive || g_polling.load();
  std::string stats = was_running ? cuda_source_stats_json() : std::string();
  std::lock_guard<std::mutex> lock(g_mutex);
  g_mode = kOff;
  g_polling = false;
  if (g_recorder != nullptr && !stats.empty()) g_recorder->metadata("cuda_source_stats", stats);
  g_recorder = nullptr;
  g_sites = nullptr;
  // The translator is kept until the next start: its counters stay readable.
}

bool cuda_allocator_source_live() noexcept { return g_mode.load() == kLive; }

std::uint64_t cuda_block_serial(std::int16_t device, std::uint64_t addr) noexcept {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_mode.load() != kLive || g_translator == nullptr) return 0;
  return g_translator->block_serial(device, addr);
}

#ifdef RIDGESCOPE_CUBLAS_WORKSPACES
namespace {
// The map's value: an at::DataPtr in torch 2.11, a (DataPtr, size) pair in 2.14.
const at::DataPtr& workspace_data(const at::DataPtr& p) { return p; }
template <class T>
const at::DataPtr& workspace_data(const std::pair<at::DataPtr, T>& p) {
  return p.first;
}

using WorkspaceMapFn = at::cuda::WorkspaceMapWithMutex& (*)();

// torch's accessor functions, looked up in the already loaded libtorch_cuda (no link-time
// dependency: a torch without them just has no workspace tags).
WorkspaceMapFn workspace_map_fn(const char* symbol) noexcept {
  void* lib = ::dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD);
  void* f = lib != nullptr ? ::dlsym(lib, symbol) : nullptr;
  if (f == nullptr) f = ::dlsym(RTLD_DEFAULT, symbol);
  return reinterpret_cast<WorkspaceMapFn>(f);
}

void collect(WorkspaceMapFn fn, bool lt, std::vector<CudaWorkspaceBlock>* out) {
  if (fn == nullptr) return;
  at::cuda::WorkspaceMapWithMutex& m = fn();
  std::shared_lock<std::shared_mutex> lock(m.mutex);
  for (const auto& entry : m.map) {
    const at::DataPtr& data = workspace_data(entry.second);
    if (data.get() == nullptr) continue;
    out->push_back(CudaWorkspaceBlock{static_cast<std::int16_t>(data.device().index()),
                                      reinterpret_cast<std::uint64_t>(data.get()), lt});
  }
}
}  // namespace
#endif

std::vector<CudaWorkspaceBlock> cuda_workspace_blocks() noexcept {
  std::vector<CudaWorkspaceBlock> out;
#ifdef RIDGESCOPE_CUBLAS_WORKSPACES
  try {
    static const WorkspaceMapFn cublas = workspace_map_fn("_ZN2at4cuda33cublas_handle_stream_to_workspaceEv");
    static const WorkspaceMapFn cublaslt = workspace_map_fn("_ZN2at4cuda35cublaslt_handle_stream_to_workspaceEv");
    collect(cublas, false, &out);
    collect(cublaslt, true, &out);
  } catch (...) {
    out.clear();
  }
#endif
  return out;
}

bool cuda_workspace_tags_compiled() noexcept {
#ifdef RIDGESCOPE_CUBLAS_WORKSPACES
  return true;
#else
  return false;
#endif
}

void record_cuda_samples(std::uint32_t live_name_id, std::uint32_t reserved_name_id) noexcept {
#ifdef RIDGESCOPE_WITH_CUDA
  const bool live = g_mode.load() == kLive;
  const bool polling = g_polling.load();
  if (!live && !polling) return;
  try {
    std::uint32_t allocated_id = live_name_id, reserved_id = reserved_name_id;
    if (!live) {
      std::lock_guard<std::mutex> lock(g_mutex);
      if (g_recorder == nullptr) return;
      allocated_id = g_recorder->intern("cuda_allocated_bytes");
      reserved_id = g_recorder->intern("cuda_reserved_bytes");
    }
    if (live) {
      // Workspace blocks are allocated through the allocator like tensors; torch's workspace
      // maps say which they are. Read outside g_mutex (the maps' own lock), tagged under it.
      // Every boundary tags them again (a few events): a workspace torch dropped and made anew
      // at the same address is a new block and gets its tag; a repeated tag changes nothing.
      const std::vector<CudaWorkspaceBlock> ws = cuda_workspace_blocks();
      std::lock_guard<std::mutex> lock(g_mutex);
      if (g_recorder == nullptr) return;
      for (const CudaWorkspaceBlock& b : ws) {
        Event e;
        e.kind = EventKind::Tag;
        e.device = Device{DeviceType::CUDA, b.device};
        e.addr = b.addr;
        e.category = Category::Workspace;
        e.string_id = g_recorder->intern(b.cublaslt ? "cuBLASLt workspace" : "cuBLAS workspace");
        g_recorder->record(e);
      }
    }
    for (int d = 0; d < g_devices; ++d) {
      // Read outside g_mutex (getDeviceStats takes the allocator's lock). An allocation by
      // another thread between the read and the record would show as a mismatch.
      const auto stats = cca::getDeviceStats(static_cast<c10::DeviceIndex>(d));
      constexpr std::size_t kAggregate = 0;
      const auto allocated = static_cast<std::uint64_t>(stats.allocated_bytes[kAggregate].current);
      const auto reserved = static_cast<std::uint64_t>(stats.reserved_bytes[kAggregate].current);
      std::lock_guard<std::mutex> lock(g_mutex);
      if (g_recorder == nullptr) return;
      Event e;
      e.kind = EventKind::Sample;
      e.device = Device{DeviceType::CUDA, static_cast<std::int16_t>(d)};
      e.string_id = allocated_id;
      e.value = allocated;
      g_recorder->record(e);
      e.string_id = reserved_id;
      e.value = reserved;
      g_recorder->record(e);
    }
  } catch (...) {
    // Statistics unavailable (a backend without them): no sample.
  }
#else
  (void)live_name_id;
  (void)reserved_name_id;
#endif
}

std::string cuda_allocator_backend() noexcept {
#ifdef RIDGESCOPE_WITH_CUDA
  try {
    if (c10::cuda::device_count() <= 0) return "";
    return cca::name();
  } catch (...) {
    return "";
  }
#else
  return "";
#endif
}

std::string cuda_source_stats_json() noexcept {
  try {
    std::lock_guard<std::mutex> lock(g_mutex);
    CudaTranslatorStats s;
    if (g_translator != nullptr) s = g_translator->stats();
    detail::JsonWriter w;
    w.begin_object()
        .field("live", g_mode.load() == kLive)
        .field("polling", g_polling.load())
        .field("entries", s.entries)
        .field("unknown_actions", s.unknown_actions)
        .field("snapshots", s.snapshots)
        .field("unsplit_blocks", s.unsplit_blocks)
        .field("unmatched_frees", s.unmatched_frees)
        .field("unmatched_segment_frees", s.unmatched_segment_frees)
        .field("allocs_outside_segments", s.allocs_outside_segments)
        .field("internal_errors", s.internal_errors)
        .field("oom_reports", g_oom_reports)
        .field("reentrant_drops", g_dropped_reentrant)
        .end_object();
    return w.take();
  } catch (...) {
    return "{}";
  }
}

}  // namespace ridgescope::sources
