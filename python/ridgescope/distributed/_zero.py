"""ZeroRedundancyOptimizer: optimizer state sharded over ranks (docs/distributed.md).

Structures (torch 2.11 and 2.14, ``torch/distributed/optim/zero_redundancy_optimizer.py``): the
wrapper keeps the full parameter list in ``param_groups`` and a local optimizer ``optim`` over
this rank's partition; only that local optimizer has state. Its step is an ordinary optimizer
step (the global step hooks fire for it too), so its state is tagged by the ordinary scan; the
tracker describes the partition, and with ``parameters_as_bucket_view=True`` tags the flat
per-rank buckets the parameters become views of as ``parameter``."""
from __future__ import annotations

from typing import Any

import torch


def is_zero(optimizer: Any) -> bool:
    try:
        from torch.distributed.optim import ZeroRedundancyOptimizer
    except Exception:
        return False
    return isinstance(optimizer, ZeroRedundancyOptimizer)


class ZeroTracker:
    kind = "zero"

    def __init__(self, tracking: Any, optimizer: Any) -> None:
        self._tracking = tracking
        self._zero = optimizer
        self._tagged: dict[int, int] = {}
        self._described: dict[str, Any] = {}

    def _local_params(self) -> list[torch.Tensor]:
        inner = getattr(self._zero, "optim", None)
        if inner is None:
            return []
        return [p for g in inner.param_groups for p in g["params"]]

    def scan(self) -> None:
        instr = self._tracking.instr
        local = self._local_params()
        total = [p for g in self._zero.param_groups for p in g["params"]]
        buckets = getattr(self._zero, "_buckets", None) if getattr(
            self._zero, "parameters_as_bucket_view", False) else None
        if buckets:
            views = {b.untyped_storage().data_ptr() for device_buckets in buckets
                     for b in device_buckets if isinstance(b, torch.Tensor) and b.numel() > 0}
            for p in total:  # views of a bucket: the bucket's label, not one parameter's
                if p.untyped_storage().data_ptr() in views:
                    self._tracking.owned.add(id(p))
            for device_buckets in buckets:
                for rank, bucket in enumerate(device_buckets):
                    if isinstance(bucket, torch.Tensor) and bucket.numel() > 0:
                        ptr = bucket.untyped_storage().data_ptr()
                        if self._tagged.get(id(bucket)) != ptr:
                            self._tagged[id(bucket)] = ptr
                            instr._native.register(bucket, "parameter", instr.label(
                                f"parameters of rank {rank}'s partition (ZeRO bucket)"))
        described = {
            "strategy": "zero",
            "optimizer": type(getattr(self._zero, "optim", None)).__name__,
            "parameters": len(total),
            "local_parameters": len(local),
            "local_parameter_bytes": sum(p.numel() * p.element_size() for p in local),
            "parameters_as_bucket_view": bool(getattr(self._zero, "parameters_as_bucket_view", False)),
        }
        if described != self._described:
            self._described = described
            self._tracking.publish()

    def after_step(self, optimizer: Any) -> None:
        if optimizer is self._zero:
            self.scan()

    def describe(self) -> dict[str, Any]:
        return dict(self._described)
