// Specification of the translation of CUPTI's allocation calls into external_alloc /
// external_free events (ridgescope/external_alloc.h). Runs without a GPU, CUDA or CUPTI: the
// calls are the sequences the CUPTI callback sees, recorded as plain values — NCCL's own
// allocator (ncclCuMemAlloc / ncclCuMemFree in NCCL's src/include/alloc.h), cuBLAS's handle
// allocations through cudaMalloc, a library's stream-ordered pool, PyTorch's expandable
// segments (which are not external and never reach the translator).
#include <cstdint>
#include <string>
#include <vector>

#include "catch.h"
#include "ridgescope/external_alloc.h"

using namespace ridgescope;

namespace {

constexpr std::uint64_t MiB = 1024 * 1024;
constexpr std::uint32_t kNccl = 7;    // the trace string id of "libnccl.so.2"
constexpr std::uint32_t kCublas = 8;  // "libcublas.so.13"

ExternalCall alloc(std::uint64_t addr, std::uint64_t bytes, ExternalApi api, std::uint32_t library = kCublas,
                   bool ok = true) {
  ExternalCall c;
  c.kind = ExternalCallKind::Alloc;
  c.api = api;
  c.addr = addr;
  c.bytes = bytes;
  c.library_id = library;
  c.stack_id = 4;
  c.thread = 1;
  c.ok = ok;
  return c;
}
ExternalCall call(ExternalCallKind kind, std::uint64_t handle, std::uint64_t addr = 0, std::uint64_t bytes = 0) {
  ExternalCall c;
  c.kind = kind;
  c.handle = handle;
  c.addr = addr;
  c.bytes = bytes;
  c.library_id = kNccl;
  c.thread = 3;
  return c;
}
ExternalCall free_of(std::uint64_t addr) {
  ExternalCall c;
  c.kind = ExternalCallKind::Free;
  c.addr = addr;
  c.thread = 1;
  return c;
}

// ncclCuMemAlloc: cuMemCreate, cuMemAddressReserve (not a callback we follow), cuMemMap,
// cuMemSetAccess (neither).
void nccl_alloc(ExternalAllocTranslator& t, std::uint64_t handle, std::uint64_t va, std::uint64_t bytes,
                std::vector<Event>* out) {
  ExternalCall create = call(ExternalCallKind::MemCreate, handle, 0, bytes);
  create.stack_id = 11;
  t.translate(create, out);
  t.translate(call(ExternalCallKind::MemMap, handle, va, bytes), out);
}
}  // namespace

