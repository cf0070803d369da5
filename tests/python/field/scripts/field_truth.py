"""The truth a field trial is checked against, computed in the script's own process from the
modules themselves (never from ridgescope): per model, the bytes of its parameter and buffer
storages. A field script calls ``write_truth(name=model, ...)`` as its last line; it writes only
when the test asks (RIDGESCOPE_FIELD_TRUTH names the file), so the script runs the same
without it."""
from __future__ import annotations

import json
import os

import torch


def _storage_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen.setdefault(s.data_ptr(), s.nbytes())
    return sum(seen.values())


def write_truth(**models) -> None:
    path = os.environ.get("RIDGESCOPE_FIELD_TRUTH")
    if not path:
        return
    out = {}
    for name, m in models.items():
        if isinstance(m, torch.nn.Module):
            params = list(m.parameters())
            out[name] = {"parameter_bytes": _storage_bytes(params),
                         "buffer_bytes": _storage_bytes(m.buffers()),
                         "parameters": sum(p.numel() for p in params),
                         "trainable": any(p.requires_grad for p in params)}
        else:  # a copy of a model's weights (diffusers' EMAModel.shadow_params)
            tensors = list(m)
            out[name] = {"parameter_bytes": _storage_bytes(tensors), "buffer_bytes": 0,
                         "parameters": sum(t.numel() for t in tensors), "trainable": False}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, sort_keys=True)
