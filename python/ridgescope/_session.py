"""Tracking sessions: ``rs.track(...)`` and ``rs.phase(...)`` (design.md §9)."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from . import _C
from ._code_roots import _code_roots
from ._errors import RidgescopeError
from ._flight import TRACK_DEFAULT, KeepSteps, resolve_keep_steps
from ._format import parse_bytes
from ._instrument import Instrumentation
from ._report import Report
from ._saved_hooks import hook_steps
from ._signals import SignalFlush, forget_at_exit, stop_at_exit

_active_lock = threading.Lock()
_active: "Session | None" = None

# What each allocation's site holds (docs/sites.md): the site alone (default), the whole Python
# stack, native frames too; None records no site.
STACK_MODES = tuple(m for m in _C.STACK_MODES if m != "none")


def _configure_sites() -> str:
    """Installs the Python frame walker for this session's sites; '' or why frames are not read."""
    try:
        library, stdlib = _code_roots()
        return _C.configure_python_frames(library, stdlib)
    except Exception as exc:  # sites are an aid: a failure here never stops tracking
        return f"{type(exc).__name__}: {exc}"


def per_rank_path(out: Path, environ: "dict[str, str] | None" = None) -> Path:
    """The trace path of this process. Under torchrun (or any launcher that sets WORLD_SIZE and
    RANK), every rank runs the same code with the same path: one shared file would be written
    by all of them at once, so each rank gets its own ('{rank}' in the name becomes the
    rank; otherwise '.rank<N>' goes before the suffix: run.rank3.rstrace)."""
    env = os.environ if environ is None else environ
    try:
        world = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", env.get("LOCAL_RANK", "0")))
    except ValueError:
        return out
    if "{rank}" in out.name:
        return out.with_name(out.name.replace("{rank}", str(rank)))
    if world <= 1:
        return out
    return out.with_name(f"{out.stem}.rank{rank}{out.suffix or '.rstrace'}")


def _default_trace_path() -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.gettempdir()) / f"ridgescope-{os.getpid()}-{stamp}.rstrace"


WRITER_ENV = "RIDGESCOPE_WRITER"


def _idle_writer() -> bool:
    """Whether the trace writer thread runs at the idle scheduling class, taking only CPU time
    the training threads leave (docs/long-runs.md): when $RIDGESCOPE_WRITER says ``idle``;
    ``normal`` (the default) keeps it at the normal class."""
    value = os.environ.get(WRITER_ENV, "normal").strip().lower() or "normal"
    if value not in ("idle", "normal"):
        raise RidgescopeError(f"${WRITER_ENV} must be 'idle' or 'normal', got {value!r}")
    return value == "idle"


