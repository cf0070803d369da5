#include "nvml_source.h"

#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <vector>

namespace ridgescope::sources {

namespace {
// The few NVML types used, as the NVML headers define them (nvml.h is not needed to build).
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
// nvmlProcessInfo_t of the _v2/_v3 process queries.
struct nvmlProcessInfo_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
};
constexpr nvmlReturn_t kNvmlSuccess = 0;
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
  sampler->thread_ = std::thread([s = sampler.get()] { s->run(); });
  return sampler;
}

NvmlSampler::~NvmlSampler() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void NvmlSampler::run() {
  const std::uint32_t used_id = recorder_->intern("nvml_used_bytes");
  const std::uint32_t total_id = recorder_->intern("nvml_total_bytes");
  const std::uint32_t process_id = recorder_->intern("nvml_process_used_bytes");
  const unsigned int pid = static_cast<unsigned int>(getpid());
  std::vector<nvmlProcessInfo_t> infos(64);
  while (!stop_) {
    unsigned int count = 0;
    if (api_->device_count(&count) == kNvmlSuccess) {
      for (unsigned int i = 0; i < count; ++i) {
        nvmlDevice_t device = nullptr;
        nvmlMemory_t memory{};
        if (api_->device_by_index(i, &device) != kNvmlSuccess ||
            api_->memory_info(device, &memory) != kNvmlSuccess) {
          continue;
        }
        Event e;
        e.kind = EventKind::Sample;
        e.device = Device{DeviceType::CUDA, static_cast<std::int16_t>(i)};
        e.string_id = used_id;
        e.value = memory.used;
        recorder_->record(e);
        e.string_id = total_id;
        e.value = memory.total;
        recorder_->record(e);
        if (api_->processes != nullptr) {  // this process's share, where NVML tells it
          unsigned int n = static_cast<unsigned int>(infos.size());
          if (api_->processes(device, &n, infos.data()) == kNvmlSuccess) {
            for (unsigned int k = 0; k < n && k < infos.size(); ++k) {
              if (infos[k].pid != pid) continue;
              e.string_id = process_id;
              e.value = infos[k].usedGpuMemory;
              recorder_->record(e);
            }
          }  // more than 64 processes on the device: device-wide figures only, this round
        }
      }
    }
    for (std::uint32_t waited = 0; waited < interval_ms_ && !stop_; waited += 10) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

}  // namespace ridgescope::sources
