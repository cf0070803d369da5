"""FSDP2 (``torch.distributed.fsdp.fully_shard``): local shards, all-gathers, reduce-scatters
(docs/distributed.md).

Structures (torch 2.11 and 2.14): every ``fully_shard``-ed module has an ``FSDPState`` with its
``FSDPParamGroup`` (2.11: ``state._fsdp_param_group``; 2.14: the list
``state._fsdp_param_groups``). A group holds ``FSDPParam``s; each keeps its rank's padded local
shard in ``_sharded_param_data`` (the module's parameter is a DTensor over it), its full size in
``_orig_size``, and, while unsharded, the all-gathered parameter in ``all_gather_outputs``
(freed by ``reshard``). ``unshard()`` starts the all-gather into one flat
``_all_gather_result.all_gather_output``; ``wait_for_unshard()`` copies it out into the
per-parameter outputs; ``post_backward()`` reduce-scatters the unsharded gradients from a flat
input (kept in ``comm_ctx.reduce_scatter_states`` in 2.14, ``reduce_scatter_state`` in earlier
releases) into the sharded gradients (DTensors over one
flat output per group).

What is tagged: local shards as ``parameter`` ("layers.0.weight (shard 2048 of 4096 elements)");
the flat all-gather buffer and the unsharded parameters as ``comm_buffer`` ("all-gather of
layers.3"); the reduce-scatter input as ``comm_buffer`` ("reduce-scatter of layers.3"); the
sharded gradients as ``gradient`` (under HSDP the all-reduce runs in place on them). A buffer in
another dtype than the shards (a MixedPrecisionPolicy's param_dtype) says so: "all-gather of
layers.3 (bfloat16)". Optimizer state over DTensors is tagged by the ordinary
optimizer scan through the DTensors' local tensors. The three group methods are wrapped at
class level while a session runs, and restored after."""
from __future__ import annotations

import functools
import math
from typing import Any

import torch


def _classes() -> tuple[Any, Any] | None:
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    except Exception:
        return None
    return FSDPModule, FSDPParamGroup


def is_fsdp2(module: Any) -> bool:
    c = _classes()
    return c is not None and isinstance(module, c[0])


def param_groups(module: Any) -> list[Any]:
    """The FSDPParamGroups of one fully_shard-ed module (none when it has no parameters)."""
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is None:
        return []
    state = get_state()
    groups = getattr(state, "_fsdp_param_groups", None)  # torch 2.14
    if groups is None:  # torch 2.11: one group or None
        group = getattr(state, "_fsdp_param_group", None)
        groups = [] if group is None else [group]
    return list(groups)


