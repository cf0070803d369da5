"""What a rank holds of a tensor or parameter (a DTensor's local shard, a ZeRO-3 partition),
and a weak memo of the storages already tagged: shared by the strategies' trackers, the
distributed tracking and the model description, so it depends on none of them."""
from __future__ import annotations

from typing import Any

import torch


def local_tensor(t: Any) -> Any:
    """The tensor whose storage holds ``t``'s data on this rank: a DTensor's local shard, or
    ``t`` itself."""
    if type(t) is torch.Tensor:
        return t
    inner = getattr(t, "_local_tensor", None)
    return inner if isinstance(inner, torch.Tensor) else t


class StorageMemo:
    """The storage each key was last tagged for, held weakly: a block freed and made anew at
    the same address (a buffer DeepSpeed makes every step) has a new storage, so it is tagged
    again; an unchanged one is not. ``release`` drops the weak references."""

    def __init__(self) -> None:
        self._refs: dict[Any, int] = {}

    def changed(self, key: Any, storage: Any) -> bool:
        old = self._refs.get(key)
        if old is not None and old == storage._cdata:  # alive: a weak ref keeps its address
            return False
        if old is not None:
            torch.UntypedStorage._free_weak_ref(old)
        self._refs[key] = storage._weak_ref()
        return True

    def release(self) -> None:
        for ref in self._refs.values():
            torch.UntypedStorage._free_weak_ref(ref)
        self._refs.clear()


def local_numel(p: Any) -> int:
    """Elements of a parameter in the model: a DTensor's local shard (FSDP2), a ZeRO-3
    parameter's full size (``ds_numel``: its data is an empty placeholder)."""
    n = getattr(p, "ds_numel", None)
    return int(n) if n is not None else local_tensor(p).numel()


def local_bytes(p: Any) -> int:
    """Bytes this rank holds for a parameter: a DTensor's local shard, a ZeRO-3 parameter's
    partition (``ds_tensor``; and its whole data when DeepSpeed keeps it on every rank)."""
    ds = getattr(p, "ds_tensor", None)
    if isinstance(ds, torch.Tensor):
        whole = int(p.ds_numel) * ds.element_size() if getattr(p, "ds_persist", False) else 0
        return ds.numel() * ds.element_size() + whole
    t = local_tensor(p)
    return t.numel() * t.element_size()
