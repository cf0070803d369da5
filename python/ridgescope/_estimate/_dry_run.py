"""One dry run: the model, optimizer and batch built under ``FakeTensorMode``, full training
steps run with the same instrumentation as a tracked run writing into a trace through the dry
native, and the trace analysed by the normal analysis (a ``Report``)."""
from __future__ import annotations

import contextlib
import inspect
import os
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from .._errors import RidgescopeError
from .._report import Report
from ._cuda_costs import _new_allocator_model, cublas_workspace_bytes
from ._cuda_emulation import (_CudaAutocastFp32, _CudaOnCpu, _cuda_optimizer_defaults,
                              _device_free_module_moves)
from ._dry_native import _DryNative, _StorageWatcher

DTYPE_POLICIES = (None, "fp32", "bf16", "fp16", "bf16-autocast", "fp16-autocast")


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return name in sig.parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())


def default_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """The loss when none is given: ``(inputs, targets)`` -> cross-entropy of the model's
    output over its last dimension; a dict -> ``model(**batch)`` (its ``loss`` or ``[0]``);
    a tensor -> ``model(batch)``. A 0-dim output is taken as the loss, else its sum."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        x, y = batch
        out = model(x)
        if isinstance(out, torch.Tensor) and out.dim() > 0 and isinstance(y, torch.Tensor):
            if y.is_floating_point():
                return torch.nn.functional.mse_loss(out, y)
            return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    elif isinstance(batch, dict):
        out = model(**batch)
    elif isinstance(batch, (tuple, list)):
        out = model(*batch)
    else:
        out = model(batch)
    if isinstance(out, dict):
        out = out.get("loss", next(iter(out.values())))
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out if out.dim() == 0 else out.float().sum()



@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    """Builds a 16-bit model directly in its dtype (no float32 copy first)."""
    if dtype is None:
        yield
        return
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)



@contextlib.contextmanager
def _host_rng_states(native: "_DryNative", enabled: bool) -> Iterator[None]:
    """On a CPU target: the CPU generator's state that ``torch.utils.checkpoint`` saves per
    checkpointed call (``preserve_rng_state``; 5,056 bytes for the default Mersenne-Twister
    generator) and that ``torch.random.fork_rng`` saves around each recomputation. The
    generator makes it directly, not through an op, so neither fake tensors nor the dispatch
    mode see it; a tracked CPU run does. Registered here as a new storage (it is a real tensor
    of that size; its free is seen as any other's). On a CUDA target it is host memory and is
    not counted."""
    if not enabled:
        yield
        return
    orig = torch.get_rng_state

    def get_rng_state() -> torch.Tensor:
        state = orig()
        native.on_storage(state.untyped_storage())
        return state

    torch.get_rng_state = get_rng_state  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.get_rng_state = orig  # type: ignore[assignment]



@dataclass
class _Run:
    report: Report
    peak_allocated: int
    peak_reserved: int | None
    allocator_stats: dict[str, Any] | None
    oom: dict[str, Any] | None
    params: dict[str, Any]


def _dry_run(make_model: Callable[..., Any], make_optimizer: Callable[..., Any],
             make_batch: Callable[..., Any], *, device: str, capacity: int | None,
             dtype_policy: str | None, steps: int, loss_fn: Callable[..., Any] | None,
             alloc_conf: str, batch_kwargs: dict[str, Any], model_kwargs: dict[str, Any],
             workspace_bytes: int | None, trace: str | None) -> _Run:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from .. import _session
    from .._instrument import Instrumentation

    if _session.active_session() is not None:
        raise RidgescopeError("rs.estimate cannot run inside rs.track (the dry run installs "
                              "the same hooks); call it outside the tracked block")
    if dtype_policy not in DTYPE_POLICIES:
        raise ValueError(f"rs.estimate: unknown dtype_policy {dtype_policy!r} "
                         f"(one of {', '.join(str(p) for p in DTYPE_POLICIES)})")
    cuda = device.startswith("cuda")
    allocator = _new_allocator_model(alloc_conf, None) if cuda else None
    limited = (_new_allocator_model(alloc_conf, capacity)
               if allocator is not None and capacity else None)
    tmp = None
    if trace is None:
        fd, tmp = tempfile.mkstemp(prefix="ridgescope-fit-", suffix=".rstrace")
        os.close(fd)
        trace = tmp
    native = _DryNative(trace, cuda, allocator, limited,
                        cublas_workspace_bytes() if workspace_bytes is None else workspace_bytes)
    low = {"bf16": torch.bfloat16, "fp16": torch.float16, "bf16-autocast": torch.bfloat16,
           "fp16-autocast": torch.float16}.get(dtype_policy or "")
    autocast = dtype_policy is not None and dtype_policy.endswith("-autocast")
    loss_fn = loss_fn or default_loss
    watcher = _StorageWatcher(native)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    instr = None
    try:
        with warnings.catch_warnings(), fake, watcher, _cuda_optimizer_defaults(cuda), \
                (_CudaOnCpu() if cuda else contextlib.nullcontext()), \
                contextlib.ExitStack() as stack:
            # the instrumentation reads fake storages' (null) data pointers as cache keys
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            # Built before the session starts, as in a tracked run: its parameters and
            # buffers are registered below, construction temporaries are not part of a step.
            watcher.enabled = False
            with _device_free_module_moves(), torch.device("cpu"), \
                    _default_dtype(low if not autocast else None):
                model = make_model(**model_kwargs)
                if low is not None and not autocast:
                    model.to(low)
            optimizer = make_optimizer(model)
            instr = Instrumentation(native, model, optimizer, activations="every_step",
                                    other_models=False)  # the callables' model only
            instr.run_extra.update({"dry_run": True, "target_device": device,
                                    "dtype_policy": dtype_policy or "fp32"})
            if capacity:
                instr.run_extra["device_capacity_bytes"] = capacity
            instr._describe()
            instr.register_existing()
            watcher.enabled = True
            instr.install()
            watcher.host_scalars = True
            stack.enter_context(_host_rng_states(native, not cuda))
            amp = (torch.autocast("cpu", dtype=low) if autocast else contextlib.nullcontext())
            up = _CudaAutocastFp32(low) if (autocast and cuda) else contextlib.nullcontext()
            for _ in range(steps):
                optimizer.zero_grad(set_to_none=True)
                with _device_free_module_moves():
                    batch = make_batch(**batch_kwargs)
                with amp, up:
                    loss = loss_fn(model, batch)
                loss.backward()
                optimizer.step()
                if instr.failed:
                    raise RidgescopeError(f"the dry run failed: {instr.error}")
            instr.remove()
    except BaseException as exc:
        if instr is not None:
            instr.remove()
        native.close(check=False)
        if tmp is not None:
            os.unlink(tmp)
        if isinstance(exc, RidgescopeError) or not isinstance(exc, Exception):
            raise
        raise RidgescopeError(
            f"the dry run failed: {type(exc).__name__}: {exc} (the callables must run under "
            "fake tensors: no .item(), .tolist(), data-dependent shapes or real data; build "
            "tensors on the default device, see docs/fit.md)") from exc
    native.close()
    try:
        report = Report.from_trace(trace)
    finally:
        if tmp is not None:
            os.unlink(tmp)
    stats = None
    reserved: int | None = None
    if not cuda:
        reserved = report.peak_bytes  # on the CPU, allocated is reserved
    elif allocator is not None:
        stats = dict(allocator.stats())
        reserved = int(stats["peak_reserved_bytes"])
        if limited is not None and native.oom is None:
            # it fits: torch's release-and-retry may have kept reserved lower
            stats["with_capacity"] = dict(limited.stats())
            reserved = int(limited.stats()["peak_reserved_bytes"])
    return _Run(report, report.peak_bytes, reserved, stats, native.oom,
                {**batch_kwargs, **model_kwargs})
