"""FSDP1 (``FullyShardedDataParallel``): flat parameters (docs/distributed.md).

Structures (torch 2.11 and 2.14, ``torch/distributed/fsdp/_flat_param.py``): each wrapped
module has a ``FlatParamHandle`` (``module._handle``) whose ``flat_param`` (a ``FlatParameter``,
the module's only parameter with ``use_orig_params=False``) holds this rank's padded shard of
all the module's original parameters in ``_local_shard`` (their names in ``_fqns``, the full
flat size in ``_unpadded_unsharded_size``). ``FlatParamHandle.unshard()`` all-gathers into
``_full_param_padded`` (freed again by ``reshard``).

What is tagged: each local shard as ``parameter`` ("flat parameter of layers.0: weight, bias
(shard 2048 of 4096 elements)"); the unsharded flat parameter as ``comm_buffer`` ("all-gather
of layers.0") while it lives. Gradients (sharded, on the flat parameter) and optimizer state
(over flat parameters) are found by the ordinary scans. ``FlatParamHandle.unshard`` is wrapped
at class level while a session runs, and restored after."""
from __future__ import annotations

import functools
import math
from typing import Any

import torch


def _classes() -> tuple[Any, Any] | None:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp._flat_param import FlatParamHandle
    except Exception:
        return None
    return FullyShardedDataParallel, FlatParamHandle


def is_fsdp1(module: Any) -> bool:
    c = _classes()
    return c is not None and isinstance(module, c[0])


def _short(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


class Fsdp1Tracker:
    kind = "fsdp1"

    def __init__(self, tracking: Any, model: torch.nn.Module) -> None:
        self._tracking = tracking
        self._handles: list[tuple[Any, str]] = []
        self._names: dict[int, str] = {}
        self._restore: list[Any] = []
        self._described: list[dict[str, Any]] = []
        self._tagged: dict[int, int] = {}
        self.active = False
        self._steps = 0
        names = {id(m): n for n, m in model.named_modules()}
        for m in model.modules():
            handle = getattr(m, "_handle", None) if is_fsdp1(m) else None
            if handle is not None and getattr(handle, "flat_param", None) is not None:
                name = names.get(id(m)) or type(m).__name__
                name = name.replace("_fsdp_wrapped_module.", "").removesuffix("._fsdp_wrapped_module")
                self._handles.append((handle, name or type(m).__name__))
                self._names[id(handle)] = name or type(m).__name__

    def start(self) -> None:
        classes = _classes()
        if classes is None:
            return
        handle_cls = classes[1]
        original = getattr(handle_cls, "unshard", None)
        if original is None:
            return
        tracker = self
        after = self._tracking.instr._guard(self._after_unshard)

        @functools.wraps(original)
        def unshard(handle: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(handle, *args, **kwargs)
            if tracker.active:
                after(handle)
            return result
        handle_cls.unshard = unshard
        self._restore.append(lambda: setattr(handle_cls, "unshard", original))
        self.active = True

    def remove(self) -> None:
        self.active = False
        for restore in reversed(self._restore):
            restore()
        self._restore.clear()

    def scan(self) -> None:
        instr = self._tracking.instr
        described = []
        changed = False
        for handle, name in self._handles:
            fp = handle.flat_param
            self._tracking.owned.add(id(fp))
            shard = getattr(fp, "_local_shard", None)
            if not isinstance(shard, torch.Tensor):
                shard = fp
            fqns = list(getattr(fp, "_fqns", []))
            full = getattr(fp, "_unpadded_unsharded_size", None)
            full_numel = math.prod(full) if full is not None else shard.numel()
            storage = shard.untyped_storage()
            described.append({"name": name, "parameters": fqns[:64], "parameter_count": len(fqns),
                              "numel": int(full_numel), "local_numel": int(shard.numel()),
                              "fraction": shard.numel() / full_numel if full_numel else 0.0,
                              "local_bytes": int(storage.nbytes())})
            ptr = storage.data_ptr()
            if ptr and self._tagged.get(id(fp)) != ptr:
                self._tagged[id(fp)] = ptr
                changed = True
                instr._native.register(shard, "parameter", instr.label(
                    f"flat parameter of {name}: {_short(fqns)} (shard {shard.numel()} of "
                    f"{full_numel} elements)"))
        if changed or described != self._described:
            self._described = described
            self._tracking.publish()

    def _after_unshard(self, handle: Any) -> None:
        full = getattr(handle.flat_param, "_full_param_padded", None)
        if isinstance(full, torch.Tensor) and full.untyped_storage().nbytes() > 0:
            instr = self._tracking.instr
            name = self._names.get(id(handle), "a flat parameter")
            instr._native.tag(full, "comm_buffer", instr.label(f"all-gather of {name}"), False)

    def after_step(self, optimizer: Any) -> None:
        if self._steps < 2:  # the shards are made at wrapping and stay; two looks suffice
            self._steps += 1
            self.scan()

    def describe(self) -> dict[str, Any]:
        return {"strategy": "fsdp1", "flat_parameters": self._described[:256],
                "flat_parameter_count": len(self._described),
                "local_shard_bytes": sum(d["local_bytes"] for d in self._described)}
