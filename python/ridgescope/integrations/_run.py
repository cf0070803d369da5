"""What every framework callback does, whatever the framework: one tracked run.

A callback calls ``start`` when training begins, ``open_phase``/``close_phase`` at the
framework's events, and ``finish`` when training ends; ``finish`` stops the session, analyses
the trace, writes the HTML report beside it (and TensorBoard scalars when asked) and returns
the figures for the framework's logs. Every event runs through ``TrackedRun.call``: an internal
error is reported once as a warning, tracking stops, and training goes on (design.md §7)."""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch

from .._errors import RidgescopeError
from .._flight import RUN_DEFAULT, KeepSteps, parse_keep_steps
from .._format import parse_bytes
from .._report import Report
from .._session import Session, active_session, oom_explanation, per_rank_path, phase

F = TypeVar("F", bound=Callable[..., Any])


def guarded_event(method: F) -> F:
    """A callback method run through its ``self._run.call`` (a plain function of the class, so
    the callback stays picklable for frameworks that send it to spawned ranks)."""
    @functools.wraps(method)
    def event(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self._run.call(method, self, *args, **kwargs)
    return event  # type: ignore[return-value]

TRACE_NAME = "ridgescope.rstrace"  # in the run's output directory; the HTML report goes beside it
LOG_PREFIX = "ridgescope"


def log_figures(data: dict[str, Any]) -> dict[str, int]:
    """The figures a framework's logs get from a report: the peak, its step, and its
    composition by category (all ten, in bytes)."""
    peak = data["peak"]
    out = {f"{LOG_PREFIX}/peak_bytes": int(peak["bytes"]),
           f"{LOG_PREFIX}/peak_step": int(peak["step"])}
    for category, value in peak["by_category"].items():
        out[f"{LOG_PREFIX}/peak/{category}"] = int(value)
    return out


def trace_path(directory: str | os.PathLike[str], rank: int, world_size: int) -> Path:
    """The trace file of this rank: ``ridgescope.rstrace`` in one process; under a launcher that
    says so in the environment (torchrun) the session's own per-rank name, else (a framework
    that spawned its ranks itself) ``ridgescope.rank<N>.rstrace``."""
    base = Path(directory) / TRACE_NAME
    if per_rank_path(base) != base or world_size <= 1:
        return base  # Session applies per_rank_path itself
    return base.with_name(f"{base.stem}.rank{rank}{base.suffix}")


_current: "TrackedRun | None" = None  # the run that started last (see ``start``)


class RunResults:
    """What a framework callback holding a TrackedRun (``self._run``) shows its user."""

    _run: "TrackedRun"

    @property
    def report(self) -> Any:
        """The ``rs.Report`` of the run, once training has ended (else None)."""
        return self._run.report

    @property
    def trace(self) -> Any:
        """The trace file (a ``pathlib.Path``) once tracking started."""
        return self._run.trace

    @property
    def error(self) -> str | None:
        """Why tracking stopped or never started, or None."""
        return self._run.error


class TrackedRun:
    """One run of a framework's trainer under ``rs.track``. ``tensorboard`` is False, True (the
    directory the framework gives to ``start``) or a directory; ``step_offset`` maps the
    report's step numbers to the framework's (docs/integrations.md)."""

    def __init__(self, *, dirpath: str | os.PathLike[str] | None, activations: bool | str,
                 capacity: int | str | None, tensorboard: bool | str | os.PathLike[str],
                 html: bool, step_offset: int, framework: str, keep_steps: KeepSteps = None) -> None:
        if keep_steps is not None:
            try:
                parse_keep_steps(keep_steps)
            except ValueError as exc:
                raise ValueError(f"RidgescopeCallback: {exc}") from None
        self.keep_steps = keep_steps
        if capacity is not None:
            try:
                parse_bytes(capacity)
            except ValueError as exc:
                raise ValueError(f"RidgescopeCallback: capacity: {exc}") from None
        if not isinstance(tensorboard, (bool, str, os.PathLike)):
            raise TypeError("RidgescopeCallback: tensorboard must be True, False or a directory, "
                            f"got {type(tensorboard).__name__}")
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.activations = activations
        self.capacity = capacity
        self.tensorboard = tensorboard
        self.html = html
        self.step_offset = step_offset
        self.framework = framework
        self.session: Session | None = None
        self.report: Report | None = None
        self.trace: Path | None = None
        self.html_path: Path | None = None
        self.tensorboard_dir: Path | None = None
        self.error: str | None = None
        self._phases: dict[str, contextlib.AbstractContextManager[None]] = {}
        self._finished = False

    # ------------------------------------------------------------------------------ guard
    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, with an internal error reported once and tracking stopped
        (then, and once tracking has stopped that way, it returns None)."""
        if self.error is not None:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # an internal error must never reach the training loop
            self._fail(f"{type(exc).__name__}: {exc}")
            return None

    def _fail(self, reason: str) -> None:
        self.error = reason
        warnings.warn(f"ridgescope ({self.framework} callback) stopped tracking after an internal "
                      f"error ({reason}); training continues.", RuntimeWarning, stacklevel=3)
        self._phases.clear()
        if self.session is not None and self.session.active:
            try:
                self.session.stop()
            except Exception:
                pass

    # ------------------------------------------------------------------------------ life
    @property
    def tracking(self) -> bool:
        return self.session is not None and self.session.active

    def start(self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None,
              directory: str | os.PathLike[str], rank: int = 0, world_size: int = 1,
              tensorboard_dir: str | os.PathLike[str] | None = None) -> bool:
        """Starts tracking. ``directory`` is the framework's output directory (``dirpath`` given
        to the callback wins). Returns False, with one warning, when another session is already
        tracking this process (``ridgescope run``, an enclosing ``rs.track``): that one sees the
        whole run, and sessions do not nest."""
        if self.session is not None:
            return self.tracking
        global _current
        stale = _current
        if stale is not None and stale is not self and stale.tracking:
            # A training that raised never reached its end event: trainings do not nest, so
            # the one beginning now closes what that one left open (its trace is kept).
            stale.call(stale.finish)
        running = active_session()
        if running is not None:
            self.error = f"a session is already tracking (writing {running.path})"
            print(f"ridgescope: {self.framework} callback: {self.error}; it records this run, so "
                  "the callback stands aside", file=sys.stderr)
            return False
        out_dir = self.dirpath if self.dirpath is not None else Path(directory)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.trace = trace_path(out_dir, rank, world_size)
        if self.tensorboard is True:
            self.tensorboard_dir = Path(tensorboard_dir if tensorboard_dir is not None else out_dir)
        elif self.tensorboard:
            self.tensorboard_dir = Path(self.tensorboard)  # type: ignore[arg-type]
        if self.tensorboard_dir is not None and world_size > 1:
            self.tensorboard_dir = self.tensorboard_dir / f"rank{rank}"  # one run per rank
        try:
            self.session = Session(model=model, optimizer=optimizer, out=self.trace,
                                   activations=self.activations, capacity=self.capacity,
                                   keep_steps=self.keep_steps, keep_steps_default=RUN_DEFAULT)
            self.session.start()
        except RidgescopeError as exc:
            self.error = str(exc)
            warnings.warn(f"ridgescope ({self.framework} callback) is not tracking: {exc}",
                          RuntimeWarning, stacklevel=3)
            self.session = None
            return False
        self.trace = self.session.path
        _current = self
        return True

    def open_phase(self, name: str) -> None:
        """Opens an explicit phase (``rs.phase``) that a later event closes."""
        if not self.tracking or name in self._phases:
            return
        cm = phase(name)
        cm.__enter__()
        self._phases[name] = cm

    def close_phase(self, name: str) -> None:
        cm = self._phases.pop(name, None)
        if cm is not None:
            cm.__exit__(None, None, None)

    def tag_batch(self, batch: Any) -> None:
        """The batch the framework hands the step is ``input`` (as the root module's arguments
        are), also when the step calls a submodule rather than the root."""
        if self.tracking and self.session is not None and self.session._instr is not None:
            self.session._instr.datasets.tag_batch(batch)

    def explain_oom(self, exception: BaseException) -> None:
        """After a training that raised ``exception`` ended tracking (``finish``): when it is an
        out-of-memory error the trace holds, say why on stderr and in a note on the exception.
        The note travels with it when the framework raises another error while tearing down
        (Lightning does after a failed data set-up), so the cause is still shown."""
        if not isinstance(exception, torch.OutOfMemoryError) or self.report is None:
            return
        text = oom_explanation(self.report.to_dict(), self.trace or Path(TRACE_NAME))
        if not text:
            return
        print(text, file=sys.stderr)
        add_note = getattr(exception, "add_note", None)  # Python 3.11+
        if add_note is not None:
            add_note(text)

    def finish(self) -> dict[str, int] | None:
        """Stops tracking, writes the HTML report (and TensorBoard scalars), and returns the
        figures for the framework's logs; None when nothing was tracked. Runs once."""
        if self._finished or self.session is None:
            return None
        self._finished = True
        for name in reversed(list(self._phases)):
            self.close_phase(name)
        self.session.stop()
        from .._reporters._html import HTML_TIMELINE_COLUMNS
        self.report = Report.from_trace(self.session.path, timeline_columns=HTML_TIMELINE_COLUMNS)
        if self.html:
            self.html_path = self.session.path.with_suffix(".html")
            self.report.to_html(self.html_path)
        if self.tensorboard_dir is not None:
            self.report.to_tensorboard(self.tensorboard_dir, step_offset=self.step_offset)
        print(f"ridgescope: {self.framework} run tracked: trace {self.session.path}"
              + (f", HTML report {self.html_path}" if self.html_path is not None else ""),
              file=sys.stderr)
        return log_figures(self.report.to_dict())
