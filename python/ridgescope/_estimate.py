"""``rs.estimate``: will a training step fit? A dry run under PyTorch's fake tensors.

The model, optimizer and batch are built under ``FakeTensorMode``: every tensor has its real
shape, dtype and strides, autograd saves what it really saves, and no memory is allocated (a
7B model costs a few hundred MiB of Python objects). Full training steps run on them (zero_grad,
forward, backward, optimizer step, including the first step's lazy optimizer state) with the
same instrumentation as a tracked run (``_instrument.Instrumentation``: the same phases, labels,
categories and tags), but its native side is ``_DryNative`` below: a dispatch mode sees every
new storage an op returns (exact bytes), a weak-reference finalizer sees it die, and both are
written as alloc and free events into an ordinary ``.rstrace`` through ``_C.TraceWriter``. The
normal analysis reads that trace, so the Report has the same shape as a tracked run's.

For a CUDA target the fake tensors run on the CPU device (the autograd engine cannot run fake
CUDA tensors on a machine without a GPU), with CUDA's choices emulated where they change
memory: block rounding (512 bytes, or the allocator model), the foreach AdamW/Adam/SGD default,
the optimizer's step counters staying on the host, the cuBLAS workspace, and CUDA autocast's
float32 op list on top of CPU autocast. What is and is not modelled: docs/fit.md.
"""
from __future__ import annotations

import contextlib
import inspect
import itertools
import json
import math
import os
import sys
import tempfile
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import _C
from ._errors import RidgescopeError
from ._format import format_bytes, parse_bytes
from ._report import Report

CUDA_BLOCK = 512  # the caching allocator's smallest block and rounding unit (bytes)
# cuBLAS workspace torch allocates through the caching allocator for each cuBLAS handle and
# stream (at::cuda::setWorkspaceForHandle), at the handle's first BLAS call, and keeps:
# ":4096:8" (8 x 4 MiB) on Hopper (sm90: H100, H200), torch's default CUBLAS_WORKSPACE_CONFIG
# there (":4096:2:16:8", 8.125 MiB, elsewhere; pass workspace_bytes= for another GPU).
DEFAULT_CUDA_WORKSPACE = 8 * 4096 * 1024
# cuBLASLt (addmm with a 1-D bias, i.e. nn.Linear with bias) has its own workspace per handle
# and stream in torch 2.11 (getCUDABlasLtWorkspace: its own map unless
# TORCH_CUBLASLT_UNIFIED_WORKSPACE=1), CUBLASLT_WORKSPACE_SIZE KiB (default 1024), at most the
# cuBLAS workspace. torch 2.14 shares the cuBLAS workspace by default
# (unified_cublas_and_lt_workspaces); 2.12 and 2.13 were not checked and are taken as 2.14.
DEFAULT_CUBLASLT_WORKSPACE = 1024 * 1024
_MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "_addmm_activation", "addbmm", "matmul",
               "_scaled_mm", "addmv", "mv"}