class Session:
    """One tracking session. Create it with :func:`track`; read it with :meth:`report`."""

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None,
                 out: str | os.PathLike[str] | None = None, *, activations: bool | str = True,
                 capacity: int | str | None = None, driver_view: bool | None = None,
                 cuda: bool | None = None, stacks: str | None = "site", cupti: bool | None = None,
                 host_memory: bool = True, keep_steps: KeepSteps = None,
                 keep_steps_default: KeepSteps = TRACK_DEFAULT) -> None:
        if stacks is not None and stacks not in STACK_MODES:
            raise ValueError(f"ridgescope.track: stacks must be one of {', '.join(map(repr, STACK_MODES))} "
                             f"or None, got {stacks!r}")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"ridgescope.track: model must be a torch.nn.Module, got "
                            f"{type(model).__module__}.{type(model).__qualname__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"ridgescope.track: optimizer must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__module__}.{type(optimizer).__qualname__}")
        self.model = model
        self.optimizer = optimizer
        self.path = per_rank_path(Path(out)) if out is not None else _default_trace_path()
        try:
            self.capacity = parse_bytes(capacity) if capacity is not None else None
        except ValueError as exc:
            raise ValueError(f"ridgescope.track: capacity: {exc}") from None
        try:
            # 0: every step's events; else the last N (docs/long-runs.md)
            self.keep_steps = resolve_keep_steps(keep_steps, keep_steps_default)
        except ValueError as exc:
            raise ValueError(f"ridgescope.track: {exc}") from None
        try:
            self._hook_steps = hook_steps(activations)  # validates
        except ValueError as exc:
            raise ValueError(f"ridgescope.track: {exc}") from None
        self._activations = activations
        self.stacks = stacks
        self._signals: SignalFlush | None = None
        # Why Python frames are not read for sites ("" when they are); set at start.
        self.sites_status: str | None = None
        # NVML sampling: on by default where CUDA is, and asked for explicitly elsewhere.
        self._driver_view = torch.cuda.is_available() if driver_view is None else driver_view
        self._cuda = cuda
        # The CUDA source: None = not started; "" = CUDA blocks tracked; else why not.
        self.cuda_status: str | None = None
        # The CUPTI source (memory outside PyTorch, docs/gpu.md): None = not started; "" =
        # itemised; else why not. Started with the CUDA source unless cupti=False.
        self._cupti = cupti
        self.cupti_status: str | None = None
        self._host_memory = host_memory
        self._native: Any = None
        self._instr: Instrumentation | None = None
        self._report: Report | None = None

    # --------------------------------------------------------------------------- lifecycle
    def start(self) -> "Session":
        global _active
        with _active_lock:
            if _active is not None:
                raise RidgescopeError(
                    f"a ridgescope session is already tracking (writing {_active.path}); "
                    "sessions do not nest: leave the running `with rs.track(...)` first")
            parent = self.path.parent if str(self.path.parent) else Path(".")
            if not parent.is_dir():
                raise RidgescopeError(f"cannot write the trace to {self.path}: "
                                      f"directory {parent} does not exist")
            mode = self.stacks or "none"
            self.sites_status = _configure_sites() if mode != "none" else ""
            idle_writer = _idle_writer()
            try:
                # A bounded trace keeps the hook's steps: its analysis learns their savers.
                self._native = _C.Session(str(self.path), self.capacity or 0, mode, self.keep_steps,
                                          host_memory=self._host_memory, idle_writer=idle_writer,
                                          keep_first_steps=self._hook_steps or 0)
            except RuntimeError as exc:
                raise RidgescopeError(str(exc).removeprefix("ridgescope: ")) from None
            _active = self
            sites = {"mode": mode, "python_frames": mode != "none" and not self.sites_status,
                     "reason": self.sites_status}
            if mode != "none":  # the directories the capture took as library code (docs/sites.md)
                try:
                    sites["library_roots"], sites["stdlib_roots"] = _code_roots()
                except Exception:  # an aid, never a reason to stop tracking
                    pass
            self._native.metadata("sites", json.dumps(sites))
        try:
            self._instr = Instrumentation(self._native, self.model, self.optimizer,
                                          activations=self._activations)
            if self.capacity:
                self._instr.run_extra["device_capacity_bytes"] = self.capacity
            if self._wants_cuda():
                self._start_cuda()
            elif self._cuda is None and torch.cuda.is_available():
                # No CUDA yet: start the CUDA source when the root module turns out to be on a GPU.
                self._instr.on_cuda_module = self._start_cuda
            self._instr._describe()
            if self._driver_view:
                self._native.start_driver_view(100)
            self._instr.register_existing()
            self._instr.install()
            # SIGTERM, SIGINT and SIGUSR1 flush the trace; exit stops a session left running.
            self._signals = SignalFlush(self.flush, self.stop)
            self._signals.install()
            stop_at_exit(self.stop)
        except Exception as exc:  # never leave a half-installed session behind
            self._teardown()
            raise RidgescopeError(f"could not start tracking: {exc}") from exc
        return self

    # ------------------------------------------------------------------------------- CUDA
    def _wants_cuda(self) -> bool:
        """Whether CUDA memory is tracked: when asked, or (by default) when CUDA is available and
        already in use or the model or optimizer holds a CUDA tensor (a CPU-only run never pays
        for initialising CUDA)."""
        if self._cuda is False:
            return False
        if self._cuda is True:
            if not torch.cuda.is_available():
                raise RidgescopeError("cuda=True, but torch sees no CUDA device")
            return True
        if not torch.cuda.is_available():
            return False
        if torch.cuda.is_initialized():
            return True
        tensors: list[torch.Tensor] = []
        if self.model is not None:
            tensors += list(self.model.parameters()) + list(self.model.buffers())
        if self.optimizer is not None:
            tensors += [p for g in self.optimizer.param_groups for p in g["params"]]
        return any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors)

    def _start_cuda(self) -> None:
        """Starts the CUDA caching-allocator source (docs/gpu.md): every block of every CUDA
        device from now on, and the blocks that exist now (adopted from the allocator's
        snapshot). An unsupported backend (cudaMallocAsync) is reported, not fatal."""
        if self.cuda_status is not None or self._native is None:
            return
        torch.cuda.init()
        self.cuda_status = self._native.start_cuda()
        if self.cuda_status:
            print(f"ridgescope: CUDA memory is not tracked block by block: {self.cuda_status}",
                  file=sys.stderr)
        if self._cupti is not False:
            # Memory outside PyTorch, by library (one warning when CUPTI is missing or refused;
            # the report says the layer is not itemised).
            self.cupti_status = self._native.start_cupti()
            if self.cupti_status:
                print(f"ridgescope: {self.cupti_status}", file=sys.stderr)
        if self._instr is not None and not self.capacity:
            device = torch.cuda.current_device()
            total = torch.cuda.get_device_properties(device).total_memory
            fraction = 1.0
            get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
            if get_fraction is not None:
                try:
                    fraction = float(get_fraction(device))
                except Exception:  # older torch, or no fraction set
                    fraction = 1.0
            self._instr.run_extra["device_capacity_bytes"] = int(total * min(fraction, 1.0))

    def stop(self) -> None:
        """Stops recording and closes the trace. Safe to call twice."""
        self._teardown()

    def _teardown(self) -> None:
        global _active
        if self._signals is not None:
            self._signals.remove()
            self._signals = None
        forget_at_exit(self.stop)
        if self._instr is not None:
            if self.active and not self._instr.failed:  # models made since the last step
                self._instr._guard(self._instr.discover_models)()
            self._instr.remove()
        if self._native is not None:
            if self._native.active:
                # ridgescope's own cost, bounded and reported (design.md §7)
                self._native.metadata("session", json.dumps(dict(self._native.stats())))
            self._native.stop()
            if self._instr is not None:
                self._instr.check_native()
        with _active_lock:
            if _active is self:
                _active = None

    def __enter__(self) -> "Session":
        return self.start() if self._native is None else self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop()
        if exc_type is not None and issubclass(exc_type, torch.OutOfMemoryError):
            self._explain_oom()

    def _explain_oom(self) -> None:
        """An out-of-memory error left the tracked block: say why, in plain language, before the
        exception reaches the caller (the trace already holds the failure)."""
        try:
            text = oom_explanation(self.report().to_dict(), self.path)
            if text:
                print(text, file=sys.stderr)
        except Exception:  # explaining must never replace the user's exception
            pass

    # --------------------------------------------------------------------------- queries
    @property
    def active(self) -> bool:
        return self._native is not None and self._native.active

    @property
    def error(self) -> str | None:
        """Why recording stopped early, or None."""
        if self._instr is not None and self._instr.error:
            return self._instr.error
        return self._native.error or None if self._native is not None else None

    def stats(self) -> dict[str, int]:
        """The recorder's own figures: events, bytes written, its peak buffer bytes."""
        return dict(self._native.stats()) if self._native is not None else {}

    def flush(self) -> None:
        """Writes everything recorded so far to the trace file (it is also written every
        100 ms in the background, so a killed process leaves a readable trace)."""
        if self._native is not None and self.active:
            self._native.flush()

    def report(self, top_blocks: int = 20) -> Report:
        """The report of this session (stops it first if it is still running)."""
        if self.active:
            self.stop()
        if self._report is None or top_blocks != 20:
            self._report = Report.from_trace(self.path, top_blocks=top_blocks)
        return self._report

    def _mark(self, name: str) -> None:
        """rs.mark(name) (_flight.py): a named moment, whose step the trace keeps."""
        if self._instr is not None and self.active and not self._instr.failed:
            self._instr._guard(self._native.mark)(self._instr.label(name))

    def mark_step(self) -> None:
        """Counts a training step explicitly (for loops without a torch optimizer)."""
        if self._instr is not None and self.active:
            self._instr._guard(self._instr.discover_models)()
            self._instr.mark_step()

    def _begin_explicit(self, name: str) -> bool:
        if self._instr is None or not self.active or self._instr.failed:
            return False
        return self._instr._guard(self._instr.begin_phase)(name, True) is True

    def _end_explicit(self, name: str) -> None:
        if self._instr is not None and self.active:
            self._instr._guard(self._instr.end_phase)(name)


