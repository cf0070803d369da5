"""DistributedDataParallel: the reducer's gradient buckets (docs/distributed.md).

DDP's reducer keeps one flat tensor per bucket; the allreduce runs on it. With
``gradient_as_bucket_view=False`` (the default) gradients are copied into it and out again, so a
bucket is a second copy of its gradients: tagged ``comm_buffer``, labelled by bucket and its
parameters. With ``gradient_as_bucket_view=True`` each ``.grad`` is a view into its bucket: the
bucket *is* the gradients' storage, tagged ``gradient`` and counted once, and the report's
bucket section says so.

The buckets are read from the reducer itself (``_C.ddp_buckets``, i.e.
``c10d::Reducer::get_grad_buckets(false)``; the same C++ API in torch 2.11 through 2.14): when
the model is found, and after the forward and the backward of the first steps (the reducer
rebuilds its buckets once, in the forward of the second iteration).

A replaced bucket is not always freed when the reducer drops it: the process group's work for
its last allreduce holds the tensor until the backend's thread releases that work (gloo's worker
thread, NCCL's watchdog), which may be a step later on a loaded machine. A scan that finds a
bucket it tagged before still alive (a weak reference to its storage: nothing is kept alive)
but no longer the reducer's tags it ``comm_buffer``, "replaced DDP bucket N": in view mode it
holds no gradient any more, and counting it as one would count the gradients twice."""
from __future__ import annotations

from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .. import _C


def is_ddp(module: Any) -> bool:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except Exception:
        return False
    return isinstance(module, DistributedDataParallel)


def _names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


class DdpTracker:
    """The buckets of one DDP module."""

    kind = "ddp"

    def __init__(self, tracking: Any, ddp: Any) -> None:
        self._tracking = tracking
        self._ddp = ddp
        self.view = bool(getattr(ddp, "gradient_as_bucket_view", False))
        # (index, storage pointer, bytes, parameters) -> (label id, parameter names)
        self._labels: dict[tuple[int, int, int, int], tuple[int, list[str]]] = {}
        self._buckets: list[dict[str, Any]] = []
        # storage (StorageImpl address, from a weak reference) -> (weak reference, bucket index)
        # of every bucket the scans tagged and saw the reducer hold last time
        self._held: dict[int, tuple[StorageWeakRef, int]] = {}
        self._replaced_label: dict[int, int] = {}
        # Scans after forward and backward: the reducer builds its buckets in its constructor
        # and rebuilds them once, in the forward of the second iteration; the first few steps'
        # scans see both (a later rebuild, after _update_process_group, is seen at the next
        # explicit scan). Bounded so a long run pays nothing per step.
        self._scans_left = 8
        self.error: str | None = None

    @property
    def module(self) -> Any:
        return self._ddp

    def _read(self) -> list[tuple[int, torch.Tensor, list[torch.Tensor]]]:
        reducer = getattr(self._ddp, "reducer", None)
        if reducer is None:
            return []
        try:
            return list(_C.ddp_buckets(reducer))
        except (TypeError, RuntimeError) as exc:  # torch's pybind11 types not shared with ours
            if self.error is None:
                self.error = f"the DDP reducer's buckets could not be read: {exc}"
                self._tracking.publish()
            return []

    def _label(self, index: int, names: list[str]) -> str:
        if self.view:
            return f"gradients (views of DDP bucket {index}: {_names(names)})"
        return f"DDP bucket {index}: {_names(names)}"

    def scan(self) -> None:
        """Tags every bucket. Every scan tags again (a few tags a step): a rebuilt bucket may
        reuse a freed one's address, so an unchanged address does not mean an unchanged block."""
        instr = self._tracking.instr
        buckets = self._read()
        if not buckets:
            return
        category = "gradient" if self.view else "comm_buffer"
        described = []
        held: dict[int, tuple[StorageWeakRef, int]] = {}
        for index, buffer, params in buckets:
            storage = buffer.untyped_storage()
            ref = StorageWeakRef(storage)
            held[ref.cdata] = (ref, int(index))
            key = (int(index), storage.data_ptr(), int(storage.nbytes()), len(params))
            cached = self._labels.get(key)
            if cached is None:
                names = [instr._param_name(p) for p in params]
                cached = self._labels[key] = (instr.label(self._label(index, names)), names)
                # register: adopts a bucket made before tracking started, then tags it
                instr._native.register(buffer, category, cached[0])
            else:
                instr._native.tag(buffer, category, cached[0], False)
            described.append({"index": key[0], "bytes": key[2],
                              "dtype": str(buffer.dtype).removeprefix("torch."),
                              "parameters": cached[1][:64], "parameter_count": key[3]})
        self._tag_replaced(held)
        if described != self._buckets:
            self._buckets = described
            self._tracking.publish()

    def _tag_replaced(self, held: dict[int, tuple[StorageWeakRef, int]]) -> None:
        """Tags the buckets the reducer held at the last scan, holds no more, and that are still
        alive (held by a communication work): comm_buffer, "replaced DDP bucket N"."""
        instr = self._tracking.instr
        for cdata, (ref, index) in self._held.items():
            if cdata in held or ref.expired():
                continue
            storage = torch.UntypedStorage._new_with_weak_ptr(cdata)
            if storage is None:
                continue
            label = self._replaced_label.get(index)
            if label is None:
                label = self._replaced_label[index] = instr.label(
                    f"replaced DDP bucket {index} (held by its last allreduce's work)")
            view = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
            instr._native.tag(view, "comm_buffer", label, False)
            del view, storage
        self._held = held

    def _budgeted_scan(self) -> None:
        if self._scans_left > 0:
            self._scans_left -= 1
            self.scan()

    def after_forward(self, module: Any) -> None:
        self._budgeted_scan()  # the reducer rebuilds its buckets in the second forward

    def after_backward(self) -> None:
        # View mode: the gradient scan just labelled each bucket by one of its gradients (the
        # first time it saw them); the scan labels it by the bucket again (same category:
        # nothing is counted twice).
        self._budgeted_scan()

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "strategy": "ddp",
            "gradient_as_bucket_view": self.view,
            "bucket_cap_bytes": getattr(self._ddp, "bucket_bytes_cap", None),
            "find_unused_parameters": bool(getattr(self._ddp, "find_unused_parameters", False)),
            "static_graph": bool(getattr(self._ddp, "static_graph", False)),
            "buckets": self._buckets,
            "bucket_bytes": sum(b["bytes"] for b in self._buckets),
            "buckets_category": "gradient" if self.view else "comm_buffer",
            "note": ("gradients are views into the buckets (gradient_as_bucket_view=True): the "
                     "buckets are counted once, as gradient" if self.view else
                     "each bucket holds a copy of its gradients for the allreduce: counted as "
                     "comm_buffer, next to the gradients themselves"),
        }
        if self.error:
            d["error"] = self.error
        return d
