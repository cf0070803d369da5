#include "nvml_source.h"

#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "device_memory_epoch.h"

namespace ridgescope::sources {

namespace {
// The few NVML types used, as the NVML headers define them (nvml.h is not needed to build).
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
// nvmlProcessInfo_t of the _v2/_v3 process queries (the same 24-byte layout in both).
struct nvmlProcessInfo_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
};
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr nvmlReturn_t kNvmlInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailable = ~0ull;  // usedGpuMemory without permission
constexpr unsigned int kMaxProcesses = 4096;
}  // namespace

struct NvmlSampler::Api {
  void* handle = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*device_count)(unsigned int*) = nullptr;
  nvmlReturn_t (*device_by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*memory_info)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  // Optional: per-process usage (absent in old drivers; then only device-wide figures).
  nvmlReturn_t (*processes)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_t*) = nullptr;
  ~Api() {
    if (shutdown != nullptr) shutdown();
    if (handle != nullptr) dlclose(handle);
  }
};

std::unique_ptr<NvmlSampler> NvmlSampler::start(Recorder* recorder, std::uint32_t interval_ms,
                                                std::string* why_not) {
  auto api = std::make_unique<Api>();
  api->handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (api->handle == nullptr) {
    const char* err = dlerror();
    *why_not = std::string("NVML is not available (libnvidia-ml.so.1: ") + (err ? err : "not found") + ")";
    return nullptr;
  }
  auto sym = [&api](const char* name) { return dlsym(api->handle, name); };
  api->init = reinterpret_cast<nvmlReturn_t (*)()>(sym("nvmlInit_v2"));
  api->device_count = reinterpret_cast<nvmlReturn_t (*)(unsigned int*)>(sym("nvmlDeviceGetCount_v2"));
  api->device_by_index =
      reinterpret_cast<nvmlReturn_t (*)(unsigned int, nvmlDevice_t*)>(sym("nvmlDeviceGetHandleByIndex_v2"));
  api->memory_info = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*)>(sym("nvmlDeviceGetMemoryInfo"));
  auto shutdown = reinterpret_cast<nvmlReturn_t (*)()>(sym("nvmlShutdown"));
  void* processes = sym("nvmlDeviceGetComputeRunningProcesses_v3");
  if (processes == nullptr) processes = sym("nvmlDeviceGetComputeRunningProcesses_v2");
  api->processes = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_t*)>(processes);
  if (!api->init || !api->device_count || !api->device_by_index || !api->memory_info || !shutdown) {
    *why_not = "NVML is present but lacks the functions ridgescope needs";
    return nullptr;
  }
  if (api->init() != kNvmlSuccess) {
    *why_not = "NVML failed to initialise (no driver or no device)";
    return nullptr;
  }
  api->shutdown = shutdown;  // only once init succeeded
  std::unique_ptr<NvmlSampler> sampler(new NvmlSampler());
  sampler->recorder_ = recorder;
  sampler->interval_ms_ = interval_ms == 0 ? 100 : interval_ms;
  sampler->api_ = std::move(api);
  sampler->total_id_ = recorder->intern("nvml_total_bytes");
  sampler->used_id_ = recorder->intern("nvml_used_bytes");
  sampler->count_id_ = recorder->intern("nvml_process_count");
  sampler->process_id_ = recorder->intern("nvml_process_used_bytes");
  sampler->reading_id_ = recorder->intern("nvml_reading");
  sampler->infos_.resize(64 * sizeof(nvmlProcessInfo_t));
  sampler->thread_ = std::thread([s = sampler.get()] { s->run(); });
  return sampler;
}

NvmlSampler::~NvmlSampler() {
  {
    std::lock_guard<std::mutex> lock(wake_mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void NvmlSampler::request_boundary() noexcept {
  {
    std::lock_guard<std::mutex> lock(wake_mutex_);
    boundary_requested_ = true;
  }
  wake_.notify_one();
}

void NvmlSampler::read_now(Reason reason) noexcept {
  try {
    std::lock_guard<std::mutex> lock(reading_mutex_);
    const unsigned int pid = static_cast<unsigned int>(getpid());
    unsigned int count = 0;
    if (api_->device_count(&count) != kNvmlSuccess) return;
    for (unsigned int i = 0; i < count; ++i) {
      nvmlDevice_t device = nullptr;
      nvmlMemory_t memory{};
      if (api_->device_by_index(i, &device) != kNvmlSuccess || api_->memory_info(device, &memory) != kNvmlSuccess) {
        continue;
      }
      Event e;
      e.kind = EventKind::Sample;
      e.device = Device{DeviceType::CUDA, static_cast<std::int16_t>(i)};
      auto record = [&](std::uint32_t id, std::uint64_t value) {
        e.string_id = id;
        e.value = value;
        recorder_->record(e);
      };
      record(total_id_, memory.total);
      record(used_id_, memory.used);
      if (api_->processes != nullptr) {  // this process's share, where NVML tells it
        unsigned int n = static_cast<unsigned int>(infos_.size() / sizeof(nvmlProcessInfo_t));
        nvmlReturn_t rc = api_->processes(device, &n, reinterpret_cast<nvmlProcessInfo_t*>(infos_.data()));
        if (rc == kNvmlInsufficientSize && n <= kMaxProcesses) {  // n is now the count needed
          infos_.resize((n + 8) * sizeof(nvmlProcessInfo_t));
          n = static_cast<unsigned int>(infos_.size() / sizeof(nvmlProcessInfo_t));
          rc = api_->processes(device, &n, reinterpret_cast<nvmlProcessInfo_t*>(infos_.data()));
        }
        if (rc == kNvmlSuccess) {
          record(count_id_, n);
          for (unsigned int k = 0; k < n; ++k) {
            nvmlProcessInfo_t info;
            std::memcpy(&info, infos_.data() + k * sizeof(nvmlProcessInfo_t), sizeof info);
            if (info.pid != pid || info.usedGpuMemory == kNvmlValueNotAvailable) continue;
            record(process_id_, info.usedGpuMemory);
            break;
          }
        }
      }
      record(reading_id_, static_cast<std::uint64_t>(reason));  // completes the reading
    }
  } catch (...) {
    // out of memory growing the process buffer: no reading this time
  }
}

void NvmlSampler::run() {
  std::uint64_t seen = device_memory_epoch().load(std::memory_order_relaxed);
  read_now(Reason::Periodic);
  auto last = std::chrono::steady_clock::now();
  while (!stop_) {
    bool boundary = false;
    {
      std::unique_lock<std::mutex> lock(wake_mutex_);
      wake_.wait_for(lock, std::chrono::milliseconds(10), [this] { return boundary_requested_ || stop_.load(); });
      boundary = boundary_requested_;
      boundary_requested_ = false;
    }
    if (stop_) break;
    const std::uint64_t epoch = device_memory_epoch().load(std::memory_order_relaxed);
    const auto now = std::chrono::steady_clock::now();
    if (boundary) {
      read_now(Reason::Boundary);
    } else if (epoch != seen) {  // the driver's holding changed: read it near its new level
      read_now(Reason::Change);
    } else if (now - last >= std::chrono::milliseconds(interval_ms_)) {
      read_now(Reason::Periodic);
    } else {
      continue;
    }
    seen = epoch;
    last = now;
  }
}

}  // namespace ridgescope::sources
