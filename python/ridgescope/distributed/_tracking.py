"""The distributed side of one tracking session: which strategies the tracked model uses, and
their trackers (DDP buckets, FSDP2 shards and gathers, FSDP1 flat parameters, ZeRO shards).

``Instrumentation`` (python/ridgescope/_instrument.py) owns one ``DistributedTracking`` and calls
it at a few extension points: when the model or an outermost module is found, after the root
module's forward, after backward, after an optimizer step, and when the run is described. It
writes the `distributed` metadata (rank, world size, local rank, host, backend and each
strategy's description), which the report's `distributed` section and the merged multi-rank
report read (docs/distributed.md). Every call runs under the instrumentation's guard: an
internal error stops recording, never the training loop. Outside a distributed job (no strategy
found) each call is a few attribute checks."""
from __future__ import annotations

import json
from typing import Any

import torch

from ._process import process_info, torch_distributed
from ._tensors import local_tensor


class DistributedTracking:
    def __init__(self, instr: Any) -> None:
        self.instr = instr
        self.trackers: list[Any] = []
        self._seen: set[int] = set()          # id(module) already examined
        self._optimizers: set[int] = set()
        self.owned: set[int] = set()          # id(tensor) of parameters a tracker labels
        self.unwatched: set[int] = set()      # id(parameter) whose .grad a strategy keeps itself
        self.names: dict[int, str] = {}       # id(tensor) -> a tracker's name for it
        self.failures: list[dict[str, str]] = []  # strategies found but not understood
        self._published: str | None = None
        self._pg_initialized = False

    # ----------------------------------------------------------------------- discovery
    def on_model(self, model: torch.nn.Module | None) -> None:
        """Finds the strategies in a module tree (each module examined once)."""
        if model is None or id(model) in self._seen:
            return
        self._seen.add(id(model))
        from . import _ddp, _deepspeed, _fsdp1, _fsdp2
        found = False
        for m in model.modules():
            if _deepspeed.is_deepspeed(m):
                found = self._make(_deepspeed.DeepSpeedTracker, m)
            elif _ddp.is_ddp(m):
                self._add(_ddp.DdpTracker(self, m))
                found = True
            elif _fsdp1.is_fsdp1(m):
                if not any(t.kind == "fsdp1" for t in self.trackers):
                    self._add(_fsdp1.Fsdp1Tracker(self, model))
                found = True
            elif _fsdp2.is_fsdp2(m):
                if not any(t.kind == "fsdp2" for t in self.trackers):
                    self._add(_fsdp2.Fsdp2Tracker(self, model))
                found = True
        if found:
            self.publish()

    def on_outer_module(self, module: torch.nn.Module) -> None:
        """An outermost module call (a DDP wrapper around the tracked model is one)."""
        if id(module) not in self._seen:
            self.on_model(module)

    def on_optimizer(self, optimizer: Any) -> None:
        if optimizer is None or id(optimizer) in self._optimizers:
            return
        self._optimizers.add(id(optimizer))
        from . import _zero
        if _zero.is_zero(optimizer):
            self._add(_zero.ZeroTracker(self, optimizer))
            self.publish()

    def _add(self, tracker: Any) -> None:
        self.trackers.append(tracker)
        start = getattr(tracker, "start", None)
        if start is not None:
            start()
        tracker.scan()

    def _make(self, make: Any, *args: Any) -> bool:
        """Adds the tracker ``make(self, *args)``. A strategy whose structures are not what the
        tracker expects (another release) is described with the error; tracking goes on."""
        tracker = None
        try:
            tracker = make(self, *args)
            self._add(tracker)
        except Exception as exc:
            if tracker is not None:
                if tracker in self.trackers:
                    self.trackers.remove(tracker)
                tracker.remove()
            self.failures.append({"strategy": getattr(make, "kind", make.__name__),
                                  "error": f"{type(exc).__name__}: {exc}"})
        return True

    # ----------------------------------------------------------------------- tensors
    def local(self, t: Any) -> Any:
        """The tensor to tag for ``t``, or None when a tracker labels it itself."""
        if id(t) in self.owned:
            return None
        return local_tensor(t)

    # ----------------------------------------------------------------------- events
    def after_forward(self, module: torch.nn.Module) -> None:
        for t in self.trackers:
            fn = getattr(t, "after_forward", None)
            if fn is not None:
                fn(module)

    def after_backward(self) -> None:
        for t in self.trackers:
            fn = getattr(t, "after_backward", None)
            if fn is not None:
                fn()

    def after_step(self, optimizer: Any) -> None:
        for t in self.trackers:
            fn = getattr(t, "after_step", None)
            if fn is not None:
                fn(optimizer)
        if not self._pg_initialized:  # the job's process group may start after tracking did
            dist = torch_distributed()
            if dist is not None and dist.is_initialized():
                self.publish()

    def remove(self) -> None:
        for t in self.trackers:
            fn = getattr(t, "remove", None)
            if fn is not None:
                try:
                    fn()
                except Exception:
                    pass

    # ----------------------------------------------------------------------- metadata
    def describe(self) -> dict[str, Any]:
        d = process_info()
        self._pg_initialized = bool(d["process_group_initialized"])
        d["strategies"] = [t.describe() for t in self.trackers] + self.failures
        return d

    def publish(self) -> None:
        """(Re)writes the `distributed` metadata; the analysis keeps the last value."""
        text = json.dumps(self.describe(), sort_keys=True)
        if text != self._published:
            self._published = text
            self.instr._native.metadata("distributed", text)