DTYPE_POLICIES = (None, "fp32", "bf16", "fp16", "bf16-autocast", "fp16-autocast")


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
    return max(CUDA_BLOCK, (n + CUDA_BLOCK - 1) // CUDA_BLOCK * CUDA_BLOCK)


# --------------------------------------------------------------------------- allocator model
def _new_allocator_model(alloc_conf: str, capacity: int | None) -> Any:
    """The CUDA caching-allocator model (csrc/core/allocator_model.cpp), or None where this
    build has none (then reserved bytes are not predicted). A malformed ``alloc_conf`` raises
    RidgescopeError naming the option."""
    try:
        from ._allocator_model import AllocatorModel
        return AllocatorModel(alloc_conf, capacity)
    except (ImportError, AttributeError):
        return None


# --------------------------------------------------------------------------- the dry native
class _DryNative:
    """The subset of ``_C.Session`` that ``Instrumentation`` calls, for fake tensors: storages
    are known by identity (a fake storage has no address), each gets a synthetic address, and
    every event goes to a ``_C.TraceWriter``. Single-threaded by construction (the dry run runs
    backward on the calling thread), but the module stack is per thread as in the native one."""

    def __init__(self, path: str, cuda: bool, allocator: Any, limited: Any,
                 workspace_bytes: int) -> None:
        self._w = _C.TraceWriter(path)
        self.cuda = cuda
        # Two allocator models: one without a limit (what the step needs: its segments go into
        # the trace) and one with the capacity (whether the step fits: torch releases cached
        # blocks and retries before it raises, so a step can fit below the unlimited peak).
        self._allocator = allocator
        self._limited = limited
        self._segment_cursor = 0
        if allocator is not None:
            allocator.record_segment_events(True)
        self._workspace_bytes = workspace_bytes if cuda else 0
        self._lt_workspace_bytes = cublaslt_workspace_bytes(workspace_bytes) if cuda else 0
        self._workspaces: set[tuple[str, bool]] = set()  # (thread, cuBLASLt) allocated so far
        self._workspace_holders: list[Any] = []
        self._time = 0
        self._next_addr = 0x10000
        self._next_id = 1
        self._storages: dict[int, tuple[int, int, int, Any]] = {}  # id(st) -> (addr, block, alloc id, ref)
        self._local = threading.local()
        self._watched: list[torch.Tensor] = []
        self._watched_labels: list[int] = []
        self._watched_blocks: list[int] = []
        self.live = 0
        self.peak = 0
        self.oom: dict[str, Any] | None = None
        self.active = True
        self.degraded = False
        self.error = ""
        self._events = 0
        self.sample_name = self._w.intern("allocator_live_bytes")
        self.outside_label = self._w.intern(
            "activation saved outside the model (loss or functional code)")

    # -- writing
    def _event(self, kind: str, **kw: Any) -> None:
        self._time += 1000
        self._events += 1
        self._w.event(kind, self._time, cuda=self.cuda, **kw)

    def intern(self, text: str) -> int:
        return self._w.intern(text)

    def metadata(self, key: str, text: str) -> None:
        self._w.metadata(key, text)

    def phase_begin(self, name_id: int) -> None:
        self._event("phase_begin", string_id=name_id)

    def phase_end(self, name_id: int) -> None:
        self._event("phase_end", string_id=name_id)

    def step(self, n: int) -> None:
        self._event("step", value=n)

    def sample_allocator(self) -> None:
        self._event("sample", string_id=self.sample_name, value=self.live)

    def close(self, check: bool = True) -> None:
        """Ends the trace as a tracked run ends it. Safe to call twice."""
        if self.active:
            self.sample_allocator()
            self.metadata("session", json.dumps(self.stats()))
            self.active = False
            self._w.close()
            if check and self._w.failed:
                raise RidgescopeError(f"could not write the dry run's trace: {self._w.error}")

    # -- storages
    def _context(self) -> int:
        stack = getattr(self._local, "modules", None)
        return stack[-1][1] if stack else 0

    def known(self, st: Any) -> bool:
        return id(st) in self._storages

    def on_storage(self, st: Any, category: str | None = None, label: int = 0) -> int | None:
        """Records a new storage's allocation (and arranges its free); returns its address."""
        entry = self._storages.get(id(st))
        if entry is not None:
            return entry[0]
        nbytes = int(st.nbytes())
        if nbytes == 0:
            return None
        alloc_id = self._next_id
        self._next_id += 1
        block = nbytes
        addr = 0
        if self.cuda:
            block = _round_block(nbytes)
            if self._allocator is not None:
                before = self._allocator.reserved_bytes
                got = self._allocator.malloc(alloc_id, nbytes, 0)
                if got.get("ok"):
                    block, addr = int(got["block_bytes"]), int(got["address"])
                if self._allocator.reserved_bytes != before:
                    self._segments()
            if self._limited is not None:
                got = self._limited.malloc(alloc_id, nbytes, 0)
                if not got.get("ok") and self.oom is None:  # torch would raise here
                    self.oom = {"requested_bytes": nbytes, "allocated_bytes": self.live,
                                "status": got.get("status")}
        if not addr:
            addr = self._next_addr
            self._next_addr += _round_block(block) + CUDA_BLOCK
        ref = weakref.ref(st, lambda _r, key=id(st): self._on_free(key))
        self._storages[id(st)] = (addr, block, alloc_id, ref)
        self.live += block
        self.peak = max(self.peak, self.live)
        self._event("alloc", addr=addr, bytes=block, requested_bytes=nbytes,
                    string_id=self._context())
        if category is not None:
            self._event("tag", addr=addr, category=category, string_id=label)
        return addr

    def _on_free(self, key: int) -> None:
        entry = self._storages.pop(key, None)
        if entry is None or not self.active:
            return
        addr, block, alloc_id, _ = entry
        self.live -= block
        self._event("free", addr=addr, bytes=block)
        if self._allocator is not None:
            before = self._allocator.reserved_bytes
            self._allocator.free(alloc_id)
            if self._allocator.reserved_bytes != before:
                self._segments()
        if self._limited is not None:
            self._limited.free(alloc_id)

    def _segments(self) -> None:
        """Writes the allocator model's new segment events (reserved memory) into the trace."""
        events = self._allocator.segment_events()
        for e in events[self._segment_cursor:]:
            action = e["action"]
            if action in ("segment_alloc", "segment_map"):
                self._event("segment_alloc", addr=int(e["address"]), bytes=int(e["bytes"]))
            elif action in ("segment_free", "segment_unmap"):
                self._event("segment_free", addr=int(e["address"]), bytes=int(e["bytes"]))
        self._segment_cursor = len(events)

    def workspace(self, backward: bool, lt: bool) -> None:
        """The cuBLAS (or cuBLASLt) workspace of the handle this op runs on, allocated by torch
        through the caching allocator at the handle's first BLAS call and kept for the
        process's life. A training step has two handles, one per thread: the thread that runs
        forward and the optimizer, and autograd's worker thread for the CUDA device, which runs
        backward (and a checkpointed forward's recomputation)."""
        thread = "autograd thread" if backward else "main thread"
        for is_lt in ((False, True) if lt else (False,)):
            nbytes = self._lt_workspace_bytes if is_lt else self._workspace_bytes
            if not nbytes or (thread, is_lt) in self._workspaces:
                continue
            self._workspaces.add((thread, is_lt))
            holder = torch.UntypedStorage(nbytes, device="meta")
            self._workspace_holders.append(holder)
            what = "cuBLASLt workspace" if is_lt else "cuBLAS workspace"
            self.on_storage(holder, "workspace", self.intern(f"{what} ({thread})"))

    def _addr(self, tensor: Any) -> int | None:
        if not isinstance(tensor, torch.Tensor):
            return None
        try:
            st = tensor.untyped_storage()
        except Exception:
            return None
        entry = self._storages.get(id(st))
        return entry[0] if entry is not None else None

    # -- tagging (the same calls a tracked run makes)
    def tag(self, tensor: Any, category: str, label: int = 0, weak: bool = False) -> None:
        addr = self._addr(tensor)
        if addr is not None:
            self._event("tag", addr=addr, category=category, string_id=label, weak=weak)

    def register(self, tensor: Any, category: str, label: int = 0, weak: bool = False) -> int:
        if not isinstance(tensor, torch.Tensor) or not _on_target(tensor):
            return 0
        st = tensor.untyped_storage()
        if not self.known(st):
            self.on_storage(st)
        self.tag(tensor, category, label, weak)
        return int(st.nbytes())

    def pack_saved(self, tensor: Any) -> Any:
        stack = getattr(self._local, "modules", None)
        label = stack[-1][0] if stack else self.outside_label
        self.tag(tensor, "activation", label, True)
        return tensor

    def watch_parameters(self, params: Sequence[torch.Tensor], labels: Sequence[int]) -> None:
        self._watched = list(params)
        self._watched_labels = list(labels) + [0] * (len(params) - len(labels))
        self._watched_blocks = [0] * len(self._watched)

    def tag_gradients(self) -> int:
        n = 0
        for i, p in enumerate(self._watched):
            addr = self._addr(p.grad) if p.grad is not None else None
            if addr is None or addr == self._watched_blocks[i]:
                continue
            self._watched_blocks[i] = addr
            self._event("tag", addr=addr, category="gradient", string_id=self._watched_labels[i])
            n += 1
        return n

    def enter_module(self, activation_label: int, context: int = 0) -> None:
        stack = getattr(self._local, "modules", None)
        if stack is None:
            stack = self._local.modules = []
        stack.append((activation_label, context))

    def exit_module(self) -> None:
        stack = getattr(self._local, "modules", None)
        if stack:
            stack.pop()

    def degrade(self, reason: str) -> None:
        self.degraded = True
        self.error = reason

    def stats(self) -> dict[str, int]:
        return {"events": self._events, "dropped_events": 0, "bytes_written": 0,
                "chunks_written": 0, "buffer_bytes_peak": 0}


def _on_target(t: torch.Tensor) -> bool:
    return t.device.type == "cpu"


# norm ops whose saved statistics' dtype the fake kernels get wrong for a 16-bit input:
# name -> position of the weight argument
_NORM_WEIGHT_ARG = {"native_batch_norm": 1, "_native_batch_norm_legit": 1,
                    "native_layer_norm": 2, "native_group_norm": 1}
# ... of which the CUDA kernel returns float32 statistics for any 16-bit input (layer_norm_cuda:
# the accumulate type); the others, and every CPU kernel, only when the weight is float32
# (batch norm's CUDA path, cuDNN or native, decides its dtype; left as the weight's)
_NORM_FLOAT_STATS_ON_CUDA = {"native_layer_norm"}


class _StorageWatcher(TorchDispatchMode):
    """Sees every tensor an op returns; a storage not seen before is a new allocation."""

    def __init__(self, native: _DryNative) -> None:
        super().__init__()
        self.native = native
        self.enabled = True
        self.host_scalars = False  # True while torch.tensor(x) makes host tensors (CUDA target)
        self._host: dict[int, Any] = {}  # id(storage) -> weakref: host tensors (CUDA target)

    def _mark_host(self, out: Any) -> None:
        for t in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                key = id(st)
                if key not in self._host and key not in self.native._storages:
                    self._host[key] = weakref.ref(st, lambda _r, k=key: self._host.pop(k, None))

    def _norm_statistics(self, name: str, args: Any, out: Any) -> Any:
        """Batch, layer and group norm of a 16-bit input: the real kernels return the saved
        mean and inverse deviation in float32 when the weight is float32 (mixed types, e.g.
        batch norm under autocast), and CUDA's layer norm always (the accumulate type);
        autograd saves them until backward. The fake kernels return them in the
        input's dtype. Corrected here, before the storages are counted."""
        x = args[0] if args else None
        if (not isinstance(out, tuple) or len(out) < 3 or not isinstance(x, torch.Tensor)
                or x.dtype not in (torch.bfloat16, torch.float16)
                or not isinstance(out[1], torch.Tensor) or out[1].dtype != x.dtype):
            return out
        i = _NORM_WEIGHT_ARG[name]
        w = args[i] if len(args) > i else None
        if not ((self.native.cuda and name in _NORM_FLOAT_STATS_ON_CUDA)
                or (isinstance(w, torch.Tensor) and w.dtype == torch.float32)):
            return out
        return (out[0], out[1].float(), out[2].float()) + tuple(out[3:])

    def _all_host(self, args: Any, kwargs: Any) -> bool:
        found = False
        for a in tree_flatten((args, kwargs))[0]:
            if isinstance(a, torch.Tensor):  # host tensors here are scalars: a cheap first test
                if a.dim() > 0 or id(a.untyped_storage()) not in self._host:
                    return False
                found = True
        return found

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        native = self.native
        if func.overloadpacket.__name__ in _NORM_WEIGHT_ARG:
            out = self._norm_statistics(func.overloadpacket.__name__, args, out)
        if not self.enabled:
            return out
        if native.cuda:
            name = func.overloadpacket.__name__
            if name in _MATMUL_OPS:
                native.workspace(backward=torch._C._current_autograd_node() is not None,
                                 lt=_uses_cublaslt(name, args))
            # On a CUDA run, torch.tensor(0.0) with no device (an optimizer's step counter) is
            # a host tensor, and so is what is computed from host tensors only (bias
            # corrections): not device memory.
            if self.host_scalars and (name in ("lift_fresh", "lift_fresh_copy", "scalar_tensor")
                                      or (self._host and self._all_host(args, kwargs))):
                self._mark_host(out)
                return out
        leaves = out if isinstance(out, (list, tuple)) else (out,)
        for t in leaves:
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                st = t.untyped_storage()
                key = id(st)
                if key not in native._storages and key not in self._host:
                    native.on_storage(st)
        return out


# --------------------------------------------------------------------------- autocast (CUDA)
# CUDA autocast runs these in float32 (torch.amp docs, "CUDA Ops that can autocast to
# float32"); CPU autocast leaves most of them in the input's dtype. Emulated on top of CPU
# autocast with a function mode that upcasts their floating inputs.
_CUDA_FP32_FUNCS = ("softmax", "log_softmax", "layer_norm", "group_norm", "exp", "log", "pow",
                    "rsqrt", "reciprocal", "cumsum", "cumprod", "prod", "sum", "norm",
                    "normalize", "softplus", "mse_loss", "l1_loss", "smooth_l1_loss",
                    "nll_loss", "cross_entropy", "kl_div", "cosine_similarity", "logsumexp")


class _CudaAutocastFp32(torch.overrides.TorchFunctionMode):
    def __init__(self, low: torch.dtype) -> None:
        super().__init__()
        self.low = low
        names = set(_CUDA_FP32_FUNCS)
        self.funcs = set()
        for ns in (torch, torch.nn.functional, torch.Tensor):
            for n in names:
                f = getattr(ns, n, None)
                if f is not None:
                    self.funcs.add(f)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in self.funcs and torch.is_autocast_enabled("cpu"):
            up = lambda a: a.float() if isinstance(a, torch.Tensor) and a.dtype == self.low else a  # noqa: E731
            args = tuple(up(a) for a in args)
            kwargs = {k: up(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


class _CudaOnCpu(torch.overrides.TorchFunctionMode):
    """For a CUDA target: code that names the CUDA device (``torch.randn(..., device="cuda")``,
    ``x.to("cuda")``, ``x.cuda()``, a ``torch.device("cuda")`` context) gets the CPU device the
    fake tensors run on."""

    @staticmethod
    def _cpu(d: Any) -> Any:
        if isinstance(d, torch.device) and d.type == "cuda":
            return torch.device("cpu")
        if isinstance(d, str) and d.startswith("cuda"):
            return "cpu"
        if isinstance(d, int) and not isinstance(d, bool):
            return "cpu"  # a bare CUDA ordinal
        return d

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if "device" in kwargs:
            kwargs["device"] = self._cpu(kwargs["device"])
        if func is torch.Tensor.to and len(args) > 1 and not isinstance(args[1], torch.Tensor) \
                and not isinstance(args[1], torch.dtype):
            args = (args[0], self._cpu(args[1])) + tuple(args[2:])
        return func(*args, **kwargs)


# --------------------------------------------------------------------------- helpers
def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return name in sig.parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())


def default_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """The loss when none is given: ``(inputs, targets)`` -> cross-entropy of the model's
    output over its last dimension; a dict -> ``model(**batch)`` (its ``loss`` or ``[0]``);
    a tensor -> ``model(batch)``. A 0-dim output is taken as the loss, else its sum."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        x, y = batch
        out = model(x)
        if isinstance(out, torch.Tensor) and out.dim() > 0 and isinstance(y, torch.Tensor):
            if y.is_floating_point():
                return torch.nn.functional.mse_loss(out, y)
            return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    elif isinstance(batch, dict):
        out = model(**batch)
    elif isinstance(batch, (tuple, list)):
        out = model(*batch)
    else:
        out = model(batch)
    if isinstance(out, dict):
        out = out.get("loss", next(iter(out.values())))
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out if out.dim() == 0 else out.float().sum()


@contextlib.contextmanager
def _device_free_module_moves() -> Iterator[None]:
    """While the model is built: ``module.to(device)`` / ``.cuda()`` keep the (emulated) device
    and apply only a dtype, parameter by parameter (fake parameters cannot be swapped)."""
    nn = torch.nn.Module
    orig_to, orig_cuda = nn.to, nn.cuda

    def convert(module: torch.nn.Module, dtype: torch.dtype | None) -> torch.nn.Module:
        if dtype is None:
            return module
        for m in module.modules():
            for name, p in list(m._parameters.items()):
                if p is not None and p.is_floating_point() and p.dtype != dtype:
                    m._parameters[name] = torch.nn.Parameter(p.detach().to(dtype),
                                                              requires_grad=p.requires_grad)
            for name, b in list(m._buffers.items()):
                if b is not None and b.is_floating_point() and b.dtype != dtype:
                    m._buffers[name] = b.to(dtype)
        return module

    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        _, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        return convert(self, dtype)

    nn.to = to  # type: ignore[method-assign]
    nn.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.to, nn.cuda = orig_to, orig_cuda  # type: ignore[method-assign]


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    """Builds a 16-bit model directly in its dtype (no float32 copy first)."""
    if dtype is None:
        yield
        return
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


@contextlib.contextmanager
def _cuda_optimizer_defaults(enabled: bool) -> Iterator[None]:
    """On CUDA, Adam/AdamW/SGD default to their foreach implementations (which hold a few
    full-size temporaries); the CPU default is the per-tensor loop. Emulated here."""
    if not enabled:
        yield
        return
    import torch.optim.adam  # noqa: F401  (the modules whose default is patched)
    import torch.optim.optimizer as om
    orig = om._default_to_fused_or_foreach

    def cuda_default(params: Any, differentiable: bool, use_fused: bool = False) -> tuple[bool, bool]:
        if torch.jit.is_scripting() or differentiable:
            return False, False
        return False, not use_fused

    modules = [om] + [m for m in (sys.modules.get(f"torch.optim.{n}") for n in
                                  ("adam", "adamw", "sgd", "_adafactor", "rmsprop", "adagrad",
                                   "nadam", "radam", "adamax", "asgd", "rprop", "adadelta"))
                      if m is not None and hasattr(m, "_default_to_fused_or_foreach")]
    saved = [(m, m._default_to_fused_or_foreach) for m in modules]
    for m in modules:
        m._default_to_fused_or_foreach = cuda_default
    try:
        yield
    finally:
        for m, f in saved:
            m._default_to_fused_or_foreach = f
        om._default_to_fused_or_foreach = orig


@contextlib.contextmanager
def _host_rng_states(native: "_DryNative", enabled: bool) -> Iterator[None]:
    """On a CPU target: the CPU generator's state that ``torch.utils.checkpoint`` saves per
    checkpointed call (``preserve_rng_state``; 5,056 bytes for the default Mersenne-Twister
    generator) and that ``torch.random.fork_rng`` saves around each recomputation. The
    generator makes it directly, not through an op, so neither fake tensors nor the dispatch
    mode see it; a tracked CPU run does. Registered here as a new storage (it is a real tensor
    of that size; its free is seen as any other's). On a CUDA target it is host memory and is
    not counted."""
    if not enabled:
        yield
        return
    orig = torch.get_rng_state

    def get_rng_state() -> torch.Tensor:
        state = orig()
        native.on_storage(state.untyped_storage())
        return state

    torch.get_rng_state = get_rng_state  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.get_rng_state = orig  # type: ignore[assignment]


# --------------------------------------------------------------------------- the dry run
@dataclass
class _Run:
    report: Report
    peak_allocated: int
    peak_reserved: int | None
    allocator_stats: dict[str, Any] | None
    oom: dict[str, Any] | None
    params: dict[str, Any]


def _dry_run(make_model: Callable[..., Any], make_optimizer: Callable[..., Any],
             make_batch: Callable[..., Any], *, device: str, capacity: int | None,
             dtype_policy: str | None, steps: int, loss_fn: Callable[..., Any] | None,
             alloc_conf: str, batch_kwargs: dict[str, Any], model_kwargs: dict[str, Any],
             workspace_bytes: int | None, trace: str | None) -> _Run:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from . import _session
    from ._instrument import Instrumentation

    if _session.active_session() is not None:
        raise RidgescopeError("rs.estimate cannot run inside rs.track (the dry run installs "
                              "the same hooks); call it outside the tracked block")
    if dtype_policy not in DTYPE_POLICIES:
        raise ValueError(f"rs.estimate: unknown dtype_policy {dtype_policy!r} "
                         f"(one of {', '.join(str(p) for p in DTYPE_POLICIES)})")
    cuda = device.startswith("cuda")
    allocator = _new_allocator_model(alloc_conf, None) if cuda else None
    limited = (_new_allocator_model(alloc_conf, capacity)
               if allocator is not None and capacity else None)
    tmp = None
    if trace is None:
        fd, tmp = tempfile.mkstemp(prefix="ridgescope-fit-", suffix=".rstrace")
        os.close(fd)
        trace = tmp
    native = _DryNative(trace, cuda, allocator, limited,
                        cublas_workspace_bytes() if workspace_bytes is None else workspace_bytes)
    low = {"bf16": torch.bfloat16, "fp16": torch.float16, "bf16-autocast": torch.bfloat16,
           "fp16-autocast": torch.float16}.get(dtype_policy or "")
    autocast = dtype_policy is not None and dtype_policy.endswith("-autocast")
    loss_fn = loss_fn or default_loss
    watcher = _StorageWatcher(native)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    instr = None
    try:
        with warnings.catch_warnings(), fake, watcher, _cuda_optimizer_defaults(cuda), \
                (_CudaOnCpu() if cuda else contextlib.nullcontext()), \
                contextlib.ExitStack() as stack:
            # the instrumentation reads fake storages' (null) data pointers as cache keys
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            # Built before the session starts, as in a tracked run: its parameters and
            # buffers are registered below, construction temporaries are not part of a step.
            watcher.enabled = False
            with _device_free_module_moves(), torch.device("cpu"), \
                    _default_dtype(low if not autocast else None):
                model = make_model(**model_kwargs)
                if low is not None and not autocast:
                    model.to(low)
            optimizer = make_optimizer(model)
            instr = Instrumentation(native, model, optimizer, activations=True,
                                    other_models=False)  # the callables' model only
            instr.run_extra.update({"dry_run": True, "target_device": device,
                                    "dtype_policy": dtype_policy or "fp32"})
            if capacity:
                instr.run_extra["device_capacity_bytes"] = capacity
            instr._describe()
            instr.register_existing()
            watcher.enabled = True
            instr.install()
            watcher.host_scalars = True
            stack.enter_context(_host_rng_states(native, not cuda))
            amp = (torch.autocast("cpu", dtype=low) if autocast else contextlib.nullcontext())
            up = _CudaAutocastFp32(low) if (autocast and cuda) else contextlib.nullcontext()
            for _ in range(steps):
                optimizer.zero_grad(set_to_none=True)
                with _device_free_module_moves():
                    batch = make_batch(**batch_kwargs)
                with amp, up:
                    loss = loss_fn(model, batch)
                loss.backward()
                optimizer.step()
                if instr.failed:
                    raise RidgescopeError(f"the dry run failed: {instr.error}")
            instr.remove()
    except BaseException as exc:
        if instr is not None:
            instr.remove()
        native.close(check=False)
        if tmp is not None:
            os.unlink(tmp)
        if isinstance(exc, RidgescopeError) or not isinstance(exc, Exception):
            raise
        raise RidgescopeError(
            f"the dry run failed: {type(exc).__name__}: {exc} (the callables must run under "
            "fake tensors: no .item(), .tolist(), data-dependent shapes or real data; build "
            "tensors on the default device, see docs/fit.md)") from exc
    native.close()
    try:
        report = Report.from_trace(trace)
    finally:
        if tmp is not None:
            os.unlink(tmp)
    stats = None
    reserved: int | None = None
    if not cuda:
        reserved = report.peak_bytes  # on the CPU, allocated is reserved
    elif allocator is not None:
        stats = dict(allocator.stats())
        reserved = int(stats["peak_reserved_bytes"])
        if limited is not None and native.oom is None:
            # it fits: torch's release-and-retry may have kept reserved lower
            stats["with_capacity"] = dict(limited.stats())
            reserved = int(limited.stats()["peak_reserved_bytes"])
    return _Run(report, report.peak_bytes, reserved, stats, native.oom,
                {**batch_kwargs, **model_kwargs})


# --------------------------------------------------------------------------- results
def activation_peak(report: Report) -> int:
    """The most activation bytes live at any phase's peak or end."""
    return max((max(p["peak_by_category"].get("activation", 0),
                    p["end_by_category"].get("activation", 0))
                for p in report.phases()), default=0)


def _by_phase(report: Report) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in report.phases():
        out[p["phase"]] = max(out.get(p["phase"], 0), p["peak_bytes"])
    return out


@dataclass
class Remedy:
    """One way to make the step fit, with its predicted peak. ``method`` says how it was
    obtained: ``"dry run"`` (the step re-run with the change) or ``"arithmetic"`` (the
    measured composition with one category scaled)."""
    name: str
    description: str
    peak_allocated: int
    fits: bool | None
    method: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Estimate:
    """The prediction for one training-step configuration. Bytes are integers."""
    device: str
    capacity: int | None
    peak_allocated: int
    peak_reserved: int | None
    by_category: dict[str, int]
    by_phase: dict[str, int]
    activation_peak: int
    report: Report
    params: dict[str, Any]
    allocator_stats: dict[str, Any] | None = None
    allocator_oom: bool | None = None
    largest_batch: int | None = None
    largest_batch_method: str | None = None
    largest_seq_len: int | None = None
    largest_seq_len_method: str | None = None
    remedies: list[Remedy] = field(default_factory=list)
    _rerun: Callable[..., "Estimate"] | None = field(default=None, repr=False)

    @property
    def predicted_peak(self) -> int:
        """The figure compared with the capacity: reserved when the allocator model predicted
        it, else allocated."""
        return self.peak_reserved if self.peak_reserved is not None else self.peak_allocated

    @property
    def fits(self) -> bool | None:
        """Whether the step fits in the capacity: with the allocator model, whether the
        modelled allocator served every request (release-and-retry included); else whether
        the predicted peak is at most the capacity. None without a capacity."""
        if self.capacity is None:
            return None
        if self.allocator_oom is not None:
            return not self.allocator_oom
        return self.predicted_peak <= self.capacity

    @property
    def margin(self) -> int | None:
        """Capacity minus the predicted peak (negative when it does not fit)."""
        return None if self.capacity is None else self.capacity - self.predicted_peak

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device, "capacity_bytes": self.capacity, "params": self.params,
            "fits": self.fits, "margin_bytes": self.margin,
            "peak_allocated_bytes": self.peak_allocated,
            "peak_reserved_bytes": self.peak_reserved,
            "reserved_modelled": self.peak_reserved is not None,
            "activation_peak_bytes": self.activation_peak,
            "by_category": self.by_category, "by_phase": self.by_phase,
            "peak_step": self.report.peak.get("step"), "peak_phase": self.report.peak.get("phase"),
            "largest_batch": self.largest_batch, "largest_batch_method": self.largest_batch_method,
            "largest_seq_len": self.largest_seq_len,
            "largest_seq_len_method": self.largest_seq_len_method,
            "remedies": [r.to_dict() for r in self.remedies],
        }

    def summary(self) -> str:
        lines = []
        params = ", ".join(f"{k}={v}" for k, v in self.params.items())
        lines.append(f"ridgescope fit: predicted training step on {self.device}"
                     + (f" ({params})" if params else ""))
        lines.append(f"  peak allocated  {format_bytes(self.peak_allocated):>11}  "
                     f"(step {self.report.peak.get('step')}, {self.report.peak.get('phase')})")
        if self.peak_reserved is not None:
            how = ("on the CPU, reserved is allocated" if self.device == "cpu"
                   else "caching-allocator model")
            lines.append(f"  peak reserved   {format_bytes(self.peak_reserved):>11}  ({how})")
        else:
            lines.append("  peak reserved   not predicted (allocator model not available)")
        if self.capacity is not None:
            verdict = "FITS" if self.fits else "DOES NOT FIT"
            m = self.margin or 0
            lines.append(f"  capacity        {format_bytes(self.capacity):>11}  -> {verdict}, "
                         f"margin {'-' if m < 0 else ''}{format_bytes(abs(m))}")
        lines.append("  at the peak, by category:")
        for cat, b in sorted(self.by_category.items(), key=lambda kv: -kv[1]):
            if b:
                lines.append(f"    {cat:<16} {format_bytes(b):>11}")
        lines.append("  peak by phase:")
        for ph, b in self.by_phase.items():
            lines.append(f"    {ph:<16} {format_bytes(b):>11}")
        if self.largest_batch is not None:
            lines.append(f"  largest batch that fits: {self.largest_batch} "
                         f"({self.largest_batch_method})")
        if self.largest_seq_len is not None:
            lines.append(f"  longest sequence that fits: {self.largest_seq_len} "
                         f"({self.largest_seq_len_method})")
        if self.remedies:
            lines.append("  remedies (predicted peak allocated):")
            for r in self.remedies:
                ok = "" if r.fits is None else ("  fits" if r.fits else "  still too big")
                lines.append(f"    {r.name:<28} {format_bytes(r.peak_allocated):>11}{ok}  "
                             f"[{r.method}] {r.description}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    # ---------------------------------------------------------------- sweep
    def sweep(self, batch_size: Sequence[int] | None = None,
              seq_len: Sequence[int] | None = None, steps: int | None = None) -> "Sweep":
        """Runs the dry run over the grid (``make_batch`` must accept ``batch_size`` and/or
        ``seq_len``) and fits the activation peak's scaling: linear in batch size and
        ``a + b*s + c*s^2`` in sequence length (least squares). ``steps`` defaults to the
        estimate's: at least two are needed for the peaks and ``fits`` (the second step's
        forward and backward hold the optimizer state the first one created); one is enough
        for the activation scaling alone."""
        if self._rerun is None:
            raise RidgescopeError("this estimate cannot be re-run")
        bs = list(batch_size) if batch_size else [None]
        ss = list(seq_len) if seq_len else [None]
        rows = []
        for b, s in itertools.product(bs, ss):
            kw = {}
            if b is not None:
                kw["batch_size"] = b
            if s is not None:
                kw["seq_len"] = s
            est = self._rerun(batch_kwargs=kw, remedies=False,
                              **({"steps": steps} if steps is not None else {}))
            rows.append({"batch_size": est.params.get("batch_size", b),
                         "seq_len": est.params.get("seq_len", s),
                         "peak_allocated": est.peak_allocated,
                         "peak_reserved": est.peak_reserved,
                         "activation_peak": est.activation_peak, "fits": est.fits})
        return Sweep(rows)


def _lstsq(xs: list[float], ys: list[float], degree: int) -> list[float]:
    import numpy as np
    a = np.vander(np.asarray(xs, dtype=float), degree + 1, increasing=True)
    coef, *_ = np.linalg.lstsq(a, np.asarray(ys, dtype=float), rcond=None)
    return [float(c) for c in coef]


@dataclass
class Sweep:
    """A grid of dry runs: ``rows`` and the fitted scaling of the activation peak."""
    rows: list[dict[str, Any]]

    def _groups(self, key: str, other: str) -> dict[Any, list[tuple[int, int]]]:
        g: dict[Any, list[tuple[int, int]]] = {}
        for r in self.rows:
            if r[key] is not None:
                g.setdefault(r[other], []).append((r[key], r["activation_peak"]))
        return g

    @property
    def batch_scaling(self) -> dict[str, Any] | None:
        """Activation peak = a + b * batch_size, fitted over each sequence length; the fit of
        the longest one, with its largest relative residual."""
        for s, pts in sorted(self._groups("batch_size", "seq_len").items(),
                             key=lambda kv: -(kv[0] or 0)):
            if len(pts) < 2:
                continue
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            a, b = _lstsq(xs, ys, 1)
            resid = max(abs(a + b * x - y) / max(y, 1) for x, y in pts)
            return {"seq_len": s, "a": a, "b": b, "model": "linear", "max_rel_residual": resid}
        return None

    @property
    def seq_scaling(self) -> dict[str, Any] | None:
        """Activation peak = a + b*s + c*s^2 (least squares) for the largest batch size;
        ``model`` is "quadratic" when the s^2 term is over 5 % of the peak at the longest
        sequence, else "linear"."""
        for b, pts in sorted(self._groups("seq_len", "batch_size").items(),
                             key=lambda kv: -(kv[0] or 0)):
            if len(pts) < 3:
                continue
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            a, lin, quad = _lstsq(xs, ys, 2)
            smax = max(xs)
            share = quad * smax * smax / max(max(ys), 1)
            return {"batch_size": b, "a": a, "b": lin, "c": quad,
                    "quadratic_share": share,
                    "model": "quadratic" if share > 0.05 else "linear"}
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "batch_scaling": self.batch_scaling,
                "seq_scaling": self.seq_scaling}

    def table(self) -> str:
        lines = [f"{'batch':>6} {'seq':>6} {'activation':>12} {'allocated':>12} {'reserved':>12}  fits"]
        for r in self.rows:
            res = format_bytes(r["peak_reserved"]) if r["peak_reserved"] is not None else "-"
            fits = "-" if r["fits"] is None else ("yes" if r["fits"] else "no")
            lines.append(f"{str(r['batch_size']):>6} {str(r['seq_len']):>6} "
                         f"{format_bytes(r['activation_peak']):>12} "
                         f"{format_bytes(r['peak_allocated']):>12} {res:>12}  {fits}")
        bsc, ssc = self.batch_scaling, self.seq_scaling
        if bsc:
            lines.append(f"activation ~ {bsc['a']:.4g} + {bsc['b']:.4g} * batch  (linear, "
                         f"max residual {bsc['max_rel_residual']:.2%})")
        if ssc:
            lines.append(f"activation ~ {ssc['a']:.4g} + {ssc['b']:.4g} * s + {ssc['c']:.4g} "
                         f"* s^2  ({ssc['model']}; s^2 term {ssc['quadratic_share']:.1%} of "
                         "the peak at the longest s)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


# --------------------------------------------------------------------------- public entry
def estimate(make_model: Callable[..., torch.nn.Module],
             make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer],
             make_batch: Callable[..., Any], device: str = "cuda",
             capacity: int | str | None = "80GiB", dtype_policy: str | None = None,
             steps: int = 2, loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None,
             alloc_conf: str = "", *, batch_size: int | None = None, seq_len: int | None = None,
             remedies: bool = True, workspace_bytes: int | None = None,
             trace: str | os.PathLike[str] | None = None) -> Estimate:
    """Predicts the peak memory of a training step without running it on a device::

        est = rs.estimate(make_model, make_optimizer, make_batch, device="cuda",
                          capacity="80GiB", dtype_policy="bf16-autocast")
        est.fits, est.peak_allocated, est.peak_reserved, est.by_category, est.margin

    ``make_model()`` builds the model on the default device (no ``.to("cuda")`` needed; it is
    ignored), ``make_optimizer(model)`` its optimizer, ``make_batch()`` one batch, called with
    ``batch_size=``/``seq_len=`` when given and accepted. ``loss_fn(model, batch)`` defaults to
    cross-entropy of ``model(x)`` against ``y`` for an ``(x, y)`` batch. ``steps`` full training
    steps run (the first creates the optimizer state). ``dtype_policy``: None/"fp32", "bf16" or
    "fp16" (the model cast after construction), "bf16-autocast"/"fp16-autocast" (forward and
    loss under autocast). ``alloc_conf`` is a PYTORCH_CUDA_ALLOC_CONF string for the allocator
    model. ``trace`` keeps the dry run's trace. Nothing real is allocated; see docs/fit.md.
    """
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise ValueError(f"rs.estimate: device must be 'cuda' or 'cpu', got {device!r}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"rs.estimate: steps must be a positive int, got {steps!r}")
    cap = None
    if capacity is not None:
        try:
            cap = parse_bytes(capacity)
        except ValueError as exc:
            raise ValueError(f"rs.estimate: capacity: {exc}") from None
    base_batch: dict[str, Any] = {}
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
        if value is not None:
            if not _accepts(make_batch, name):
                raise ValueError(f"rs.estimate: {name}= given but make_batch does not accept it")
            base_batch[name] = value

    def run(batch_kwargs: dict[str, Any] | None = None, model_kwargs: dict[str, Any] | None = None,
            steps: int = steps, remedies: bool = remedies, trace_path: Any = None) -> Estimate:
        bk = {**base_batch, **(batch_kwargs or {})}
        mk = dict(model_kwargs or {})
        r = _dry_run(make_model, make_optimizer, make_batch, device=device, capacity=cap,
                     dtype_policy=dtype_policy, steps=steps, loss_fn=loss_fn,
                     alloc_conf=alloc_conf, batch_kwargs=bk, model_kwargs=mk,
                     workspace_bytes=workspace_bytes,
                     trace=str(trace_path) if trace_path is not None else None)
        est = Estimate(device=device, capacity=cap, peak_allocated=r.peak_allocated,
                       peak_reserved=r.peak_reserved,
                       by_category={k: v for k, v in r.report.peak["by_category"].items()},
                       by_phase=_by_phase(r.report), activation_peak=activation_peak(r.report),
                       report=r.report, params=r.params, allocator_stats=r.allocator_stats,
                       allocator_oom=(r.oom is not None) if (r.allocator_stats is not None
                                                             and cap) else None)
        est._rerun = lambda **kw: run(**{"batch_kwargs": bk, "model_kwargs": mk, **kw})
        if remedies and est.fits is False:
            _find_remedies(est, bk, mk, run, make_model, make_batch)
        return est

    return run(trace_path=trace)


def _largest(run: Callable[..., Estimate], bk: dict[str, Any], name: str, hi: int,
             unit: int) -> tuple[int, Estimate | None, int]:
    """The largest value of ``name`` (a multiple of ``unit``, below ``hi``, which does not fit)
    whose dry run fits, by bisection; (0, None, runs) when even ``unit`` does not fit."""
    runs = 0
    lo_val, lo_est = 0, None
    lo, top = 1, (hi - 1) // unit  # candidates unit * [1 .. top]
    while lo <= top:
        mid = (lo + top) // 2
        trial = run(batch_kwargs={**bk, name: mid * unit}, remedies=False)
        runs += 1
        if trial.fits:
            lo_val, lo_est, lo = mid * unit, trial, mid + 1
        else:
            top = mid - 1
    return lo_val, lo_est, runs


def _find_remedies(est: Estimate, bk: dict[str, Any], mk: dict[str, Any],
                   run: Callable[..., Estimate], make_model: Callable[..., Any],
                   make_batch: Callable[..., Any]) -> None:
    cap = est.capacity
    assert cap is not None
    # 1. The largest micro-batch that fits (bisection over dry runs); the global batch is kept
    # with gradient accumulation.
    b0 = bk.get("batch_size")
    if b0 is not None:
        if b0 == 1:
            est.largest_batch, est.largest_batch_method = 0, "batch 1 (this run) does not fit"
        else:
            b, trial, n = _largest(run, bk, "batch_size", b0, 1)
            est.largest_batch = b
            est.largest_batch_method = f"bisection over {n} dry runs"
            if trial is not None:
                est.remedies.append(Remedy(
                    f"micro-batch {b}", f"micro-batch {b} with gradient accumulation over "
                    f"{math.ceil(b0 / b)} micro-steps keeps the global batch",
                    trial.peak_allocated, trial.fits, "dry run"))
    # 2. The longest sequence that fits (multiples of 64), when the batch is built from one.
    s0 = bk.get("seq_len")
    if s0 is not None and s0 > 64:
        s, trial, n = _largest(run, bk, "seq_len", s0, 64)
        est.largest_seq_len = s
        est.largest_seq_len_method = f"bisection over {n} dry runs (multiples of 64)"
        if trial is not None:
            est.remedies.append(Remedy(f"sequence length {s}", f"seq_len={s} at the same batch",
                                       trial.peak_allocated, trial.fits, "dry run"))
    # 3. Activation checkpointing, when make_model takes a flag for it.
    flag = next((n for n in ("checkpointing", "activation_checkpointing",
                             "gradient_checkpointing") if _accepts(make_model, n)), None)
    if flag and not mk.get(flag):
        ck = run(model_kwargs={**mk, flag: True}, remedies=False)
        est.remedies.append(Remedy("activation checkpointing", f"make_model({flag}=True)",
                                   ck.peak_allocated, ck.fits, "dry run"))
    # 4. Arithmetic on the composition at each phase's peak (the new peak is the largest of
    # them, so a peak that moves to another phase is found). Only the named category changes.
    phases = est.report.phases()
    ratio = (est.predicted_peak / est.peak_allocated) if est.peak_allocated else 1.0

    def scaled(category: str, factor: float, only: str | None = None) -> int:
        return max((int(p["peak_bytes"] - (1 - factor) * p["peak_by_category"].get(category, 0)
                        if only is None or p["phase"] == only else p["peak_bytes"])
                    for p in phases), default=est.peak_allocated)

    def add(name: str, desc: str, peak: int) -> None:
        est.remedies.append(Remedy(name, desc, peak, int(peak * ratio) <= cap, "arithmetic"))

    step_temp = max((p["peak_by_category"].get("temporary", 0) for p in phases
                     if p["phase"] == "optimizer_step"), default=0)
    if step_temp:
        add("fused optimizer step", "fused=True (no full-size temporaries in the optimizer "
            "step; the foreach default keeps some)", scaled("temporary", 0.0, "optimizer_step"))
    state = max((p["peak_by_category"].get("optimizer_state", 0) for p in phases), default=0)
    if state:
        elem = _state_element_bytes(est)
        f8 = min(1.0, 1.02 / elem)  # 1 byte per element + ~2 % block scales
        add("8-bit optimizer state", "moments stored in 8 bits (bitsandbytes-style)",
            scaled("optimizer_state", f8))
        for n in (2, 4, 8):
            add(f"sharded optimizer state x{n}", f"optimizer state sharded over {n} ranks "
                "(ZeRO-1; gradients and parameters unchanged)", scaled("optimizer_state", 1 / n))


def _state_element_bytes(est: Estimate) -> int:
    """Bytes per optimizer-state element: 2 for a 16-bit model's moments, else 4."""
    model = est.report.to_dict().get("model", {})
    n, b = model.get("parameters") or 0, model.get("parameter_bytes") or 0
    return max(1, round(b / n)) if n else 4
