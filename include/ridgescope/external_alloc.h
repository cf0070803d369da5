// ridgescope/external_alloc.h — device memory allocated outside PyTorch's caching allocator
// (NCCL's buffers, cuBLAS/cuDNN handle internals, any library's cudaMalloc or cuMem* calls),
// translated from what CUPTI's callback API shows into `external_alloc` / `external_free`
// events (docs/trace_format.md, kinds 13 and 14; docs/gpu.md, "Memory outside PyTorch").
//
// Pure: no torch, no CUDA, no CUPTI. The CUPTI source (csrc/torch/cupti_source.cpp) copies each
// allocation call's fields into an ExternalCall and hands it here; the Catch2 tests feed the
// same calls from recorded sequences.
//
// What each call becomes:
//   cudaMalloc, cudaMallocPitch/3D, cudaMallocManaged, cudaMallocAsync (from a pool too),
//   cuMemAlloc, cuMemAllocPitch, cuMemAllocManaged, cuMemAllocAsync, cuMemAllocFromPoolAsync
//                -> external_alloc of the returned address and its bytes (a failed call: none);
//   cudaFree, cudaFreeAsync, cuMemFree, cuMemFreeAsync
//                -> external_free of an address an external_alloc made live (others are counted);
//   the virtual-memory route (NCCL since 2.19, and anything else using cuMem* directly):
//     cuMemCreate makes physical memory: it is held from then on; the event is written at the
//     handle's first cuMemMap, with the mapped address (so exports draw it where it lives), and
//     carries the handle's whole size. cuMemRetainAllocationHandle adds a reference to a handle
//     this translator knows; cuMemRelease drops one; cuMemUnmap ends the mappings it covers. The
//     memory is freed (external_free) when no reference and no mapping is left, as the driver
//     frees it. Handles made elsewhere (PyTorch's expandable segments, imported from another
//     process) are unknown and never counted: imported memory belongs to its exporter.
//
// Which calls are PyTorch's own: classify_caller() on the library of the first frame outside
// CUDA's own libraries. PyTorch's caching allocator calls cudaMalloc, cudaFree, cudaMallocAsync,
// cudaFreeAsync and (expandable segments) the cuMem* driver entry points from libc10_cuda
// (c10/cuda/CUDACachingAllocator.cpp, CUDAMallocAsyncAllocator.cpp), and the allocator source
// already reports that memory (reserved bytes); those calls are counted and dropped.
//
// Thread-safety: none. One translator serves all devices and is used under the caller's lock.
#pragma once

#include <cstdint>
#include <map>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ridgescope/event.h"

