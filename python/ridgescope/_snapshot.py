"""Torch memory snapshots (``torch.cuda.memory._snapshot()`` pickles): export a ridgescope
trace as one, and read one (also one PyTorch wrote) into a report. The work is native
(ridgescope/snapshot.h); the pickle is never given to Python's ``pickle`` module, which could
run code from it. Format and limits: docs/snapshot.md."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from . import _C
from ._errors import RidgescopeError, TraceFormatError

TRACE_MAGIC = _C.TRACE_MAGIC  # include/ridgescope/trace_format.h kFileMagic
PICKLE_FIRST_BYTE = b"\x80"


def file_kind(path: str | os.PathLike[str]) -> str:
    """``"trace"``, ``"pickle"`` or ``"other"``, from the first bytes; TraceFormatError when the
    file cannot be read."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise TraceFormatError(f"cannot read {p}: {exc.strerror}") from None
    if head == TRACE_MAGIC:
        return "trace"
    if head[:1] == PICKLE_FIRST_BYTE:
        return "pickle"
    return "other"


def analyze_snapshot(path: str | os.PathLike[str], top_blocks: int = 20,
                     probe_time_ns: int | None = None, timeline_columns: int = 2000,
                     device_index: int | None = None,
                     rules: list[tuple[str, str, str, str]] | None = None) -> dict[str, Any]:
    """The report (as data) of a snapshot pickle; TraceFormatError for a file that is not one.
    ``device_index``: the CUDA device to report (default: the one whose live bytes peak
    highest); ``rules``: user category rules (``_snapshot_rules.load_rules``)."""
    if timeline_columns < 1:
        raise ValueError(f"timeline_columns must be at least 1, got {timeline_columns}")
    file_kind(path)  # the same clear error for a missing or unreadable file
    try:
        text = _C.analyze_snapshot(str(path), top_blocks, probe_time_ns, timeline_columns, device_index,
                                   list(rules or []))
    except _C.TraceError as exc:
        raise TraceFormatError(str(exc)) from None
    return json.loads(text)


def cuda_index(device: str | int | None) -> int | None:
    """The CUDA ordinal of ``"cuda:N"`` (or ``N``); RidgescopeError for anything else (a
    snapshot holds CUDA devices only)."""
    if device is None or (isinstance(device, int) and not isinstance(device, bool) and device >= 0):
        return device
    if isinstance(device, str) and device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    raise RidgescopeError(f"a snapshot's device is 'cuda:N', got {device!r}")


def _device_args(device: str | None) -> dict[str, Any]:
    if device is None:
        return {}
    if device == "cpu":
        return {"cpu": True}
    if device.startswith("cuda:") and device[5:].isdigit():
        return {"cuda_device": int(device[5:])}
    raise RidgescopeError(f"device must be 'cpu' or 'cuda:N', got {device!r}")


@contextlib.contextmanager
def replayed_trace(source: str | os.PathLike[str],
                   device_index: int | None = None) -> Iterator[tuple[Path, str]]:
    """A snapshot pickle replayed as a temporary ridgescope trace (removed afterwards), with
    the snapshot's ``PYTORCH_CUDA_ALLOC_CONF`` ("" when it records none). ``device_index``: the
    CUDA device (default: the one whose live bytes peak highest). TraceFormatError for a file
    that is not a usable snapshot."""
    fd, temp = tempfile.mkstemp(prefix="ridgescope-snapshot-", suffix=".rstrace")
    os.close(fd)
    try:
        try:
            conf = _C.snapshot_to_trace(str(source), temp, device_index)
        except _C.TraceError as exc:
            raise TraceFormatError(str(exc)) from None
        yield Path(temp), conf or ""
    finally:
        os.unlink(temp)


def write_snapshot(source: str | os.PathLike[str], out: str | os.PathLike[str],
                   device: str | None = None) -> dict[str, int]:
    """Writes ``source`` (a ridgescope trace, or a snapshot pickle, which is replayed first) as a
    ``torch.cuda.memory._snapshot()`` pickle at ``out``. ``device``: ``"cpu"`` or ``"cuda:N"``
    (default: every CUDA device of the trace, else the CPU). Returns counts (entries,
    allocations, segments, annotations, bytes)."""
    kind = file_kind(source)
    args = _device_args(device)
    if kind == "other":
        raise TraceFormatError(f"{source} is neither a ridgescope trace nor a torch memory snapshot "
                               "(bad magic at byte offset 0)")
    try:
        if kind == "trace":
            return dict(_C.write_snapshot(str(source), str(out), **args))
        index = cuda_index(device) if device and device.startswith("cuda:") else None
        with replayed_trace(source, index) as (temp, _conf):  # that device, else the highest peak
            return dict(_C.write_snapshot(str(temp), str(out), **args))
    except _C.TraceError as exc:
        raise TraceFormatError(str(exc)) from None
    except RuntimeError as exc:  # the output cannot be written
        raise RidgescopeError(str(exc)) from None
