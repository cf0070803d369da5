#include "cupti_source.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "json_writer.h"
#include "ridgescope/external_alloc.h"

#ifdef RIDGESCOPE_WITH_CUPTI
#include <cupti.h>  // with the parameter structures of every call (generated_cuda*_meta.h)
#include <dlfcn.h>
#include <execinfo.h>

#include "absl/container/flat_hash_map.h"
#include "device_memory_epoch.h"
#endif

namespace ridgescope::sources {

namespace {
void write_metadata(Recorder* recorder, bool available, const std::string& reason) noexcept {
  try {
    detail::JsonWriter w;
    w.begin_object().field("available", available).field("reason", reason).end_object();
    recorder->metadata("cupti_source", w.take());
  } catch (...) {
  }
}
}  // namespace

#ifndef RIDGESCOPE_WITH_CUPTI

bool cupti_source_compiled() noexcept { return false; }

std::string start_cupti_source(Recorder* recorder, SiteCapture*) noexcept {
  const std::string why =
      "this build of ridgescope has no CUPTI source (CUPTI's headers were not found when it was built): "
      "memory outside PyTorch is not itemised";
  write_metadata(recorder, false, why);
  return why;
}
void stop_cupti_source() noexcept {}
void record_cupti_samples() noexcept {}

#else  // RIDGESCOPE_WITH_CUPTI

namespace {

// The CUPTI entry points, resolved with dlsym (the library is never linked).
struct CuptiApi {
  void* handle = nullptr;
  CUptiResult (*subscribe)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*) = nullptr;
  CUptiResult (*subscribe_v2)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*, CUpti_SubscriberParams*) = nullptr;
  CUptiResult (*unsubscribe)(CUpti_SubscriberHandle) = nullptr;
  CUptiResult (*enable_callback)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId) = nullptr;
  CUptiResult (*result_string)(CUptiResult, const char**) = nullptr;
  CUptiResult (*device_id)(CUcontext, uint32_t*) = nullptr;
};

enum Mode : int { kOff = 0, kLive = 1 };
std::atomic<int> g_mode{kOff};

// Guarded by g_mutex, a leaf lock except for the Recorder's own leaf lock, always taken after it.
std::mutex g_mutex;
Recorder* g_recorder = nullptr;
SiteCapture* g_sites = nullptr;
ExternalAllocTranslator* g_translator = nullptr;  // per session
std::vector<Event>* const g_events = new std::vector<Event>();
CuptiApi g_api;  // resolved once per process, kept (CUPTI is never dlclosed: torch loaded it too)
bool g_api_loaded = false;
std::string g_api_error;
CUpti_SubscriberHandle g_subscriber = nullptr;
std::uint32_t g_unknown_library = 0;
// Counters (under g_mutex) of what the callback saw.
std::uint64_t g_pytorch_calls = 0;   // calls from PyTorch's caching allocator, dropped
std::uint64_t g_unattributed = 0;    // calls whose stack never left CUDA's libraries
std::atomic<std::uint64_t> g_host_creates{0};  // cuMemCreate of host memory (NCCL's cuMem host buffers)
// Sessions so far: a thread's runtime depth from an earlier session (a call that was inside the
// runtime when CUPTI was unsubscribed) is reset by the next one.
std::atomic<std::uint64_t> g_generation{0};

// Kernel modules loaded (resource callbacks), per device ordinal; relaxed atomics.
constexpr int kMaxDevices = 64;
std::atomic<std::uint64_t> g_modules[kMaxDevices];
std::atomic<std::uint64_t> g_module_bytes[kMaxDevices];
std::uint32_t g_modules_id = 0, g_module_bytes_id = 0;

// The caller classification of each return address met, filled outside any lock of ours.
struct CallerInfo {
  CallerClass cls = CallerClass::Other;
  std::string library;  // display name (Other only)
};
std::mutex g_callers_mutex;  // leaf lock; never held while calling dladdr or the unwinder
absl::flat_hash_map<const void*, CallerInfo>* const g_callers = new absl::flat_hash_map<const void*, CallerInfo>();
constexpr std::size_t kMaxCallers = 1u << 16;