def oom_explanation(data: dict[str, Any], path: Path) -> str | None:
    """The last out-of-memory error of a report in plain language (what failed, what was live
    and why, what to change), or None when the report has none."""
    from ._reporters._text import render_oom
    if not data["ooms"]:
        return None
    lines = ["ridgescope: out of memory; what was live and why:"]
    lines += render_oom(data["ooms"][-1])
    lines.append(f"  (details: ridgescope explain {path})")
    return "\n".join(lines)


def track(model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
          out: str | os.PathLike[str] | None = None, *, activations: bool | str = True,
          capacity: int | str | None = None, driver_view: bool | None = None,
          cuda: bool | None = None, stacks: str | None = "site", cupti: bool | None = None,
          host_memory: bool = True, keep_steps: KeepSteps = None) -> Session:
    """Tracks memory while the ``with`` block runs::

        with rs.track(model=model, optimizer=opt, out="run.rstrace") as session:
            ...  # the training loop, unchanged
        print(session.report().summary())

    ``model`` and ``optimizer`` are optional; with them, parameters, gradients and optimizer
    state carry their names. ``out`` is the trace file (default: a file in the temp
    directory); under torchrun (WORLD_SIZE > 1) each rank writes its own, with ``{rank}`` in
    the name replaced by the rank, or else ``.rank<N>`` put before the suffix.
    ``activations=True`` (the default) tags every tensor autograd saves in the first two steps
    through the saved-tensor hook, whose cost inside torch is a few microseconds per saved
    tensor, and then takes the hook off: later steps' activations are found from their
    lifetimes and labelled with the module the hook named as their saver in those steps
    (docs/categories.md); ``activations="every_step"`` keeps the hook on for every step;
    ``activations=False`` never installs it (activations from lifetimes, labelled by the module
    that made them). ``capacity`` ("2GiB", or bytes) simulates
    a device of that size on the CPU: an allocation past it raises ``torch.OutOfMemoryError``
    as a GPU would, after the trace has recorded the failed request and what was live.
    ``driver_view`` samples device memory with NVML every 100 ms (default: when CUDA is
    available); where NVML is absent the report says so and nothing else changes. ``cuda``
    tracks every CUDA caching-allocator block (docs/gpu.md); by default it is on when CUDA is
    already in use or the model or optimizer holds CUDA tensors, and otherwise starts when the
    root module turns out to be on a GPU. ``stacks`` says where each allocation was made
    (docs/sites.md): ``"site"`` (the default) records the innermost frame of your code
    (file:line and function, skipping torch, ridgescope and the standard library) or, in
    backward, the autograd node and its module; ``"python"`` the whole Python stack;
    ``"all"`` native frames too (slow: for a few steps); ``None`` nothing. ``cupti`` (on by
    default wherever CUDA is tracked) itemises device memory allocated outside PyTorch (NCCL,
    cuBLAS, any library's cudaMalloc or cuMem* calls) with CUPTI, by library, for the report's
    device ledger (docs/gpu.md); CUPTI takes one subscriber, so pass ``cupti=False`` to run
    torch.profiler or Nsight inside the block. ``host_memory`` (on by default) reads the
    process's resident set at every phase end and splits it into PyTorch's CPU tensors,
    the C allocator's slack and everything else (docs/forensics.md). ``keep_steps``
    bounds the trace for long runs (docs/long-runs.md): a summary of every step, and the events
    of only the last ``keep_steps`` steps, the highest-peak step and the steps around OOMs,
    warnings and ``rs.mark()`` calls; ``"all"`` (the default here, unless the environment
    variable ``RIDGESCOPE_KEEP_STEPS`` says otherwise) keeps every step's events. SIGTERM,
    SIGINT and SIGUSR1 flush the trace while a session runs (their handlers chain to the ones
    before). Raises
    RidgescopeError for a nested session or an unwritable path, TypeError for a model or
    optimizer of the wrong type, ValueError for an unknown ``stacks``, ``activations`` or a bad
    ``keep_steps``.
    """
    return Session(model, optimizer, out, activations=activations, capacity=capacity,
                   driver_view=driver_view, cuda=cuda, stacks=stacks, cupti=cupti,
                   host_memory=host_memory, keep_steps=keep_steps)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Marks an explicit phase (``"checkpoint"``, ``"data"``, or a name of your own). Phases
    nest, and an explicit phase wins over the automatic one of the same name. Outside a
    tracking session this does nothing, so the same code runs untracked."""
    if not isinstance(name, str) or not name:
        raise TypeError("ridgescope.phase: name must be a non-empty string")
    session = _active
    opened = session is not None and session._begin_explicit(name)
    try:
        yield
    finally:
        if opened and session is not None:
            session._end_explicit(name)


def active_session() -> Session | None:
    """The session tracking now, or None."""
    return _active


def mark(name: str) -> None:
    """Names this moment of the run (``rs.mark("eval")``, ``rs.mark("checkpoint 5")``): the
    trace keeps the events of its step, the step before and the step after, whatever
    ``keep_steps`` is (docs/long-runs.md), and the report lists the step among those that
    stand out. Outside a tracking session this does nothing."""
    if not isinstance(name, str) or not name:
        raise TypeError("ridgescope.mark: name must be a non-empty string")
    session = _active
    if session is not None:
        session._mark(name)
