"""The dry native: the subset of ``_C.Session`` that ``Instrumentation`` calls, for fake tensors
(``_DryNative``), and the dispatch mode that sees every storage an op returns
(``_StorageWatcher``). Both write into an ordinary trace through ``_C.TraceWriter``."""
from __future__ import annotations

import json
import threading
import weakref
from typing import Any, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .. import _C
from .._errors import RidgescopeError
from ._cuda_costs import (CUDA_BLOCK, _MATMUL_OPS, _round_block, _uses_cublaslt,
                          cublaslt_workspace_bytes)


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
