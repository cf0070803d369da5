"""What a CUDA target adds to a dry run's bytes: the caching allocator's block rounding and its
model (csrc/core/allocator, through _C), and the cuBLAS and cuBLASLt workspaces torch allocates
per handle and stream (their sizes: include/ridgescope/cuda_workspace.h, through _C)."""
from __future__ import annotations

import os
from typing import Any

import torch

from .. import _C

CUDA_BLOCK = _C.CUDA_MIN_BLOCK_BYTES  # the caching allocator's smallest block and rounding unit
# cuBLAS workspace torch allocates through the caching allocator for each cuBLAS handle and
# stream (at::cuda::setWorkspaceForHandle), at the handle's first BLAS call, and keeps:
# ":4096:8" (8 x 4 MiB) on Hopper (sm90: H100, H200), torch's default CUBLAS_WORKSPACE_CONFIG
# there (":4096:2:16:8", 8.125 MiB, elsewhere; pass workspace_bytes= for another GPU).
DEFAULT_CUDA_WORKSPACE = _C.CUBLAS_HOPPER_WORKSPACE_BYTES
# cuBLASLt (addmm with a 1-D bias, i.e. nn.Linear with bias) has its own workspace per handle
# and stream in torch 2.11 (getCUDABlasLtWorkspace: its own map unless
# TORCH_CUBLASLT_UNIFIED_WORKSPACE=1), CUBLASLT_WORKSPACE_SIZE KiB (default 1024), at most the
# cuBLAS workspace. torch 2.14 shares the cuBLAS workspace by default
# (unified_cublas_and_lt_workspaces); 2.12 and 2.13 were not checked and are taken as 2.14.
DEFAULT_CUBLASLT_WORKSPACE = _C.CUBLASLT_DEFAULT_WORKSPACE_BYTES
_MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "_addmm_activation", "addbmm", "matmul",
               "_scaled_mm", "addmv", "mv"}


def cublas_workspace_bytes(environ: "dict[str, str] | None" = None) -> int:
    """torch's parseChosenWorkspaceSize: CUBLAS_WORKSPACE_CONFIG ":SIZE_KiB:COUNT[...]" summed,
    else the Hopper default (DEFAULT_CUDA_WORKSPACE)."""
    import re
    env = os.environ if environ is None else environ
    conf = env.get("CUBLAS_WORKSPACE_CONFIG")
    if conf:
        pairs = re.findall(r":([0-9]+):([0-9]+)", conf)
        if pairs:
            return sum(int(size) * 1024 * int(count) for size, count in pairs)
    return DEFAULT_CUDA_WORKSPACE


def cublaslt_workspace_bytes(cublas_bytes: int, environ: "dict[str, str] | None" = None,
                             version: "tuple[int, int] | None" = None) -> int:
    """The separate cuBLASLt workspace per handle and stream (0 where it shares cuBLAS's)."""
    env = os.environ if environ is None else environ
    # torch.__version__ (a TorchVersion) compares with tuples
    if (version if version is not None else torch.__version__) >= (2, 12):
        return 0
    if env.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "").lower() in ("1", "true", "on", "yes", "y"):
        return 0
    kib = 1024
    try:
        kib = int(env.get("CUBLASLT_WORKSPACE_SIZE", "1024"))
    except ValueError:
        pass
    return min(kib * 1024, cublas_bytes)


def _uses_cublaslt(name: str, args: Any) -> bool:
    """addmm with a 1-D bias of a 2-D result (nn.Linear with bias) goes through cuBLASLt's
    bias epilogue (addmm_out_cuda_impl's useLtInterface) when both matrices have more than one
    row and column."""
    if name not in ("addmm", "_addmm_activation") or len(args) < 3:
        return False
    bias, m1, m2 = args[0], args[1], args[2]
    if not all(isinstance(t, torch.Tensor) for t in (bias, m1, m2)):
        return False
    return (bias.dim() == 1 and m1.dim() == 2 and m2.dim() == 2 and m1.shape[0] > 1
            and m1.shape[1] > 1 and m2.shape[1] > 1)



def _round_block(n: int) -> int:
    """The block the caching allocator hands out for a request of ``n`` bytes (its default
    settings; the allocator model applies PYTORCH_CUDA_ALLOC_CONF)."""
    return _C.allocator_round_size(n)


def _new_allocator_model(alloc_conf: str, capacity: int | None) -> Any:
    """The CUDA caching-allocator model (csrc/core/allocator_model.cpp), or None where this
    build has none (then reserved bytes are not predicted). A malformed ``alloc_conf`` raises
    RidgescopeError naming the option."""
    try:
        from .._allocator_model import AllocatorModel
        return AllocatorModel(alloc_conf, capacity)
    except (ImportError, AttributeError):
        return None