SCENARIO("NCCL's virtual-memory allocations become one allocation per handle, freed when the driver frees it",
         "[core][external]") {
  GIVEN("NCCL allocating two buffers (4 MiB and 2 MiB) with ncclCuMemAlloc on cuda:0") {
    ExternalAllocTranslator t;
    std::vector<Event> out;
    nccl_alloc(t, 0xA1, 0x7f0000000000, 4 * MiB, &out);
    nccl_alloc(t, 0xA2, 0x7f0000400000, 2 * MiB, &out);
    THEN("each handle is written once, at its mapping, with the mapped address and NCCL's stack") {
      REQUIRE(out.size() == 2);
      CHECK(out[0].kind == EventKind::ExternalAlloc);
      CHECK(out[0].addr == 0x7f0000000000);
      CHECK(out[0].bytes == 4 * MiB);
      CHECK(out[0].device == Device{DeviceType::CUDA, 0});
      CHECK(external_api_from_byte(out[0].flags) == ExternalApi::MemCreate);
      CHECK(out[0].string_id == kNccl);
      CHECK(out[0].stack_id == 11);
      CHECK(out[1].addr == 0x7f0000400000);
      CHECK(t.live_bytes(0) == 6 * MiB);
    }
    // ncclCuMemFree: cuMemRetainAllocationHandle, cuMemRelease, cuMemGetAddressRange, cuMemUnmap,
    // cuMemRelease, cuMemAddressFree (the address-range calls are not followed).
    WHEN("ncclCuMemFree frees the first: retain, release, unmap, release") {
      out.clear();
      t.translate(call(ExternalCallKind::MemRetain, 0xA1, 0x7f0000000000), &out);
      t.translate(call(ExternalCallKind::MemRelease, 0xA1), &out);
      THEN("a retain and its release change nothing") { CHECK(out.empty()); }
      t.translate(call(ExternalCallKind::MemUnmap, 0, 0x7f0000000000, 4 * MiB), &out);
      THEN("unmapped but still referenced by cuMemCreate's handle: still held") {
        CHECK(out.empty());
        CHECK(t.live_bytes(0) == 6 * MiB);
      }
      t.translate(call(ExternalCallKind::MemRelease, 0xA1), &out);
      THEN("the last release frees the physical memory: one external_free of 4 MiB") {
        REQUIRE(out.size() == 1);
        CHECK(out[0].kind == EventKind::ExternalFree);
        CHECK(out[0].addr == 0x7f0000000000);
        CHECK(out[0].bytes == 4 * MiB);
        CHECK(t.live_bytes(0) == 2 * MiB);
        CHECK(t.stats().unknown_handles == 0);
      }
    }
  }
  GIVEN("a handle released right after its mapping (the memory lives while it is mapped)") {
    ExternalAllocTranslator t;
    std::vector<Event> out;
    nccl_alloc(t, 0xB1, 0x7f0001000000, 2 * MiB, &out);
    t.translate(call(ExternalCallKind::MemRelease, 0xB1), &out);
    THEN("it is still held after the release") {
      CHECK(out.size() == 1);
      CHECK(t.live_bytes(0) == 2 * MiB);
    }
    AND_THEN("the unmap frees it") {
      t.translate(call(ExternalCallKind::MemUnmap, 0, 0x7f0001000000, 2 * MiB), &out);
      REQUIRE(out.size() == 2);
      CHECK(out[1].kind == EventKind::ExternalFree);
      CHECK(t.live_bytes(0) == 0);
    }
  }
  GIVEN("NCCL mapping a peer's imported handle and reading address ranges of other buffers") {
    ExternalAllocTranslator t;
    std::vector<Event> out;
    // ncclCuMemAllocAddr on an imported handle, then ncclCuMemFreeAddr; retain/release of a
    // PyTorch buffer in ncclCuMemGetAddressRange.
    t.translate(call(ExternalCallKind::MemMap, 0xC0, 0x7f0002000000, 8 * MiB), &out);
    t.translate(call(ExternalCallKind::MemUnmap, 0, 0x7f0002000000, 8 * MiB), &out);
    t.translate(call(ExternalCallKind::MemRetain, 0xD0, 0x7f0003000000), &out);
    t.translate(call(ExternalCallKind::MemRelease, 0xD0), &out);
    THEN("memory this process did not create is never counted") {
      CHECK(out.empty());
      CHECK(t.live_bytes(0) == 0);
      CHECK(t.stats().unknown_handles == 4);
    }
  }
  GIVEN("physical memory created and released without ever being mapped") {
    ExternalAllocTranslator t;
    std::vector<Event> out;
    t.translate(call(ExternalCallKind::MemCreate, 0xE1, 0, 2 * MiB), &out);
    t.translate(call(ExternalCallKind::MemRelease, 0xE1), &out);
    THEN("nothing is written, and it is counted") {
      CHECK(out.empty());
      CHECK(t.stats().unmapped_handles == 1);
    }
  }
  GIVEN("one cuMemUnmap over two adjacent mappings of two handles") {
    ExternalAllocTranslator t;
    std::vector<Event> out;
    nccl_alloc(t, 0xF1, 0x7f0004000000, 2 * MiB, &out);
    nccl_alloc(t, 0xF2, 0x7f0004200000, 2 * MiB, &out);
    t.translate(call(ExternalCallKind::MemRelease, 0xF1), &out);
    t.translate(call(ExternalCallKind::MemRelease, 0xF2), &out);
    t.translate(call(ExternalCallKind::MemUnmap, 0, 0x7f0004000000, 4 * MiB), &out);
    THEN("both end") {
      REQUIRE(out.size() == 4);
      CHECK(out[2].kind == EventKind::ExternalFree);
      CHECK(out[3].kind == EventKind::ExternalFree);
      CHECK(t.live_bytes(0) == 0);
    }
  }
}

