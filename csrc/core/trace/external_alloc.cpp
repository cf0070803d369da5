// external_alloc.cpp — CUPTI's allocation calls -> external_alloc / external_free events
// (include/ridgescope/external_alloc.h).
#include "ridgescope/external_alloc.h"

namespace ridgescope {

std::string_view external_api_name(ExternalApi api) noexcept {
  switch (api) {
    case ExternalApi::Malloc: return "cudaMalloc";
    case ExternalApi::MallocPitch: return "cudaMallocPitch";
    case ExternalApi::MallocManaged: return "cudaMallocManaged";
    case ExternalApi::MallocAsync: return "cudaMallocAsync";
    case ExternalApi::MemCreate: return "cuMemCreate";
    case ExternalApi::Unknown: break;
  }
  return "unknown";
}

ExternalApi external_api_from_byte(std::uint8_t value) noexcept {
  return value < kExternalApiCount ? static_cast<ExternalApi>(value) : ExternalApi::Unknown;
}

std::string_view library_display_name(std::string_view path) noexcept {
  const auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

namespace {
bool starts_with(std::string_view s, std::string_view prefix) noexcept {
  return s.substr(0, prefix.size()) == prefix;
}
}  // namespace

std::string_view library_friendly_name(std::string_view library) noexcept {
  const std::string_view name = library_display_name(library);
  struct Known {
    std::string_view prefix, friendly;
  };
  // Longer prefixes first: libcublasLt before libcublas.
  static constexpr Known kKnown[] = {
      {"libnccl", "NCCL"},         {"libcublasLt", "cuBLASLt"}, {"libcublas", "cuBLAS"},
      {"libcudnn", "cuDNN"},       {"libcufft", "cuFFT"},       {"libcusolver", "cuSOLVER"},
      {"libcusparse", "cuSPARSE"}, {"libcurand", "cuRAND"},     {"libnvshmem", "NVSHMEM"},
      {"libtorch", "PyTorch (outside its caching allocator)"},
  };
  for (const Known& k : kKnown) {
    if (name.substr(0, k.prefix.size()) == k.prefix) return k.friendly;
  }
  return name;
}

CallerClass classify_caller(std::string_view path) noexcept {
  const std::string_view name = library_display_name(path);
  // The driver (libcuda.so.1), the runtime (libcudart.so.13, also bundled under other names by
  // some wheels as libcudart-<hash>.so) and CUPTI, which calls the callback.
  if (name == "libcuda.so" || starts_with(name, "libcuda.so.") || starts_with(name, "libcudart") ||
      starts_with(name, "libcupti")) {
    return CallerClass::CudaLibrary;
  }
  if (name == "libc10_cuda.so" || starts_with(name, "libc10_cuda.so.") || starts_with(name, "libc10_cuda-")) {
    return CallerClass::PyTorchAllocator;
  }
  return CallerClass::Other;
}

void ExternalAllocTranslator::emit(EventKind kind, std::int16_t device, std::uint64_t addr, std::uint64_t bytes,
                                   ExternalApi api, std::uint32_t library_id, std::uint32_t stack_id,
                                   std::uint32_t thread, std::vector<Event>* out) {
  Event e;
  e.kind = kind;
  e.device = Device{DeviceType::CUDA, device};
  e.addr = addr;
  e.bytes = bytes;
  e.flags = static_cast<std::uint8_t>(api);
  e.thread = thread;
  if (kind == EventKind::ExternalAlloc) {
    e.string_id = library_id;
    e.stack_id = stack_id;
    bytes_[device] += bytes;
    ++stats_.allocations;
  } else {
    std::uint64_t& live = bytes_[device];
    live -= bytes < live ? bytes : live;
    ++stats_.frees;
  }
  out->push_back(e);
}

void ExternalAllocTranslator::on_alloc(const ExternalCall& c, std::vector<Event>* out) {
  if (!c.ok) {
    ++stats_.failed_calls;
    return;
  }
  if (c.addr == 0) return;  // a zero-byte allocation hands out no address
  auto [it, inserted] = live_.try_emplace(c.addr, Live{c.device, c.bytes, c.api});
  if (!inserted) {  // the address is live again: its free was not seen
    ++stats_.reused_addresses;
    emit(EventKind::ExternalFree, it->second.device, c.addr, it->second.bytes, it->second.api, 0, 0, c.thread, out);
    it->second = Live{c.device, c.bytes, c.api};
  }
  emit(EventKind::ExternalAlloc, c.device, c.addr, c.bytes, c.api, c.library_id, c.stack_id, c.thread, out);
}

void ExternalAllocTranslator::on_free(const ExternalCall& c, std::vector<Event>* out) {
  if (c.addr == 0) return;  // cudaFree(nullptr): a no-op (often used to create the context)
  auto it = live_.find(c.addr);
  if (it == live_.end()) {
    ++stats_.unmatched_frees;
    return;
  }
  const Live l = it->second;
  live_.erase(it);
  emit(EventKind::ExternalFree, l.device, c.addr, l.bytes, l.api, 0, 0, c.thread, out);
}

void ExternalAllocTranslator::on_map(const ExternalCall& c, std::vector<Event>* out) {
  auto h = handles_.find(c.handle);
  if (h == handles_.end()) {
    ++stats_.unknown_handles;
    return;
  }
  ++h->second.mappings;
  mappings_[c.addr] = Mapping{c.handle, c.bytes};
  if (!h->second.emitted) {
    h->second.emitted = true;
    h->second.addr = c.addr;
    const Handle& x = h->second;
    emit(EventKind::ExternalAlloc, x.device, x.addr, x.bytes, ExternalApi::MemCreate, x.library_id, x.stack_id,
         x.thread, out);
  }
}

void ExternalAllocTranslator::on_unmap(const ExternalCall& c, std::vector<Event>* out) {
  // Every mapping that starts inside [addr, addr + bytes) ends (the driver unmaps whole mappings).
  const std::uint64_t end = c.bytes > UINT64_MAX - c.addr ? UINT64_MAX : c.addr + c.bytes;
  auto it = mappings_.lower_bound(c.addr);
  if (it == mappings_.end() || it->first >= end) {
    ++stats_.unknown_handles;  // a range this translator never saw mapped (PyTorch's, imported)
    return;
  }
  while (it != mappings_.end() && it->first < end) {
    const std::uint64_t handle = it->second.handle;
    it = mappings_.erase(it);
    auto h = handles_.find(handle);
    if (h == handles_.end()) continue;
    if (h->second.mappings > 0) --h->second.mappings;
    release_if_unused(handle, out);
  }
}

void ExternalAllocTranslator::release_if_unused(std::uint64_t handle, std::vector<Event>* out) {
  auto h = handles_.find(handle);
  if (h == handles_.end() || h->second.references > 0 || h->second.mappings > 0) return;
  const Handle x = h->second;
  handles_.erase(h);
  if (x.emitted) {
    emit(EventKind::ExternalFree, x.device, x.addr, x.bytes, ExternalApi::MemCreate, 0, 0, x.thread, out);
  } else {
    ++stats_.unmapped_handles;
  }
}

void ExternalAllocTranslator::translate(const ExternalCall& c, std::vector<Event>* out) noexcept {
  try {
    ++stats_.calls;
    switch (c.kind) {
      case ExternalCallKind::Alloc: on_alloc(c, out); break;
      case ExternalCallKind::Free: on_free(c, out); break;
      case ExternalCallKind::MemCreate: {
        if (!c.ok) {
          ++stats_.failed_calls;
          break;
        }
        Handle h;
        h.device = c.device;
        h.bytes = c.bytes;
        h.library_id = c.library_id;
        h.stack_id = c.stack_id;
        h.thread = c.thread;
        auto [it, inserted] = handles_.try_emplace(c.handle, h);
        if (!inserted) {  // a handle value reused while we still held it: the old one was missed
          ++stats_.reused_addresses;
          it->second.references = 0;
          it->second.mappings = 0;
          release_if_unused(c.handle, out);
          handles_.emplace(c.handle, h);
        }
        break;
      }
      case ExternalCallKind::MemRetain: {
        if (!c.ok) break;
        auto h = handles_.find(c.handle);
        if (h == handles_.end()) {
          ++stats_.unknown_handles;
        } else {
          ++h->second.references;
        }
        break;
      }
      case ExternalCallKind::MemRelease: {
        auto h = handles_.find(c.handle);
        if (h == handles_.end()) {
          ++stats_.unknown_handles;
          break;
        }
        if (h->second.references > 0) --h->second.references;
        release_if_unused(c.handle, out);
        break;
      }
      case ExternalCallKind::MemMap:
        if (c.ok) on_map(c, out);
        break;
      case ExternalCallKind::MemUnmap: on_unmap(c, out); break;
    }
  } catch (...) {
    ++stats_.internal_errors;
  }
}

std::uint64_t ExternalAllocTranslator::live_bytes(std::int16_t device) const noexcept {
  auto it = bytes_.find(device);
  return it == bytes_.end() ? 0 : it->second;
}

}  // namespace ridgescope