namespace ridgescope {

// The allocation API, stored in the records' flags byte. An unknown value reads as Unknown.
enum class ExternalApi : std::uint8_t {
  Unknown = 0,
  Malloc = 1,         // cudaMalloc, cuMemAlloc
  MallocPitch = 2,    // cudaMallocPitch, cudaMalloc3D, cuMemAllocPitch
  MallocManaged = 3,  // cudaMallocManaged, cuMemAllocManaged (resident on the device when used)
  MallocAsync = 4,    // cudaMallocAsync, cudaMallocFromPoolAsync, cuMemAllocAsync, ...FromPoolAsync
  MemCreate = 5,      // cuMemCreate: physical memory of the virtual-memory route
};
inline constexpr std::uint8_t kExternalApiCount = 6;

// "cudaMalloc", "cudaMallocPitch", "cudaMallocManaged", "cudaMallocAsync", "cuMemCreate", "unknown".
std::string_view external_api_name(ExternalApi api) noexcept;
ExternalApi external_api_from_byte(std::uint8_t value) noexcept;

// One allocation-related call, as plain values (what the CUPTI callback copies).
enum class ExternalCallKind : std::uint8_t {
  Alloc,       // an address was handed out (addr, bytes, api)
  Free,        // an address is being freed (addr)
  MemCreate,   // cuMemCreate: physical memory (handle, bytes)
  MemRetain,   // cuMemRetainAllocationHandle (handle, addr)
  MemRelease,  // cuMemRelease (handle)
  MemMap,      // cuMemMap (addr, bytes, offset, handle)
  MemUnmap,    // cuMemUnmap (addr, bytes)
};

struct ExternalCall {
  ExternalCallKind kind = ExternalCallKind::Alloc;
  ExternalApi api = ExternalApi::Unknown;  // Alloc
  bool ok = true;                // the call returned success (allocations are read on exit)
  std::int16_t device = 0;       // CUDA ordinal
  std::uint64_t addr = 0;        // device address (Alloc: the one returned)
  std::uint64_t bytes = 0;       // Alloc, MemCreate: bytes; MemMap, MemUnmap: the range's bytes
  std::uint64_t handle = 0;      // Mem*: CUmemGenericAllocationHandle
  std::uint64_t offset = 0;      // MemMap: offset into the handle
  std::uint32_t library_id = 0;  // trace string id of the calling library's file name
  std::uint32_t stack_id = 0;    // where it was made (0: none)
  std::uint32_t thread = 0;
};

// Who made a call, from the file name of the first native frame that is not the callback's own.
enum class CallerClass : std::uint8_t {
  CudaLibrary,       // libcuda, libcudart, libcupti (and the callback's library): keep walking
  PyTorchAllocator,  // libc10_cuda: the caching allocator (already reported)
  Other,             // a library outside PyTorch's allocator: its allocation is external
};
CallerClass classify_caller(std::string_view library_path) noexcept;
// The file name shown for a library ("/x/y/libnccl.so.2" -> "libnccl.so.2").
std::string_view library_display_name(std::string_view library_path) noexcept;
// What a person calls it: "NCCL", "cuBLASLt", "cuBLAS", "cuDNN", "cuFFT", "cuSOLVER",
// "cuSPARSE", "cuRAND", "PyTorch (outside its caching allocator)" for libtorch*; else the file
// name itself.
std::string_view library_friendly_name(std::string_view library) noexcept;

struct ExternalTranslatorStats {
  std::uint64_t calls = 0;             // calls translated
  std::uint64_t allocations = 0;       // external_alloc events written
  std::uint64_t frees = 0;             // external_free events written
  std::uint64_t failed_calls = 0;      // allocations that returned an error (no event)
  std::uint64_t unmatched_frees = 0;   // frees of addresses no external_alloc made live
  std::uint64_t unknown_handles = 0;   // cuMem* calls on handles this translator did not create
  std::uint64_t reused_addresses = 0;  // an address handed out while still live (its free was missed)
  std::uint64_t unmapped_handles = 0;  // physical memory released without ever being mapped
  std::uint64_t internal_errors = 0;   // calls dropped (out of memory in the tables)
};

class ExternalAllocTranslator {
 public:
  // Appends the events of one call to *out (zero, one or two). Never throws: a failure inside
  // is counted in internal_errors and the call dropped.
  void translate(const ExternalCall& call, std::vector<Event>* out) noexcept;

  // Bytes of external memory live on a device now (by this translator's count).
  std::uint64_t live_bytes(std::int16_t device) const noexcept;
  const ExternalTranslatorStats& stats() const noexcept { return stats_; }

 private:
  struct Live {
    std::int16_t device = 0;
    std::uint64_t bytes = 0;
    ExternalApi api = ExternalApi::Unknown;
  };
  struct Handle {
    std::int16_t device = 0;
    std::uint64_t bytes = 0;
    std::uint32_t library_id = 0, stack_id = 0, thread = 0;
    std::uint32_t references = 1;  // cuMemCreate's, plus every retain
    std::uint32_t mappings = 0;
    bool emitted = false;           // its external_alloc was written
    std::uint64_t addr = 0;         // the address it was written with
  };
  struct Mapping {
    std::uint64_t handle = 0, bytes = 0;
  };
  void on_alloc(const ExternalCall& c, std::vector<Event>* out);
  void on_free(const ExternalCall& c, std::vector<Event>* out);
  void on_map(const ExternalCall& c, std::vector<Event>* out);
  void on_unmap(const ExternalCall& c, std::vector<Event>* out);
  void release_if_unused(std::uint64_t handle, std::vector<Event>* out);
  void emit(EventKind kind, std::int16_t device, std::uint64_t addr, std::uint64_t bytes, ExternalApi api,
            std::uint32_t library_id, std::uint32_t stack_id, std::uint32_t thread, std::vector<Event>* out);

  // By address alone: device addresses are unique across devices (unified addressing), and a
  // free may come from a thread whose current device is another one.
  std::unordered_map<std::uint64_t, Live> live_;
  std::unordered_map<std::uint64_t, Handle> handles_;      // by handle value
  std::map<std::uint64_t, Mapping> mappings_;              // by mapped address (one address space)
  std::unordered_map<std::int16_t, std::uint64_t> bytes_;  // live bytes per device
  ExternalTranslatorStats stats_;
};

}  // namespace ridgescope
