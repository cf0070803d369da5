// Specification of how the CUDA source tells workspace blocks from tensors: the blocks torch's
// cuBLAS and cuBLASLt workspace maps (at::cuda::cublas_handle_stream_to_workspace) hold are
// tagged `workspace` at phase boundaries. Runs without a GPU: entries with made-up addresses
// (never dereferenced, no-op deleters) are put into torch's own maps, in whichever layout this
// torch has (a DataPtr in 2.11, a (DataPtr, size) pair in 2.14).
#include <dlfcn.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "catch.h"
#include "cuda_allocator_source.h"

using ridgescope::sources::cuda_workspace_blocks;
using ridgescope::sources::cuda_workspace_tags_compiled;
using ridgescope::sources::CudaWorkspaceBlock;

#if defined(RIDGESCOPE_WITH_CUDA) && __has_include(<cublas_v2.h>) && __has_include(<cublasLt.h>) && \
    __has_include(<cusparse.h>) && __has_include(<cusolverDn.h>)
#include <ATen/cuda/CUDAContextLight.h>

#include <mutex>
#include <shared_mutex>

namespace {
using MapFn = at::cuda::WorkspaceMapWithMutex& (*)();

MapFn map_fn(const char* symbol) {
  void* lib = ::dlopen("libtorch_cuda.so", RTLD_NOW);  // loaded already in a torch process
  REQUIRE(lib != nullptr);
  void* f = ::dlsym(lib, symbol);
  REQUIRE(f != nullptr);
  return reinterpret_cast<MapFn>(f);
}

// A template, so that only the branch of this torch's layout is compiled.
template <class Map>
void put(Map& m, void* handle, std::uintptr_t addr, int device, std::size_t bytes) {
  at::DataPtr data(reinterpret_cast<void*>(addr), reinterpret_cast<void*>(addr), [](void*) {},
                   c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
  using Value = typename decltype(m.map)::mapped_type;
  std::unique_lock<std::shared_mutex> lock(m.mutex);
  if constexpr (std::is_same_v<Value, at::DataPtr>) {
    (void)bytes;
    m.map.emplace(std::make_tuple(handle, nullptr), std::move(data));
  } else {
    m.map.emplace(std::make_tuple(handle, nullptr), Value{std::move(data), bytes});
  }
}

void take_out(at::cuda::WorkspaceMapWithMutex& m, void* handle) {
  std::unique_lock<std::shared_mutex> lock(m.mutex);
  m.map.erase(std::make_tuple(handle, nullptr));
}
}  // namespace

SCENARIO("the blocks in torch's cuBLAS and cuBLASLt workspace maps are the workspace blocks",
         "[torch][cuda][workspace]") {
  REQUIRE(cuda_workspace_tags_compiled());
  auto& cublas = map_fn("_ZN2at4cuda33cublas_handle_stream_to_workspaceEv")();
  auto& cublaslt = map_fn("_ZN2at4cuda35cublaslt_handle_stream_to_workspaceEv")();
  const std::size_t before = cuda_workspace_blocks().size();  // none in a process without a GPU
  GIVEN("a 32 MiB cuBLAS workspace on cuda:0 for two handles (two threads) and a 1 MiB cuBLASLt one on cuda:1") {
    int h1 = 0, h2 = 0, h3 = 0;  // their addresses stand for handles
    put(cublas, &h1, 0x7f0000000000, 0, 32u << 20);
    put(cublas, &h2, 0x7f0002000000, 0, 32u << 20);
    put(cublaslt, &h3, 0x7f1000000000, 1, 1u << 20);
    const std::vector<CudaWorkspaceBlock> found = cuda_workspace_blocks();
    take_out(cublas, &h1);
    take_out(cublas, &h2);
    take_out(cublaslt, &h3);
    THEN("all three are found with their device, address and map") {
      REQUIRE(found.size() == before + 3);
      auto has = [&](CudaWorkspaceBlock b) {
        for (const auto& f : found) {
          if (f == b) return true;
        }
        return false;
      };
      CHECK(has({0, 0x7f0000000000, false}));
      CHECK(has({0, 0x7f0002000000, false}));
      CHECK(has({1, 0x7f1000000000, true}));
    }
    THEN("once torch drops them, they are not reported") { CHECK(cuda_workspace_blocks().size() == before); }
  }
}
#else
SCENARIO("a build without the cuBLAS headers reports no workspace blocks", "[torch][cuda][workspace]") {
  CHECK_FALSE(cuda_workspace_tags_compiled());
  CHECK(cuda_workspace_blocks().empty());
}
#endif