class Fsdp2Tracker:
    kind = "fsdp2"

    def __init__(self, tracking: Any, model: torch.nn.Module) -> None:
        self._tracking = tracking
        self._model = model
        self._groups: list[tuple[Any, str]] = []   # (FSDPParamGroup, module name)
        self._group_names: dict[int, str] = {}
        self._restore: list[Any] = []
        self._params: list[dict[str, Any]] = []
        self._tagged_shards: dict[int, int] = {}   # id(FSDPParam) -> storage pointer
        self.active = False
        self._forwards = 0
        self._shard_dtype = next((p.dtype for p in model.parameters()), None)
        names = {id(m): n for n, m in model.named_modules()}
        for m in model.modules():
            if is_fsdp2(m):
                name = names.get(id(m)) or type(m).__name__
                for g in param_groups(m):
                    self._groups.append((g, name))
                    self._group_names[id(g)] = name

    # -------------------------------------------------------------------- wrapping
    def start(self) -> None:
        classes = _classes()
        if classes is None:
            return
        group_cls = classes[1]
        tracker = self
        guard = self._tracking.instr._guard

        def wrap(name: str, after: Any) -> None:
            original = getattr(group_cls, name, None)
            if original is None:
                return
            guarded_after = guard(after)

            @functools.wraps(original)
            def wrapper(group: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(group, *args, **kwargs)
                if tracker.active:
                    guarded_after(group)
                return result
            setattr(group_cls, name, wrapper)
            self._restore.append(lambda: setattr(group_cls, name, original))

        wrap("unshard", self._after_unshard)
        wrap("wait_for_unshard", self._after_wait_for_unshard)
        wrap("post_backward", self._after_post_backward)
        self.active = True

    def remove(self) -> None:
        self.active = False
        for restore in reversed(self._restore):
            restore()
        self._restore.clear()

    # -------------------------------------------------------------------- labels
    def _group_name(self, group: Any) -> str:
        name = self._group_names.get(id(group))
        if name is None:
            name = getattr(group, "_module_fqn", None) or "the root module"
            self._group_names[id(group)] = name
        return name

    def _tag(self, tensor: Any, category: str, text: str) -> None:
        if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().nbytes() > 0:
            if tensor.dtype != self._shard_dtype:  # cast by a MixedPrecisionPolicy
                text += f" ({str(tensor.dtype).removeprefix('torch.')})"
            instr = self._tracking.instr
            instr._native.tag(tensor, category, instr.label(text), False)

    # -------------------------------------------------------------------- shards
    def scan(self) -> None:
        """Labels every local shard as a parameter (adopting shards made before tracking)."""
        instr = self._tracking.instr
        described = []
        changed = False
        for group, _ in self._groups:
            for fp in getattr(group, "fsdp_params", []):
                param = getattr(fp, "sharded_param", None)
                data = getattr(fp, "_sharded_param_data", None)
                local = getattr(param, "_local_tensor", None)
                if param is None or not isinstance(local, torch.Tensor):
                    continue
                self._tracking.owned.add(id(param))
                name = instr._param_name(param)
                full = math.prod(getattr(fp, "_orig_size", param.shape))
                n_local = local.numel()
                storage = (data if isinstance(data, torch.Tensor) else local).untyped_storage()
                described.append({"name": name, "numel": int(full), "local_numel": int(n_local),
                                  "fraction": (n_local / full) if full else 0.0,
                                  "local_bytes": int(storage.nbytes())})
                ptr = storage.data_ptr()
                if self._tagged_shards.get(id(fp)) != ptr:
                    self._tagged_shards[id(fp)] = ptr
                    changed = True
                    instr._native.register(local, "parameter", instr.label(
                        f"{name} (shard {n_local} of {full} elements)"))
        if changed or described != self._params:
            self._params = described
            self._tracking.publish()

    def after_forward(self, module: Any) -> None:
        if self._forwards < 2:  # lazy_init may re-make the shards in the first forward
            self._forwards += 1
            self.scan()

    # -------------------------------------------------------------------- collectives
    def _after_unshard(self, group: Any) -> None:
        result = getattr(group, "_all_gather_result", None)
        output = getattr(result, "all_gather_output", None)
        self._tag(output, "comm_buffer", f"all-gather buffer of {self._group_name(group)}")

    def _after_wait_for_unshard(self, group: Any) -> None:
        text = f"all-gather of {self._group_name(group)}"
        for fp in getattr(group, "fsdp_params", []):
            for t in getattr(fp, "all_gather_outputs", []):
                self._tag(t, "comm_buffer", text)

    def _after_post_backward(self, group: Any) -> None:
        name = self._group_name(group)
        ctx = getattr(group, "comm_ctx", None)
        states = getattr(ctx, "reduce_scatter_states", None)  # torch 2.14: a list
        state = states[-1] if states else getattr(ctx, "reduce_scatter_state", None)  # 2.11: one
        if state is not None:
            self._tag(getattr(state, "reduce_scatter_input", None), "comm_buffer",
                      f"reduce-scatter of {name}")
        seen: set[int] = set()
        for fp in getattr(group, "fsdp_params", []):
            grad = getattr(getattr(fp, "sharded_param", None), "grad", None)
            local = getattr(grad, "_local_tensor", grad)
            if isinstance(local, torch.Tensor):
                ptr = local.untyped_storage().data_ptr()
                if ptr and ptr not in seen:
                    seen.add(ptr)
                    self._tag(local, "gradient", f"sharded gradients of {name}")

    def _policies(self) -> dict[str, Any]:
        """The first group's mixed precision, offload and mesh (fully_shard's arguments are
        usually the same for every module)."""
        if not self._groups:
            return {}
        group = self._groups[0][0]
        d: dict[str, Any] = {}
        mp = getattr(group, "mp_policy", None)
        if mp is not None:
            d["mixed_precision"] = {k: (str(v).removeprefix("torch.") if v is not None else None)
                                    for k, v in (("param_dtype", mp.param_dtype),
                                                 ("reduce_dtype", mp.reduce_dtype),
                                                 ("output_dtype", mp.output_dtype))}
        offload = getattr(group, "offload_policy", None)
        d["cpu_offload"] = type(offload).__name__ == "CPUOffloadPolicy"
        info = getattr(group, "mesh_info", None)
        mesh = getattr(info, "mesh", None)
        if mesh is not None:
            d["mesh"] = {"shape": list(mesh.shape), "dim_names": list(mesh.mesh_dim_names or []),
                         "hsdp": getattr(info, "replicate_mesh_dim", None) is not None
                         and getattr(info, "shard_mesh_dim", None) is not None}
        return d

    def describe(self) -> dict[str, Any]:
        return {"strategy": "fsdp2", "groups": [n for _, n in self._groups],
                "parameters": self._params[:256], "parameter_count": len(self._params),
                "local_shard_bytes": sum(p["local_bytes"] for p in self._params),
                **self._policies()}
