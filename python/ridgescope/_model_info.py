"""What the run's model and optimizer are: counts, dtypes, names, and the optimizer's state
tensors per parameter. Collected once when tracking starts and stored in the trace's ``run``
metadata; the native analysis turns it into the report's model and optimizer header (with the
persistent bytes per trainable parameter this implies, next to what was measured)."""
from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import torch

from .distributed._tensors import local_bytes, local_numel

# Optimizer state tensors per parameter, by optimizer class name, as a function of its
# hyperparameters (a param group's defaults). Scalar counters (Adam's `step`) are not counted:
# they are 4 bytes per parameter *tensor*, not per element.
def _states_per_parameter(optimizer: torch.optim.Optimizer) -> tuple[int | None, list[str]]:
    name = type(optimizer).__name__
    d = optimizer.defaults
    if name == "SGD":
        return (1, ["momentum_buffer"]) if d.get("momentum", 0) else (0, [])
    if name in ("Adam", "AdamW"):
        keys = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if d.get("amsgrad") else [])
        return len(keys), keys
    if name in ("NAdam", "RAdam", "Adamax"):
        return 2, ["exp_avg", "exp_avg_sq" if name != "Adamax" else "exp_inf"]
    if name == "Adagrad":
        return 1, ["sum"]
    if name == "Adadelta":
        return 2, ["square_avg", "acc_delta"]
    if name == "RMSprop":
        keys = ["square_avg"] + (["momentum_buffer"] if d.get("momentum", 0) else [])
        keys += ["grad_avg"] if d.get("centered") else []
        return len(keys), keys
    if name == "Rprop":
        return 2, ["prev", "step_size"]
    if name == "ASGD":
        return 1, ["ax"]
    return None, []


def storage_bytes(t: torch.Tensor) -> int:
    """Bytes of the tensor's own elements (numel x element size); of a DTensor (FSDP2) this
    rank's local shard, of a ZeRO-3 parameter its partition (distributed.local_bytes)."""
    return local_bytes(t)


def parameter_names(model: torch.nn.Module | None,
                    optimizer: torch.optim.Optimizer | None) -> dict[int, str]:
    """id(parameter) -> a name a person understands (``layers.3.mlp.fc1.weight``)."""
    names: dict[int, str] = {}
    if model is not None:
        for name, p in model.named_parameters(remove_duplicate=True):
            names.setdefault(id(p), name)
    if optimizer is not None:
        for g, group in enumerate(optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                names.setdefault(id(p), f"param_groups[{g}][{i}]")
    return names


def describe_run(model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None,
                 ridgescope_version: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "ridgescope_version": ridgescope_version,
        "torch_version": torch.__version__,
        "python_version": sys.version.split()[0],
        "argv": list(sys.argv),
    }
    params: list[torch.nn.Parameter] = []
    if model is not None:
        params = list(model.parameters())
    elif optimizer is not None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
    if params:
        seen: set[int] = set()
        unique = [p for p in params if not (id(p) in seen or seen.add(id(p)))]
        trainable = [p for p in unique if p.requires_grad]
        dtypes = Counter(str(p.dtype).replace("torch.", "") for p in unique)
        model_info: dict[str, Any] = {
            "class": type(model).__name__ if model is not None else None,
            # a DTensor (FSDP2) counts this rank's local shard, a ZeRO-3 parameter its full
            # size (docs/distributed.md)
            "parameters": sum(local_numel(p) for p in unique),
            "parameter_tensors": len(unique),
            "trainable_parameters": sum(local_numel(p) for p in trainable),
            "trainable_parameter_tensors": len(trainable),
            "parameter_bytes": sum(storage_bytes(p) for p in unique),
            "trainable_parameter_bytes": sum(storage_bytes(p) for p in trainable),
            "dtypes": {k: dtypes[k] for k in sorted(dtypes)},
            "devices": sorted({str(p.device) for p in unique}),
        }
        if model is not None:
            buffers = list(model.buffers())
            model_info["buffers"] = len(buffers)
            model_info["buffer_bytes"] = sum(storage_bytes(b) for b in buffers)
        info["model"] = model_info
    if optimizer is not None:
        states, keys = _states_per_parameter(optimizer)
        hyper = {k: v for k, v in optimizer.defaults.items()
                 if isinstance(v, (int, float, bool, str)) or
                 (isinstance(v, tuple) and all(isinstance(x, (int, float)) for x in v))}
        info["optimizer"] = {
            "type": type(optimizer).__name__,
            "states_per_parameter": states,
            "state_keys": keys,
            "hyperparameters": hyper,
            "param_groups": len(optimizer.param_groups),
        }
    return info
