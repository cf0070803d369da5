"""DeepSpeed ZeRO, stages 1, 2 and 3: partitions, fp32 master weights, reduce buckets and
all-gathers (docs/distributed.md).

Structures (DeepSpeed 0.19, ``deepspeed/runtime/zero/``); ``engine.optimizer`` is the ZeRO
optimizer, with a torch optimizer (``.optimizer``, e.g. FusedAdam) over this rank's fp32
partition:

* ZeRO-1/2 (``stage_1_and_2.DeepSpeedZeroOptimizer``): the model's parameters are views into
  one flat tensor per group, ``bit16_groups_flat[i]``, whole on every rank; this rank updates
  ``single_partition_of_fp32_groups[i]`` (an fp32 copy of its partition: the torch optimizer's
  only parameter). Backward copies gradients into the reduce bucket (``ipg_buckets[dtype]
  .buffer``, ``reduce_bucket_size`` elements, made in ``setup_buckets``; the gradients are views
  into it until reduced), then keeps this rank's share in ``grads_in_partition``.
* ZeRO-3 (``stage3.DeepSpeedZeroOptimizer_Stage3``): each parameter's data is an empty
  placeholder outside the module that uses it; its partition is ``param.ds_tensor``, a view into
  ``lp_param_buffer``; ``ds_numel`` is its full size. Parameters under
  ``stage3_param_persistence_threshold`` elements stay whole (``ds_persist``). The fp32 partitions
  are ``fp32_partitioned_groups_flat``, the gradient partitions ``grad_partitions_flat_buffer``,
  the reduce bucket ``ipg_buckets[dtype].buffer`` (kept for the whole run). A module's
  parameters are all-gathered into a flat buffer (``AllGatherCoalescedHandle.partitions``) and
  copied out into each parameter's ``data`` by the handle's ``wait``.

What is tagged: parameters (stage 1/2: the flat group; stage 3: the partition buffer and the
persistent parameters) as ``parameter``; the fp32 master partitions as ``optimizer_state``; the
gradient partitions as ``gradient``; the reduce bucket, the all-gather buffers and the gathered
parameters as ``comm_buffer``, labelled with the config key that sizes them. The parameters'
own ``.grad`` is not scanned from stage 2 on: it is a view into the reduce bucket.

Phases: ``DeepSpeedEngine.backward`` is the backward (DeepSpeed reduces the gradients after
autograd returns), ``_take_model_step`` the optimizer step, and a step is counted when it ends
(not at the torch optimizer's step inside it). The methods are wrapped at class level while a
session runs, and restored after; the wrappers act for the tracked engine only."""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import torch

from ._tensors import StorageMemo, local_numel

def _class(module: str, name: str) -> Any:
    # Never imported here: deepspeed's import is slow and has side effects. An engine that
    # exists was made from these modules, so they are loaded already.
    return getattr(sys.modules.get(module), name, None)


def is_deepspeed(module: Any) -> bool:
    cls = _class("deepspeed.runtime.engine", "DeepSpeedEngine")
    return cls is not None and isinstance(module, cls)


def _storage(t: Any) -> Any:
    if not isinstance(t, torch.Tensor) or t.device.type not in ("cpu", "cuda"):
        return None
    s = t.untyped_storage()
    return s if s.nbytes() > 0 and s.data_ptr() else None


def _nbytes(t: Any) -> int:
    s = _storage(t)
    return int(s.nbytes()) if s is not None else 0


