"""The TensorBoard reporter: a report's per-step figures as TensorBoard scalars, next to the loss.

For every step of ``report["steps"]`` it writes, at that step:

* ``ridgescope/peak_bytes``: the step's highest live bytes (``steps[].peak_bytes``);
* ``ridgescope/peak/<category>``: the composition at that instant, one scalar for each of the
  ten categories (``steps[].peak_by_category``), zeros included, so every series has a point
  at every step.

Values are bytes, written as double-precision scalars (TensorBoard's "new style" scalar, a
tensor of one double), so they equal the JSON report's integers exactly below 2^53 bytes;
TensorBoard's own single-precision ``simple_value`` would round every figure above 16 MiB.

It writes through ``torch.utils.tensorboard.SummaryWriter``, which needs the ``tensorboard``
package (``pip install 'ridgescope[tensorboard]'``); it is imported only when a report is
written, never by ``import ridgescope``. docs/integrations.md shows the commands."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .._errors import RidgescopeError

TAG_PREFIX = "ridgescope"


def scalars(data: dict[str, Any], step_offset: int = 0) -> list[tuple[str, int, int]]:
    """(tag, step, bytes) for every scalar the report gives, in step order. ``step_offset`` is
    added to the report's step numbers (a Trainer that counts from 1 after the first optimizer
    step uses 1, so the figures of step *n* land where its loss of step *n* does)."""
    out: list[tuple[str, int, int]] = []
    categories = data.get("categories") or list(data["peak"]["by_category"])
    for s in data["steps"]:
        step = int(s["step"]) + step_offset
        out.append((f"{TAG_PREFIX}/peak_bytes", step, int(s["peak_bytes"])))
        for c in categories:
            out.append((f"{TAG_PREFIX}/peak/{c}", step, int(s["peak_by_category"][c])))
    return out


def write_tensorboard(data: dict[str, Any], logdir: str | os.PathLike[str],
                      step_offset: int = 0) -> dict[str, Any]:
    """Writes the report's per-step scalars into an event file in ``logdir`` (created if
    needed). Returns ``{"logdir", "steps", "scalars"}``. Raises RidgescopeError when the
    ``tensorboard`` package is missing or the directory cannot be made."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise RidgescopeError(
            "writing TensorBoard scalars needs the tensorboard package: "
            f"pip install 'ridgescope[tensorboard]' ({exc})") from None
    out = Path(logdir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RidgescopeError(f"cannot create the TensorBoard directory {out}: {exc}") from None
    rows = scalars(data, step_offset)
    writer = SummaryWriter(log_dir=str(out))
    try:
        for tag, step, value in rows:
            writer.add_scalar(tag, value, global_step=step, new_style=True,
                              double_precision=True)
    finally:
        writer.close()
    return {"logdir": str(out), "steps": len(data["steps"]), "scalars": len(rows)}