// The runtime call this thread is inside (its driver calls are part of it), for session
// t_runtime_generation.
thread_local int t_runtime_depth = 0;
thread_local std::uint64_t t_runtime_generation = 0;
thread_local bool t_in_callback = false;

const void* own_library_base() {
  static const void* base = [] {
    Dl_info info{};
    return dladdr(reinterpret_cast<const void*>(&own_library_base), &info) != 0 ? info.dli_fbase : nullptr;
  }();
  return base;
}

CallerInfo classify_pc(const void* pc) {
  {
    std::lock_guard<std::mutex> lock(g_callers_mutex);
    if (auto it = g_callers->find(pc); it != g_callers->end()) return it->second;
  }
  CallerInfo info;
  Dl_info dl{};
  if (dladdr(pc, &dl) == 0 || dl.dli_fname == nullptr) {
    info.cls = CallerClass::CudaLibrary;  // an address no object claims (JIT code): keep walking
  } else if (dl.dli_fbase == own_library_base()) {
    info.cls = CallerClass::CudaLibrary;  // ridgescope's own frames (this callback)
  } else {
    info.cls = classify_caller(dl.dli_fname);
    if (info.cls == CallerClass::Other) info.library = std::string(library_display_name(dl.dli_fname));
  }
  std::lock_guard<std::mutex> lock(g_callers_mutex);
  if (g_callers->size() < kMaxCallers) g_callers->emplace(pc, info);
  return info;
}

// The first frame outside CUDA's own libraries: PyTorch's allocator, another library, or none.
CallerInfo find_caller() {
  void* pcs[64];
  const int n = backtrace(pcs, 64);
  for (int i = 0; i < n; ++i) {
    // A return address points after the call; one byte back is inside the calling instruction.
    const void* pc = static_cast<const char*>(pcs[i]) - (i > 0 ? 1 : 0);
    CallerInfo c = classify_pc(pc);
    if (c.cls != CallerClass::CudaLibrary) return c;
  }
  return CallerInfo{CallerClass::CudaLibrary, {}};  // never left CUDA's libraries
}

std::int16_t device_of(CUcontext ctx) {
  std::uint32_t id = 0;
  if (ctx == nullptr || g_api.device_id == nullptr || g_api.device_id(ctx, &id) != CUPTI_SUCCESS) return 0;
  return static_cast<std::int16_t>(id);
}