def _short(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _elements(n: int) -> str:
    return f"{n:,} elements"


class DeepSpeedTracker:
    kind = "deepspeed"

    def __init__(self, tracking: Any, engine: Any) -> None:
        self._tracking = tracking
        self.engine = engine
        self.zero = getattr(engine, "optimizer", None)
        self.stage = int(engine.zero_optimization_stage())
        self._params = list(engine.module.parameters())
        self._param_ids = {id(p) for p in self._params}
        self._full = sum(local_numel(p) for p in self._params)  # ds_numel under ZeRO-3
        self._persistent = [p for p in self._params if getattr(p, "ds_persist", False)]
        try:
            self.rank = int(engine.global_rank)
        except (AttributeError, TypeError, ValueError):
            self.rank = 0
        self._tagged = StorageMemo()               # what -> the storage last tagged
        self._restore: list[Callable[[], None]] = []
        self._buffers: dict[str, dict[str, Any]] = {}   # what -> its description
        self._partitions: dict[str, dict[str, Any]] = {}
        self.active = False
        self._forwards = 0
        self.config = self._config()

    # -------------------------------------------------------------------- description
    def _config(self) -> dict[str, Any]:
        e = self.engine
        keys = {"reduce_bucket_size": "zero_reduce_bucket_size",
                "allgather_bucket_size": "zero_allgather_bucket_size",
                "contiguous_gradients": "zero_contiguous_gradients",
                "overlap_comm": "zero_overlap_comm"}
        if self.stage == 3:
            keys.update(stage3_prefetch_bucket_size="zero_prefetch_bucket_size",
                        stage3_param_persistence_threshold="zero_param_persistence_threshold",
                        stage3_max_live_parameters="zero_max_live_parameters")
        config: dict[str, Any] = {}
        for key, getter in keys.items():
            try:
                value = getattr(e, getter)()
            except Exception:
                continue
            if isinstance(value, (bool, int, float)):
                whole = isinstance(value, float) and value.is_integer()
                config[key] = int(value) if whole else value
        return config

    def _group_params(self) -> list[list[Any]]:
        groups = getattr(self.zero, "fp16_groups" if self.stage == 3 else "bit16_groups", None)
        return [list(g) for g in groups] if isinstance(groups, list) else []

    def _name_partitions(self) -> None:
        """Names the fp32 partitions the torch optimizer steps (its state's labels use them)."""
        names = self._tracking.names
        attr = ("fp32_partitioned_groups_flat" if self.stage == 3
                else "single_partition_of_fp32_groups")
        for i, t in enumerate(getattr(self.zero, attr, None) or []):
            if isinstance(t, torch.Tensor):
                names[id(t)] = f"rank {self.rank}'s fp32 partition of group {i}"

    # -------------------------------------------------------------------- tagging
    def _tag(self, what: str, tensor: Any, category: str, text: str | Callable[[], str],
             register: bool = False) -> bool:
        """Tags the block behind ``tensor`` unless its storage was tagged as ``what`` already
        (``text``, or a function making it, is only used when a tag is written). ``register``
        adopts a block made before the session (a persistent structure)."""
        storage = _storage(tensor)
        if storage is None or not self._tagged.changed(what, storage):
            return False
        instr = self._tracking.instr
        label = instr.label(text() if callable(text) else text)
        if register:
            instr._native.register(tensor, category, label)
        else:
            instr._native.tag(tensor, category, label, False)
        return True

    def _describe_block(self, table: dict[str, dict[str, Any]], what: str, tensor: Any,
                        category: str, **extra: Any) -> None:
        entry = {"what": what, "bytes": _nbytes(tensor), "category": category,
                 "dtype": str(tensor.dtype).removeprefix("torch."), **extra}
        if table.get(what) != entry:
            table[what] = entry
            self._tracking.publish()

    def _bucket(self, what: str, buffers: list[Any]) -> None:
        """The reduce bucket(s): comm_buffer, labelled by reduce_bucket_size."""
        size = self.config.get("reduce_bucket_size")
        for j, buf in enumerate(b for b in buffers if _storage(b) is not None):
            name = f"{what} {j}" if len(buffers) > 1 else what
            text = (f"reduce bucket{f' {j}' if len(buffers) > 1 else ''} (reduce_bucket_size "
                    f"{_elements(size) if size else '?'}, {str(buf.dtype).removeprefix('torch.')})")
            self._tag(name, buf, "comm_buffer", text, register=True)
            self._describe_block(self._buffers, name, buf, "comm_buffer",
                                 config_key="reduce_bucket_size", elements=int(buf.numel()))

    def scan(self) -> None:
        """Labels the persistent structures and whatever buffer is live now."""
        if self.zero is None:
            return
        if self.stage == 3:
            self._scan_stage3()
        elif self.stage in (1, 2):
            self._scan_stage12()

    def _master_weights(self, partitions: list[Any]) -> None:
        """The fp32 master partitions the torch optimizer steps, and the fp32 gradients the
        step hands it (set for the step only)."""
        for i, fp32 in enumerate(partitions):
            what = f"fp32 master weights of group {i}"
            self._tag(what, fp32, "optimizer_state", lambda: (
                f"fp32 master weights: rank {self.rank}'s partition of group {i} "
                f"({_elements(fp32.numel())})"), register=True)
            self._describe_block(self._partitions, what, fp32, "optimizer_state",
                                 elements=int(fp32.numel()))
            grad = getattr(fp32, "grad", None)
            if grad is not None:
                self._tag(f"fp32 gradients of group {i}", grad, "gradient",
                          f"gradients of rank {self.rank}'s partition of group {i} (fp32, for "
                          "the step)")

    def _buckets(self, buffers: Callable[[Any], list[Any]]) -> None:
        for dtype, bucket in (getattr(self.zero, "ipg_buckets", None) or {}).items():
            self._bucket(f"reduce bucket {str(dtype).removeprefix('torch.')}", buffers(bucket))

    def _scan_stage12(self) -> None:
        z, rank = self.zero, self.rank
        groups = self._group_params()
        for i, flat in enumerate(getattr(z, "bit16_groups_flat", None) or []):
            params = groups[i] if i < len(groups) else []
            what = f"parameters of group {i}"
            self._tag(what, flat, "parameter", lambda: (
                f"parameters of group {i}, flat: "
                f"{_short([self._tracking.instr._param_name(p) for p in params])} "
                f"({_elements(flat.numel())}, whole on every rank in ZeRO-{self.stage})"),
                register=True)
            self._describe_block(self._partitions, what, flat, "parameter",
                                 elements=int(flat.numel()), parameters=len(params))
        self._master_weights(getattr(z, "single_partition_of_fp32_groups", None) or [])
        # this rank's gradients after backward: grads_in_partition (dropped when the reduction
        # ends) and averaged_gradients, views into it
        grads = getattr(z, "grads_in_partition", None)
        if grads is not None:
            self._tag("gradient partition", grads, "gradient",
                      f"gradients of rank {rank}'s partition ({_elements(grads.numel())})")
        for i, views in (getattr(z, "averaged_gradients", None) or {}).items():
            for j, view in enumerate(views if isinstance(views, list) else [views]):
                self._tag(f"averaged gradients {i}.{j}", view, "gradient",
                          f"gradients of rank {rank}'s partition of group {i}")
        self._buckets(lambda bucket: list(getattr(bucket, "buffer", None) or []))

    def _scan_stage3(self) -> None:
        z, rank, n = self.zero, self.rank, len(self._params)
        lp = getattr(z, "lp_param_buffer", None)
        if isinstance(lp, torch.Tensor):
            self._tag("parameter partition", lp, "parameter", lambda: (
                f"rank {rank}'s partition of {n} parameters ({_elements(lp.numel())} of "
                f"{self._full:,})"), register=True)
            self._describe_block(self._partitions, "parameter partition", lp, "parameter",
                                 elements=int(lp.numel()), parameters=n)
        for p in self._persistent:
            self._tag(f"persistent {id(p)}", p.data, "parameter", lambda: (
                f"{self._tracking.instr._param_name(p)} (whole on every rank: under "
                "stage3_param_persistence_threshold)"), register=True)
        self._master_weights(getattr(z, "fp32_partitioned_groups_flat", None) or [])
        grads = getattr(z, "grad_partitions_flat_buffer", None)
        if isinstance(grads, torch.Tensor):
            self._tag("gradient partition", grads, "gradient", lambda: (
                f"gradients of rank {rank}'s partition of {n} parameters "
                f"({_elements(grads.numel())})"), register=True)
            self._describe_block(self._partitions, "gradient partition", grads, "gradient",
                                 elements=int(grads.numel()))
        self._buckets(lambda bucket: [getattr(bucket, "buffer", None)])

    # -------------------------------------------------------------------- all-gathers (ZeRO-3)
    def _gathered(self, params: list[Any], flat: Any = None) -> None:
        mine = [p for p in params if id(p) in self._param_ids]
        if not mine:
            return
        names = [self._tracking.instr._param_name(p) for p in mine]
        instr = self._tracking.instr
        if flat is not None and _storage(flat) is not None:
            instr._native.tag(flat, "comm_buffer", instr.label(
                f"all-gather buffer of {_short(names)}"), False)
        for p, name in zip(mine, names):
            if getattr(p, "ds_persist", False):
                text, category = (f"{name} (whole on every rank: under "
                                  "stage3_param_persistence_threshold)", "parameter")
            else:
                text, category = f"all-gather of {name}", "comm_buffer"
            if _storage(p.data) is not None:
                instr._native.tag(p.data, category, instr.label(text), False)

    # -------------------------------------------------------------------- wrapping
    def _wrap(self, cls: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = cls.__dict__.get(name) if cls is not None else None
        if original is None:
            return
        setattr(cls, name, functools.wraps(original)(make(original)))
        self._restore.append(lambda: setattr(cls, name, original))

    def start(self) -> None:
        if self.zero is not None:  # labelled here, by group or partition (none: no ZeRO optimizer)
            self._tracking.owned.update(self._param_ids)
        if self.zero is not None and self.stage >= 2:
            # .grad is a view into the reduce bucket: not a gradient's own block
            self._tracking.unwatched.update(self._param_ids)
        self._name_partitions()
        instr = self._tracking.instr
        guard = instr._guard
        tracker = self
        engine_cls = _class("deepspeed.runtime.engine", "DeepSpeedEngine")
        begin, end = guard(instr.begin_phase), guard(instr.end_phase)
        tag_loss, tag_gradients = guard(instr._tag_loss), guard(instr.tag_gradients)
        scan, mark_step = guard(self.scan), guard(instr.mark_step)

        def backward(original: Any) -> Any:
            def wrapper(engine: Any, loss: Any = None, *args: Any, **kwargs: Any) -> Any:
                if engine is not tracker.engine or not tracker.active:
                    return original(engine, loss, *args, **kwargs)
                opened = begin("backward", False)
                if opened:
                    tag_loss(loss)
                try:
                    return original(engine, loss, *args, **kwargs)
                finally:
                    if opened:
                        tag_gradients()
                        end("backward")
            return wrapper

        def epilogue(original: Any) -> Any:
            def wrapper(engine: Any, *args: Any, **kwargs: Any) -> Any:
                if engine is tracker.engine and tracker.active:
                    tag_gradients()  # autograd's gradients (ZeRO-1), before DeepSpeed frees them
                return original(engine, *args, **kwargs)
            return wrapper

        def model_step(original: Any) -> Any:
            def wrapper(engine: Any, *args: Any, **kwargs: Any) -> Any:
                if engine is not tracker.engine or not tracker.active:
                    return original(engine, *args, **kwargs)
                opened = begin("optimizer_step", False)
                try:
                    result = original(engine, *args, **kwargs)
                finally:
                    scan()
                    if opened:
                        end("optimizer_step")
                mark_step()  # a step that raised is not counted, as a torch optimizer's is not
                return result
            return wrapper

        self._wrap(engine_cls, "backward", backward)
        self._wrap(engine_cls, "_backward_epilogue", epilogue)
        self._wrap(engine_cls, "_take_model_step", model_step)
        if self.stage in (1, 2):
            zero_cls = _class("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer")
            self._wrap(zero_cls, "setup_buckets", self._wrap_setup_buckets)
            self._wrap(zero_cls, "allreduce_bucket", self._wrap_collective(
                "allreduce of a reduce bucket (its gradients flattened; reduce_bucket_size)"))
        if self.stage == 3:
            module = "deepspeed.runtime.zero.partition_parameters"
            self._wrap(_class(module, "AllGatherCoalescedHandle"), "wait",
                       self._wrap_coalesced_wait)
            self._wrap(_class(module, "AllGatherHandle"), "wait", self._wrap_wait)
            # a module function stage3 imported by name: wrapped where stage3 looks it up
            self._wrap(sys.modules.get("deepspeed.runtime.zero.stage3"), "reduce_scatter_coalesced",
                       self._wrap_collective("reduce-scatter of a reduce bucket (its gradients "
                                             "flattened; reduce_bucket_size)"))
        instr.count_steps_at(self.engine)
        instr.watch_gradients()  # without the parameters whose .grad DeepSpeed keeps in its bucket
        self.active = True

    def _wrap_setup_buckets(self, original: Any) -> Any:
        tracker, scan = self, self._tracking.instr._guard(self.scan)

        def wrapper(zero: Any, *args: Any, **kwargs: Any) -> Any:
            fresh = not getattr(zero, "ready_for_gradients", True)  # the bucket is made now
            result = original(zero, *args, **kwargs)
            if fresh and zero is tracker.zero and tracker.active:
                scan()
            return result
        return wrapper

    def _wrap_collective(self, text: str) -> Callable[[Any], Any]:
        """A reduction that flattens a bucket's gradients into a buffer of its own and returns it
        (or views into it): that buffer is a comm_buffer while it lives (it may outlive backward
        while gloo's worker thread still holds the collective's work)."""
        tracker = self

        def make(original: Any) -> Any:
            def tag(result: Any) -> None:
                first = result[0] if isinstance(result, (list, tuple)) and result else result
                if _storage(first) is not None:
                    instr = tracker._tracking.instr
                    instr._native.tag(first, "comm_buffer", instr.label(text), False)
            guarded = self._tracking.instr._guard(tag)

            def wrapper(*args: Any, **kwargs: Any) -> Any:
                result = original(*args, **kwargs)
                if tracker.active:
                    guarded(result)
                return result
            return wrapper
        return make

    def _wrap_coalesced_wait(self, original: Any) -> Any:
        tracker, gathered = self, self._tracking.instr._guard(self._gathered)

        def wrapper(handle: Any, *args: Any, **kwargs: Any) -> Any:
            waiting = tracker.active and not getattr(handle, "complete", True)
            params = list(getattr(handle, "params", None) or []) if waiting else []
            parts = getattr(handle, "partitions", None) if params else None
            flat = parts[0] if isinstance(parts, list) and parts else None
            result = original(handle, *args, **kwargs)
            if params:
                gathered(params, flat)
            return result
        return wrapper

    def _wrap_wait(self, original: Any) -> Any:
        tracker, gathered = self, self._tracking.instr._guard(self._gathered)

        def wrapper(handle: Any, *args: Any, **kwargs: Any) -> Any:
            waiting = tracker.active and not getattr(handle, "_AllGatherHandle__complete", True)
            result = original(handle, *args, **kwargs)
            param = getattr(handle, "_AllGatherHandle__param", None) if waiting else None
            if param is not None:
                gathered([param])
            return result
        return wrapper

    def remove(self) -> None:
        self.active = False
        for restore in reversed(self._restore):
            restore()
        self._restore.clear()
        self._tagged.release()
        self._tracking.owned.difference_update(self._param_ids)
        self._tracking.unwatched.difference_update(self._param_ids)

    # -------------------------------------------------------------------- events
    def after_forward(self, module: Any) -> None:
        if self._forwards < 2:
            self._forwards += 1
            self.scan()

    def after_backward(self) -> None:
        self.scan()

    def after_step(self, optimizer: Any) -> None:
        self.scan()  # the fp32 partition's gradient, set for the torch optimizer's step

    def describe(self) -> dict[str, Any]:
        params = self._params
        d: dict[str, Any] = {
            "strategy": "deepspeed", "zero_stage": self.stage,
            "optimizer": type(getattr(self.zero, "optimizer", None)).__name__,
            "zero_optimizer": type(self.zero).__name__,
            "parameters": self._full, "parameter_tensors": len(params),
            "config": self.config,
            "partitions": sorted(self._partitions.values(), key=lambda e: e["what"]),
            "buffers": sorted(self._buffers.values(), key=lambda e: e["what"]),
        }
        if self.stage == 3:
            d["persistent_parameters"] = len(self._persistent)
        return d
