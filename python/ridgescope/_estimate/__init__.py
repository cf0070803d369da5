"""``rs.estimate``: will a training step fit? A dry run under PyTorch's fake tensors.

The model, optimizer and batch are built under ``FakeTensorMode``: every tensor has its real
shape, dtype and strides, autograd saves what it really saves, and no memory is allocated (a
7B model costs a few hundred MiB of Python objects). Full training steps run on them (zero_grad,
forward, backward, optimizer step, including the first step's lazy optimizer state) with the
same instrumentation as a tracked run (``_instrument.Instrumentation``: the same phases, labels,
categories and tags), but its native side is ``_DryNative`` (``_dry_native.py``): a dispatch
mode sees every new storage an op returns (exact bytes), a weak-reference finalizer sees it die,
and both are written as alloc and free events into an ordinary ``.rstrace`` through
``_C.TraceWriter``. The normal analysis reads that trace, so the Report has the same shape as a
tracked run's.

For a CUDA target the fake tensors run on the CPU device (the autograd engine cannot run fake
CUDA tensors on a machine without a GPU), with CUDA's choices emulated where they change
memory: block rounding (512 bytes, or the allocator model), the foreach AdamW/Adam/SGD default,
the optimizer's step counters staying on the host, the cuBLAS workspace, and CUDA autocast's
float32 op list on top of CPU autocast. What is and is not modelled: docs/fit.md.

The package, one concept a module:

    _cuda_costs.py      what CUDA adds: block rounding, the cuBLAS/cuBLASLt workspaces, the
                        allocator model (constants and rules from _C)
    _dry_native.py      the dry native (a trace writer for fake storages) and the dispatch mode
                        that sees every new storage
    _cuda_emulation.py  a CUDA target on the CPU: device arguments, module moves, CUDA
                        autocast's float32 ops, the foreach optimizer default
    _dry_run.py         one dry run: the model, optimizer and batch built and stepped under
                        fake tensors, then analysed
    _results.py         Estimate, Remedy, Sweep: what a dry run predicts and how it scales
    _remedies.py        what would make a step that does not fit fit
"""
from __future__ import annotations

import os
from typing import Any, Callable

import torch

from .._format import parse_bytes
from ._dry_run import _accepts, _dry_run, default_loss
from ._remedies import _find_remedies
from ._results import Estimate, Remedy, Sweep, _by_phase, activation_peak

__all__ = ["Estimate", "Remedy", "Sweep", "activation_peak", "default_loss", "estimate"]


def estimate(make_model: Callable[..., torch.nn.Module],
             make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer],
             make_batch: Callable[..., Any], device: str = "cuda",
             capacity: int | str | None = "80GiB", dtype_policy: str | None = None,
             steps: int = 2, loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None,
             alloc_conf: str = "", *, batch_size: int | None = None, seq_len: int | None = None,
             remedies: bool = True, workspace_bytes: int | None = None,
             trace: str | os.PathLike[str] | None = None) -> Estimate:
    """Predicts the peak memory of a training step without running it on a device::

        est = rs.estimate(make_model, make_optimizer, make_batch, device="cuda",
                          capacity="80GiB", dtype_policy="bf16-autocast")
        est.fits, est.peak_allocated, est.peak_reserved, est.by_category, est.margin

    ``make_model()`` builds the model on the default device (no ``.to("cuda")`` needed; it is
    ignored), ``make_optimizer(model)`` its optimizer, ``make_batch()`` one batch, called with
    ``batch_size=``/``seq_len=`` when given and accepted. ``loss_fn(model, batch)`` defaults to
    cross-entropy of ``model(x)`` against ``y`` for an ``(x, y)`` batch. ``steps`` full training
    steps run (the first creates the optimizer state). ``dtype_policy``: None/"fp32", "bf16" or
    "fp16" (the model cast after construction), "bf16-autocast"/"fp16-autocast" (forward and
    loss under autocast). ``alloc_conf`` is a PYTORCH_CUDA_ALLOC_CONF string for the allocator
    model. ``trace`` keeps the dry run's trace. Nothing real is allocated; see docs/fit.md.
    """
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise ValueError(f"rs.estimate: device must be 'cuda' or 'cpu', got {device!r}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"rs.estimate: steps must be a positive int, got {steps!r}")
    cap = None
    if capacity is not None:
        try:
            cap = parse_bytes(capacity)
        except ValueError as exc:
            raise ValueError(f"rs.estimate: capacity: {exc}") from None
    base_batch: dict[str, Any] = {}
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
        if value is not None:
            if not _accepts(make_batch, name):
                raise ValueError(f"rs.estimate: {name}= given but make_batch does not accept it")
            base_batch[name] = value

    def run(batch_kwargs: dict[str, Any] | None = None, model_kwargs: dict[str, Any] | None = None,
            steps: int = steps, remedies: bool = remedies, trace_path: Any = None) -> Estimate:
        bk = {**base_batch, **(batch_kwargs or {})}
        mk = dict(model_kwargs or {})
        r = _dry_run(make_model, make_optimizer, make_batch, device=device, capacity=cap,
                     dtype_policy=dtype_policy, steps=steps, loss_fn=loss_fn,
                     alloc_conf=alloc_conf, batch_kwargs=bk, model_kwargs=mk,
                     workspace_bytes=workspace_bytes,
                     trace=str(trace_path) if trace_path is not None else None)
        est = Estimate(device=device, capacity=cap, peak_allocated=r.peak_allocated,
                       peak_reserved=r.peak_reserved,
                       by_category={k: v for k, v in r.report.peak["by_category"].items()},
                       by_phase=_by_phase(r.report), activation_peak=activation_peak(r.report),
                       report=r.report, params=r.params, allocator_stats=r.allocator_stats,
                       allocator_oom=(r.oom is not None) if (r.allocator_stats is not None
                                                             and cap) else None)
        est._rerun = lambda **kw: run(**{"batch_kwargs": bk, "model_kwargs": mk, **kw})
        if remedies and est.fits is False:
            _find_remedies(est, bk, mk, run, make_model, make_batch)
        return est

    return run(trace_path=trace)