SCENARIO("plain allocations are followed by address", "[core][external]") {
  GIVEN("cuBLAS allocating with cudaMalloc on cuda:1, one failing, and a library's stream-ordered pool") {
    ExternalAllocTranslator t;
    std::vector<Event> out;
    ExternalCall a = alloc(0x7f1000000000, 3 * MiB, ExternalApi::Malloc);
    a.device = 1;
    t.translate(a, &out);
    ExternalCall failed = alloc(0, 100ull << 30, ExternalApi::Malloc, kCublas, /*ok=*/false);
    failed.device = 1;
    t.translate(failed, &out);
    t.translate(alloc(0x7f2000000000, 512, ExternalApi::MallocAsync), &out);
    THEN("each successful one is an external_alloc with its API; the failure is counted, not written") {
      REQUIRE(out.size() == 2);
      CHECK(out[0].device == Device{DeviceType::CUDA, 1});
      CHECK(out[0].bytes == 3 * MiB);
      CHECK(external_api_from_byte(out[0].flags) == ExternalApi::Malloc);
      CHECK(out[0].string_id == kCublas);
      CHECK(out[0].stack_id == 4);
      CHECK(external_api_from_byte(out[1].flags) == ExternalApi::MallocAsync);
      CHECK(t.stats().failed_calls == 1);
      CHECK(t.live_bytes(1) == 3 * MiB);
      CHECK(t.live_bytes(0) == 512);
    }
    WHEN("they are freed (the first from a thread whose current device is cuda:0), with cudaFree(nullptr) "
         "and a free of an address never seen among them") {
      out.clear();
      t.translate(free_of(0x7f1000000000), &out);
      t.translate(free_of(0), &out);
      t.translate(free_of(0x7f9000000000), &out);
      t.translate(free_of(0x7f2000000000), &out);
      THEN("the known ones are freed with their sizes and APIs; the unknown one is counted") {
        REQUIRE(out.size() == 2);
        CHECK(out[0].kind == EventKind::ExternalFree);
        CHECK(out[0].device == Device{DeviceType::CUDA, 1});  // the allocation's device
        CHECK(out[0].bytes == 3 * MiB);
        CHECK(out[1].bytes == 512);
        CHECK(external_api_from_byte(out[1].flags) == ExternalApi::MallocAsync);
        CHECK(t.stats().unmatched_frees == 1);
        CHECK(t.live_bytes(1) == 0);
        CHECK(t.live_bytes(0) == 0);
      }
    }
  }
  GIVEN("an address handed out again while still live (its free was missed)") {
    ExternalAllocTranslator t;
    std::vector<Event> out;
    t.translate(alloc(0x1000, 64, ExternalApi::Malloc), &out);
    t.translate(alloc(0x1000, 128, ExternalApi::Malloc), &out);
    THEN("the old one ends there, so the device holds only the new one") {
      REQUIRE(out.size() == 3);
      CHECK(out[1].kind == EventKind::ExternalFree);
      CHECK(out[1].bytes == 64);
      CHECK(t.live_bytes(0) == 128);
      CHECK(t.stats().reused_addresses == 1);
    }
  }
}

SCENARIO("the caller's library decides whose allocation it is", "[core][external]") {
  THEN("CUDA's own libraries are walked past") {
    CHECK(classify_caller("/usr/lib/x86_64-linux-gnu/libcuda.so.1") == CallerClass::CudaLibrary);
    CHECK(classify_caller("/v/site-packages/nvidia/cu13/lib/libcudart.so.13") == CallerClass::CudaLibrary);
    CHECK(classify_caller("/v/site-packages/nvidia/cu13/lib/libcupti.so.13") == CallerClass::CudaLibrary);
  }
  THEN("PyTorch's caching allocator (libc10_cuda) is PyTorch's, already in the reserved bytes") {
    CHECK(classify_caller("/v/site-packages/torch/lib/libc10_cuda.so") == CallerClass::PyTorchAllocator);
  }
  THEN("everything else is outside PyTorch, named by its file") {
    CHECK(classify_caller("/v/site-packages/nvidia/nccl/lib/libnccl.so.2") == CallerClass::Other);
    CHECK(classify_caller("/v/site-packages/torch/lib/libtorch_cuda.so") == CallerClass::Other);
    CHECK(classify_caller("/v/site-packages/nvidia/cu13/lib/libcublasLt.so.13") == CallerClass::Other);
    CHECK(classify_caller("libcudaxyz.so") == CallerClass::Other);
    CHECK(library_display_name("/v/site-packages/nvidia/nccl/lib/libnccl.so.2") == "libnccl.so.2");
    CHECK(library_friendly_name("libnccl.so.2") == "NCCL");
    CHECK(library_friendly_name("/x/libcublasLt.so.13") == "cuBLASLt");
    CHECK(library_friendly_name("libcublas.so.13") == "cuBLAS");
    CHECK(library_friendly_name("libfoo.so") == "libfoo.so");
  }
  THEN("API names and out-of-range bytes") {
    CHECK(external_api_name(ExternalApi::MemCreate) == "cuMemCreate");
    CHECK(external_api_name(ExternalApi::MallocAsync) == "cudaMallocAsync");
    CHECK(external_api_from_byte(200) == ExternalApi::Unknown);
  }
}
