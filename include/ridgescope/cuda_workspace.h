// ridgescope/cuda_workspace.h — the cuBLAS and cuBLASLt workspaces torch allocates through the
// CUDA caching allocator, per handle and stream, at the handle's first BLAS call, and keeps for
// the process's life (at::cuda::getChosenWorkspaceSize, getCUDABlasLtWorkspaceSize; see
// /work/shared/reference/torch-internals.md). The snapshot inference recognises a workspace by
// its size; rs.estimate (python/ridgescope/_estimate, through _C) adds one per handle.
//
// Thread-safety: constants only.
#pragma once

#include <cstdint>

namespace ridgescope {

// cuBLAS's default workspace (CUBLAS_WORKSPACE_CONFIG ":4096:2:16:8", every GPU before Hopper):
// 2 x 4096 KiB + 8 x 16 KiB, in bytes.
inline constexpr std::uint64_t kCublasDefaultWorkspaceBytes = 2 * 4096 * 1024 + 8 * 16 * 1024;
// On Hopper (sm90: H100, H200) torch's default is ":4096:8": 8 x 4096 KiB, in bytes.
inline constexpr std::uint64_t kCublasHopperWorkspaceBytes = 8 * 4096 * 1024;
// cuBLASLt's own workspace where it does not share cuBLAS's (torch 2.11 without
// TORCH_CUBLASLT_UNIFIED_WORKSPACE=1): CUBLASLT_WORKSPACE_SIZE KiB, default 1024, in bytes.
inline constexpr std::uint64_t kCublasLtDefaultWorkspaceBytes = 1024 * 1024;

}  // namespace ridgescope
