"""Remedies for a step that does not fit: the largest micro-batch and the longest sequence that
fit (bisection over dry runs), activation checkpointing (a dry run), and arithmetic on the
measured composition (a fused optimizer step, 8-bit or sharded optimizer state)."""
from __future__ import annotations

import math
from typing import Any, Callable

from ._dry_run import _accepts
from ._results import Estimate, Remedy


def _largest(run: Callable[..., Estimate], bk: dict[str, Any], name: str, hi: int,
             unit: int) -> tuple[int, Estimate | None, int]:
    """The largest value of ``name`` (a multiple of ``unit``, below ``hi``, which does not fit)
    whose dry run fits, by bisection; (0, None, runs) when even ``unit`` does not fit."""
    runs = 0
    lo_val, lo_est = 0, None
    lo, top = 1, (hi - 1) // unit  # candidates unit * [1 .. top]
    while lo <= top:
        mid = (lo + top) // 2
        trial = run(batch_kwargs={**bk, name: mid * unit}, remedies=False)
        runs += 1
        if trial.fits:
            lo_val, lo_est, lo = mid * unit, trial, mid + 1
        else:
            top = mid - 1
    return lo_val, lo_est, runs


def _find_remedies(est: Estimate, bk: dict[str, Any], mk: dict[str, Any],
                   run: Callable[..., Estimate], make_model: Callable[..., Any],
                   make_batch: Callable[..., Any]) -> None:
    cap = est.capacity
    assert cap is not None
    # 1. The largest micro-batch that fits (bisection over dry runs); the global batch is kept
    # with gradient accumulation.
    b0 = bk.get("batch_size")
    if b0 is not None:
        if b0 == 1:
            est.largest_batch, est.largest_batch_method = 0, "batch 1 (this run) does not fit"
        else:
            b, trial, n = _largest(run, bk, "batch_size", b0, 1)
            est.largest_batch = b
            est.largest_batch_method = f"bisection over {n} dry runs"
            if trial is not None:
                est.remedies.append(Remedy(
                    f"micro-batch {b}", f"micro-batch {b} with gradient accumulation over "
                    f"{math.ceil(b0 / b)} micro-steps keeps the global batch",
                    trial.peak_allocated, trial.fits, "dry run"))
    # 2. The longest sequence that fits (multiples of 64), when the batch is built from one.
    s0 = bk.get("seq_len")
    if s0 is not None and s0 > 64:
        s, trial, n = _largest(run, bk, "seq_len", s0, 64)
        est.largest_seq_len = s
        est.largest_seq_len_method = f"bisection over {n} dry runs (multiples of 64)"
        if trial is not None:
            est.remedies.append(Remedy(f"sequence length {s}", f"seq_len={s} at the same batch",
                                       trial.peak_allocated, trial.fits, "dry run"))
    # 3. Activation checkpointing, when make_model takes a flag for it.
    flag = next((n for n in ("checkpointing", "activation_checkpointing",
                             "gradient_checkpointing") if _accepts(make_model, n)), None)
    if flag and not mk.get(flag):
        ck = run(model_kwargs={**mk, flag: True}, remedies=False)
        est.remedies.append(Remedy("activation checkpointing", f"make_model({flag}=True)",
                                   ck.peak_allocated, ck.fits, "dry run"))
    # 4. Arithmetic on the composition at each phase's peak (the new peak is the largest of
    # them, so a peak that moves to another phase is found). Only the named category changes.
    phases = est.report.phases()
    ratio = (est.predicted_peak / est.peak_allocated) if est.peak_allocated else 1.0

    def scaled(category: str, factor: float, only: str | None = None) -> int:
        return max((int(p["peak_bytes"] - (1 - factor) * p["peak_by_category"].get(category, 0)
                        if only is None or p["phase"] == only else p["peak_bytes"])
                    for p in phases), default=est.peak_allocated)

    def add(name: str, desc: str, peak: int) -> None:
        est.remedies.append(Remedy(name, desc, peak, int(peak * ratio) <= cap, "arithmetic"))

    step_temp = max((p["peak_by_category"].get("temporary", 0) for p in phases
                     if p["phase"] == "optimizer_step"), default=0)
    if step_temp:
        add("fused optimizer step", "fused=True (no full-size temporaries in the optimizer "
            "step; the foreach default keeps some)", scaled("temporary", 0.0, "optimizer_step"))
    state = max((p["peak_by_category"].get("optimizer_state", 0) for p in phases), default=0)
    if state:
        elem = _state_element_bytes(est)
        f8 = min(1.0, 1.02 / elem)  # 1 byte per element + ~2 % block scales
        add("8-bit optimizer state", "moments stored in 8 bits (bitsandbytes-style)",
            scaled("optimizer_state", f8))
        for n in (2, 4, 8):
            add(f"sharded optimizer state x{n}", f"optimizer state sharded over {n} ranks "
                "(ZeRO-1; gradients and parameters unchanged)", scaled("optimizer_state", 1 / n))


def _state_element_bytes(est: Estimate) -> int:
    """Bytes per optimizer-state element: 2 for a 16-bit model's moments, else 4."""
    model = est.report.to_dict().get("model", {})
    n, b = model.get("parameters") or 0, model.get("parameter_bytes") or 0
    return max(1, round(b / n)) if n else 4