// The call's fields, at the site where they are known: allocations on exit (the pointer and the
// result exist), frees, unmaps and releases on entry (before the memory can be handed out again).
// Returns false for calls that are not followed here.
bool read_runtime(CUpti_CallbackId cbid, const CUpti_CallbackData* cb, ExternalCall* c) {
  const bool exit = cb->callbackSite == CUPTI_API_EXIT;
  const bool ok = exit && cb->functionReturnValue != nullptr &&
                  *static_cast<const cudaError_t*>(cb->functionReturnValue) == cudaSuccess;
  const void* p = cb->functionParams;
  auto alloc = [&](ExternalApi api, void* const* ptr, std::uint64_t bytes) {
    if (!exit) return false;
    c->kind = ExternalCallKind::Alloc;
    c->api = api;
    c->ok = ok;
    c->addr = ok && ptr != nullptr ? reinterpret_cast<std::uint64_t>(*ptr) : 0;
    c->bytes = bytes;
    return true;
  };
  auto free = [&](const void* ptr) {
    if (exit) return false;
    c->kind = ExternalCallKind::Free;
    c->addr = reinterpret_cast<std::uint64_t>(ptr);
    return true;
  };
  switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020: {
      auto* a = static_cast<const cudaMalloc_v3020_params*>(p);
      return alloc(ExternalApi::Malloc, a->devPtr, a->size);
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020: {
      auto* a = static_cast<const cudaMallocPitch_v3020_params*>(p);
      return alloc(ExternalApi::MallocPitch, a->devPtr, ok && a->pitch ? *a->pitch * a->height : 0);
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMalloc3D_v3020: {
      auto* a = static_cast<const cudaMalloc3D_v3020_params*>(p);
      if (!exit) return false;
      c->kind = ExternalCallKind::Alloc;
      c->api = ExternalApi::MallocPitch;
      c->ok = ok && a->pitchedDevPtr != nullptr;
      if (c->ok) {
        c->addr = reinterpret_cast<std::uint64_t>(a->pitchedDevPtr->ptr);
        c->bytes = a->pitchedDevPtr->pitch * a->extent.height * (a->extent.depth ? a->extent.depth : 1);
      }
      return true;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000: {
      auto* a = static_cast<const cudaMallocManaged_v6000_params*>(p);
      return alloc(ExternalApi::MallocManaged, a->devPtr, a->size);
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_ptsz_v11020: {
      auto* a = static_cast<const cudaMallocAsync_v11020_params*>(p);  // the same layout
      return alloc(ExternalApi::MallocAsync, a->devPtr, a->size);
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_v11020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_ptsz_v11020: {
      auto* a = static_cast<const cudaMallocFromPoolAsync_v11020_params*>(p);
      return alloc(ExternalApi::MallocAsync, a->ptr, a->size);
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020:
      return free(static_cast<const cudaFree_v3020_params*>(p)->devPtr);
    case CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_ptsz_v11020:
      return free(static_cast<const cudaFreeAsync_v11020_params*>(p)->devPtr);
    default: return false;
  }
}

bool read_driver(CUpti_CallbackId cbid, const CUpti_CallbackData* cb, ExternalCall* c) {
  const bool exit = cb->callbackSite == CUPTI_API_EXIT;
  const bool ok = exit && cb->functionReturnValue != nullptr &&
                  *static_cast<const CUresult*>(cb->functionReturnValue) == CUDA_SUCCESS;
  const void* p = cb->functionParams;
  auto alloc = [&](ExternalApi api, const CUdeviceptr* ptr, std::uint64_t bytes) {
    if (!exit) return false;
    c->kind = ExternalCallKind::Alloc;
    c->api = api;
    c->ok = ok;
    c->addr = ok && ptr != nullptr ? static_cast<std::uint64_t>(*ptr) : 0;
    c->bytes = bytes;
    return true;
  };
  auto free = [&](CUdeviceptr ptr) {
    if (exit) return false;
    c->kind = ExternalCallKind::Free;
    c->addr = static_cast<std::uint64_t>(ptr);
    return true;
  };
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2: {
      auto* a = static_cast<const cuMemAlloc_v2_params*>(p);
      return alloc(ExternalApi::Malloc, a->dptr, a->bytesize);
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2: {
      auto* a = static_cast<const cuMemAllocPitch_v2_params*>(p);
      return alloc(ExternalApi::MallocPitch, a->dptr, ok && a->pPitch ? *a->pPitch * a->Height : 0);
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged: {
      auto* a = static_cast<const cuMemAllocManaged_params*>(p);
      return alloc(ExternalApi::MallocManaged, a->dptr, a->bytesize);
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync:
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz: {
      auto* a = static_cast<const cuMemAllocAsync_params*>(p);
      return alloc(ExternalApi::MallocAsync, a->dptr, a->bytesize);
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync:
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz: {
      auto* a = static_cast<const cuMemAllocFromPoolAsync_params*>(p);
      return alloc(ExternalApi::MallocAsync, a->dptr, a->bytesize);
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2:
      return free(static_cast<const cuMemFree_v2_params*>(p)->dptr);
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync:
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz:
      return free(static_cast<const cuMemFreeAsync_params*>(p)->dptr);
    case CUPTI_DRIVER_TRACE_CBID_cuMemCreate: {
      if (!exit) return false;
      auto* a = static_cast<const cuMemCreate_params*>(p);
      if (a->prop == nullptr || a->prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
        g_host_creates.fetch_add(1, std::memory_order_relaxed);  // host memory through the VMM route
        return false;
      }
      c->kind = ExternalCallKind::MemCreate;
      c->ok = ok;
      c->handle = ok && a->handle ? static_cast<std::uint64_t>(*a->handle) : 0;
      c->bytes = a->size;
      c->device = static_cast<std::int16_t>(a->prop->location.id);
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemRetainAllocationHandle: {
      if (!exit) return false;
      auto* a = static_cast<const cuMemRetainAllocationHandle_params*>(p);
      c->kind = ExternalCallKind::MemRetain;
      c->ok = ok;
      c->handle = ok && a->handle ? static_cast<std::uint64_t>(*a->handle) : 0;
      c->addr = reinterpret_cast<std::uint64_t>(a->addr);
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemRelease: {
      if (exit) return false;
      c->kind = ExternalCallKind::MemRelease;
      c->handle = static_cast<std::uint64_t>(static_cast<const cuMemRelease_params*>(p)->handle);
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemMap: {
      if (!exit) return false;
      auto* a = static_cast<const cuMemMap_params*>(p);
      c->kind = ExternalCallKind::MemMap;
      c->ok = ok;
      c->addr = static_cast<std::uint64_t>(a->ptr);
      c->bytes = a->size;
      c->offset = a->offset;
      c->handle = static_cast<std::uint64_t>(a->handle);
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemUnmap: {
      if (exit) return false;
      auto* a = static_cast<const cuMemUnmap_params*>(p);
      c->kind = ExternalCallKind::MemUnmap;
      c->addr = static_cast<std::uint64_t>(a->ptr);
      c->bytes = a->size;
      return true;
    }
    default: return false;
  }
}

void on_resource(CUpti_CallbackId cbid, const void* data) {
  if (cbid != CUPTI_CBID_RESOURCE_MODULE_LOADED) return;
  const auto* r = static_cast<const CUpti_ResourceData*>(data);
  const auto* m = static_cast<const CUpti_ModuleResourceData*>(r->resourceDescriptor);
  const std::int16_t device = device_of(r->context);
  if (device < 0 || device >= kMaxDevices) return;
  g_modules[device].fetch_add(1, std::memory_order_relaxed);
  if (m != nullptr) g_module_bytes[device].fetch_add(m->cubinSize, std::memory_order_relaxed);
}

void CUPTIAPI on_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  if (g_mode.load(std::memory_order_relaxed) == kOff || data == nullptr) return;
  if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
    on_resource(cbid, data);
    return;
  }
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (const std::uint64_t gen = g_generation.load(std::memory_order_relaxed); t_runtime_generation != gen) {
    t_runtime_generation = gen;
    t_runtime_depth = 0;
  }
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    // A runtime allocation call is one call: the driver calls it makes inside are not counted.
    if (cb->callbackSite == CUPTI_API_ENTER) ++t_runtime_depth; else if (t_runtime_depth > 0) --t_runtime_depth;
  } else if (domain != CUPTI_CB_DOMAIN_DRIVER_API || t_runtime_depth > 0) {
    return;
  }
  if (t_in_callback) return;  // nothing below allocates device memory; a guard all the same
  t_in_callback = true;
  try {
    ExternalCall call;
    const bool followed = domain == CUPTI_CB_DOMAIN_RUNTIME_API ? read_runtime(cbid, cb, &call) : read_driver(cbid, cb, &call);
    if (followed) {
      if (call.kind == ExternalCallKind::Alloc) call.device = device_of(cb->context);
      const CallerInfo caller = find_caller();  // outside every lock of ours
      std::lock_guard<std::mutex> lock(g_mutex);
      if (g_mode.load(std::memory_order_relaxed) == kLive && g_recorder != nullptr && g_translator != nullptr) {
        if (caller.cls == CallerClass::PyTorchAllocator) {
          ++g_pytorch_calls;
        } else {
          if (caller.cls == CallerClass::CudaLibrary) ++g_unattributed;
          call.library_id = caller.cls == CallerClass::Other ? g_recorder->intern(caller.library) : g_unknown_library;
          if (call.kind == ExternalCallKind::Alloc || call.kind == ExternalCallKind::MemCreate) {
            call.stack_id = g_sites != nullptr ? g_sites->capture() : 0;
          }
          g_events->clear();
          g_translator->translate(call, g_events);
          for (const Event& e : *g_events) g_recorder->record(e);
          if (!g_events->empty()) bump_device_memory_epoch();
        }
      }
    }
  } catch (...) {
    // out of memory in our tables: the call is not itemised
  }
  t_in_callback = false;
}

std::string result_text(CUptiResult r) {
  const char* s = nullptr;
  if (g_api.result_string != nullptr && g_api.result_string(r, &s) == CUPTI_SUCCESS && s != nullptr) return s;
  return "CUPTI error " + std::to_string(static_cast<int>(r));
}

bool load_api() {
  if (g_api_loaded) return true;
  if (!g_api_error.empty()) return false;
  const std::string versioned = "libcupti.so." + std::to_string(CUDA_VERSION / 1000);
  for (const std::string& name : {versioned, std::string("libcupti.so")}) {
    g_api.handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (g_api.handle != nullptr) break;
  }
  if (g_api.handle == nullptr) {
    const char* err = dlerror();
    g_api_error = "CUPTI is not available (" + versioned + ": " + (err ? err : "not found") + ")";
    return false;
  }
  auto sym = [](const char* name) { return dlsym(g_api.handle, name); };
  g_api.subscribe = reinterpret_cast<decltype(g_api.subscribe)>(sym("cuptiSubscribe"));
  g_api.subscribe_v2 = reinterpret_cast<decltype(g_api.subscribe_v2)>(sym("cuptiSubscribe_v2"));
  g_api.unsubscribe = reinterpret_cast<decltype(g_api.unsubscribe)>(sym("cuptiUnsubscribe"));
  g_api.enable_callback = reinterpret_cast<decltype(g_api.enable_callback)>(sym("cuptiEnableCallback"));
  g_api.result_string = reinterpret_cast<decltype(g_api.result_string)>(sym("cuptiGetResultString"));
  g_api.device_id = reinterpret_cast<decltype(g_api.device_id)>(sym("cuptiGetDeviceId"));
  if (g_api.subscribe == nullptr || g_api.unsubscribe == nullptr || g_api.enable_callback == nullptr) {
    g_api_error = "CUPTI is present but lacks cuptiSubscribe, cuptiUnsubscribe or cuptiEnableCallback";
    return false;
  }
  g_api_loaded = true;
  return true;
}

// The callbacks followed (runtime, then driver, then resource).
constexpr CUpti_CallbackId kRuntime[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020,          CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMalloc3D_v3020,        CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020,    CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_ptsz_v11020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_v11020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_ptsz_v11020,
    CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020,            CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020,
    CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_ptsz_v11020,
};
constexpr CUpti_CallbackId kDriver[] = {
    CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2,          CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged,      CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz,   CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2,           CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz,    CUPTI_DRIVER_TRACE_CBID_cuMemCreate,
    CUPTI_DRIVER_TRACE_CBID_cuMemRelease,           CUPTI_DRIVER_TRACE_CBID_cuMemMap,
    CUPTI_DRIVER_TRACE_CBID_cuMemUnmap,             CUPTI_DRIVER_TRACE_CBID_cuMemRetainAllocationHandle,
};

}  // namespace

bool cupti_source_compiled() noexcept { return true; }

std::string start_cupti_source(Recorder* recorder, SiteCapture* sites) noexcept {
  std::string why;
  try {
    if (!load_api()) {
      why = g_api_error + ": memory outside PyTorch is not itemised";
    } else if (g_subscriber == nullptr) {
      CUpti_SubscriberHandle subscriber = nullptr;
      CUptiResult r;
      char other[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN + 1] = {};
      if (g_api.subscribe_v2 != nullptr) {
        CUpti_SubscriberParams params{};
        params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
        params.subscriberName = "ridgescope";
        params.oldSubscriberName = other;
        params.oldSubscriberSize = CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN;
        r = g_api.subscribe_v2(&subscriber, &on_callback, nullptr, &params);
      } else {
        r = g_api.subscribe(&subscriber, &on_callback, nullptr);
      }
      if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
        why = std::string("CUPTI is in use by another tool") + (other[0] ? std::string(" (") + other + ")" : "") +
              " (CUPTI takes one subscriber: Nsight Systems or Compute, or a torch.profiler started earlier in "
              "this process): memory outside PyTorch is not itemised";
      } else if (r != CUPTI_SUCCESS) {
        why = "CUPTI refused a subscriber (" + result_text(r) + "): memory outside PyTorch is not itemised";
      } else {
        bool enabled = true;
        for (CUpti_CallbackId id : kRuntime) {
          enabled = enabled && g_api.enable_callback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, id) == CUPTI_SUCCESS;
        }
        for (CUpti_CallbackId id : kDriver) {
          enabled = enabled && g_api.enable_callback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id) == CUPTI_SUCCESS;
        }
        // Module loads count toward the context's share (optional: no failure if refused).
        g_api.enable_callback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED);
        if (!enabled) {
          g_api.unsubscribe(subscriber);
          why = "CUPTI refused the allocation callbacks: memory outside PyTorch is not itemised";
        } else {
          g_subscriber = subscriber;
        }
      }
    }
    if (why.empty()) {
      // Warm the unwinder before the first callback needs it (its first call loads libgcc_s).
      void* warm[4];
      backtrace(warm, 4);
      std::lock_guard<std::mutex> lock(g_mutex);
      delete g_translator;
      g_translator = new ExternalAllocTranslator();
      g_recorder = recorder;
      g_sites = sites;
      g_pytorch_calls = g_unattributed = 0;
      g_host_creates.store(0, std::memory_order_relaxed);
      g_generation.fetch_add(1, std::memory_order_relaxed);
      g_unknown_library = recorder->intern("unknown");
      g_modules_id = recorder->intern("cupti_modules_loaded");
      g_module_bytes_id = recorder->intern("cupti_module_bytes");
      for (int i = 0; i < kMaxDevices; ++i) {
        g_modules[i].store(0, std::memory_order_relaxed);
        g_module_bytes[i].store(0, std::memory_order_relaxed);
      }
      g_mode.store(kLive, std::memory_order_relaxed);
    }
  } catch (const std::exception& ex) {
    why = std::string("the CUPTI source failed to start: ") + ex.what();
  } catch (...) {
    why = "the CUPTI source failed to start";
  }
  write_metadata(recorder, why.empty(), why);
  return why;
}

void stop_cupti_source() noexcept {
  if (g_mode.exchange(kOff) != kLive) return;
  // Unsubscribed first, so that no callback is left to wait for: CUPTI returns once the
  // subscriber is gone; a callback already past the mode check finds g_recorder cleared below.
  if (g_subscriber != nullptr && g_api.unsubscribe != nullptr) g_api.unsubscribe(g_subscriber);
  g_subscriber = nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_recorder != nullptr && g_translator != nullptr) {
    try {
      const ExternalTranslatorStats& s = g_translator->stats();
      detail::JsonWriter w;
      w.begin_object()
          .field("calls", s.calls)
          .field("pytorch_calls", g_pytorch_calls)
          .field("allocations", s.allocations)
          .field("frees", s.frees)
          .field("failed_calls", s.failed_calls)
          .field("unmatched_frees", s.unmatched_frees)
          .field("unknown_handles", s.unknown_handles)
          .field("reused_addresses", s.reused_addresses)
          .field("unmapped_handles", s.unmapped_handles)
          .field("host_creates", g_host_creates.load(std::memory_order_relaxed))
          .field("unattributed_calls", g_unattributed)
          .field("internal_errors", s.internal_errors)
          .end_object();
      g_recorder->metadata("cupti_source_stats", w.take());
    } catch (...) {
    }
  }
  g_recorder = nullptr;
  g_sites = nullptr;
}

void record_cupti_samples() noexcept {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_recorder == nullptr || g_mode.load(std::memory_order_relaxed) != kLive) return;
  for (int i = 0; i < kMaxDevices; ++i) {
    const std::uint64_t modules = g_modules[i].load(std::memory_order_relaxed);
    if (modules == 0) continue;
    Event e;
    e.kind = EventKind::Sample;
    e.device = Device{DeviceType::CUDA, static_cast<std::int16_t>(i)};
    e.string_id = g_modules_id;
    e.value = modules;
    g_recorder->record(e);
    e.string_id = g_module_bytes_id;
    e.value = g_module_bytes[i].load(std::memory_order_relaxed);
    g_recorder->record(e);
  }
}

#endif  // RIDGESCOPE_WITH_CUPTI

}  // namespace ridgescope::sources
