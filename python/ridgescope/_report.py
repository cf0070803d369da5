"""``rs.Report``: the report of one run, built from a trace by the native analysis (the same
analysis and JSON a C++ trainer gets from ``Session::report()``). Reporters (text, JSON)
consume it; it never reads live native state. Schema: docs/report_schema.md."""
from __future__ import annotations

import copy
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

from . import _C
from ._errors import RidgescopeError, TraceFormatError
from ._snapshot import file_kind
from .distributed._section import add_distributed_section



class Report:
    """The memory report of one run. ``to_dict()`` is JSON-ready (docs/report_schema.md)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    @classmethod
    def from_trace(cls, path: str | os.PathLike[str], top_blocks: int = 20,
                   probe_time_ns: int | None = None, timeline_columns: int = 2000,
                   device: str | None = None) -> "Report":
        """Analyses a trace. ``probe_time_ns`` also records the state (live, reserved, the
        cache's free space) at that instant, nanoseconds since the session started.
        ``timeline_columns`` bounds the live-bytes-over-time series (``timeline``).
        ``device`` (``"cpu"``, ``"cuda:N"``): the device to report (default: the one whose live
        bytes peak highest)."""
        if timeline_columns < 1:
            raise ValueError(f"timeline_columns must be at least 1, got {timeline_columns}")
        from ._snapshot import _device_args
        try:
            text = _C.analyze(str(path), top_blocks, probe_time_ns, timeline_columns, **_device_args(device))
        except _C.TraceError as exc:
            raise TraceFormatError(str(exc)) from None
        return cls(add_distributed_section(json.loads(text)))

    @classmethod
    def from_snapshot(cls, path: str | os.PathLike[str], top_blocks: int = 20,
                      probe_time_ns: int | None = None, timeline_columns: int = 2000,
                      device_index: int | None = None, device: str | None = None,
                      rules: str | os.PathLike[str] | list | None = None) -> "Report":
        """Reads a ``torch.cuda.memory._snapshot()`` pickle (PyTorch's own, or ridgescope's
        export) with a restricted unpickler and analyses it like a trace. ``report.to_dict()
        ["snapshot"]`` says which categories and phases were inferred, why (``reasons``) and what
        every device held (``devices``; docs/snapshot.md). ``device`` (``"cuda:N"``, or
        ``device_index=N``): the device to report (default: the one whose live bytes peak
        highest). ``rules``: a .toml/.json file of category rules (or the rules as data),
        applied before the built-in inference."""
        from ._snapshot import analyze_snapshot, cuda_index
        from ._snapshot_rules import load_rules, rules_from_data
        if device is not None:
            index = cuda_index(device)
            if device_index is not None and device_index != index:
                raise RidgescopeError(f"device={device!r} and device_index={device_index} disagree")
            device_index = index
        if rules is not None and not isinstance(rules, (list, dict)):
            rules = load_rules(rules)
        elif isinstance(rules, (list, dict)):
            rules = rules_from_data(rules)
        return cls(analyze_snapshot(path, top_blocks, probe_time_ns, timeline_columns, device_index, rules))

    def to_snapshot(self, path: str | os.PathLike[str], device: str | None = None) -> dict[str, int]:
        """Writes the run as a ``torch.cuda.memory._snapshot()`` pickle that PyTorch's memory_viz
        reads, every allocation carrying its ridgescope category (docs/snapshot.md). Needs the
        report's source file (``trace.path``). Returns counts of what was written."""
        from ._snapshot import write_snapshot
        if device is None and self._data.get("snapshot"):  # a snapshot read device by device: that device
            device = self._data["device"] if self._data["device"].startswith("cuda:") else None
        return write_snapshot(self._data["trace"]["path"], path, device)

    # ------------------------------------------------------------------ data
    def to_dict(self) -> dict[str, Any]:
        """A deep copy of the report as plain JSON-ready data."""
        return copy.deepcopy(self._data)

    def to_json(self, path: str | os.PathLike[str] | None = None, indent: int | None = 2) -> str:
        """The report as JSON text; also written to ``path`` when given."""
        text = dumps_report(self._data, indent=indent)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    def to_html(self, path: str | os.PathLike[str] | None = None, library_frames: bool = False) -> str:
        """The report as one self-contained HTML page (docs/html-report.md); also written to
        ``path`` when given. For a finer chart, build the report with
        ``Report.from_trace(trace, timeline_columns=10000)`` as ``ridgescope report`` does.
        The flame graph folds library frames away (its checkbox shows them); ``library_frames``
        opens the page with them shown."""
        from ._reporters._html import render_html
        text = render_html(self._data, library_frames=library_frames)
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    def to_tensorboard(self, logdir: str | os.PathLike[str], step_offset: int = 0) -> dict[str, Any]:
        """Writes one TensorBoard scalar per step for the step's peak and for each category at
        that peak, into an event file in ``logdir`` (docs/integrations.md; needs the tensorboard
        package). ``step_offset`` shifts the step numbers. Returns what was written."""
        from ._reporters._tensorboard import write_tensorboard
        return write_tensorboard(self._data, logdir, step_offset)

    def _repr_html_(self) -> str:
        """A notebook shows the report as the page ``to_html`` writes, in a sandboxed frame."""
        from ._reporters._notebook import iframe
        return iframe(self.to_html())

    def summary(self) -> str:
        """A short, plain-language text report."""
        from ._reporters._text import render_text
        return render_text(self._data)

    def grouped(self, by: str, limit: int = 20, library_frames: bool = False) -> str:
        """The peak's live bytes by allocation ``"site"`` or ``"stack"``, largest first, with
        their categories, after the report's opening (``ridgescope report --group-by``). A
        stack shows its site and the user's frames above it, library frames folded away;
        ``library_frames`` prints every frame (``--library-frames``)."""
        if by not in ("site", "stack"):
            raise ValueError(f"group by 'site' or 'stack', not {by!r}")
        from ._reporters._text import render_grouped
        return render_grouped(self._data, by, limit, library_frames=library_frames)

    def __str__(self) -> str:
        return self.summary()

    # ------------------------------------------------------------------ convenience
    @property
    def peak_bytes(self) -> int:
        return self._data["peak"]["bytes"]

    @property
    def peak(self) -> dict[str, Any]:
        return self._data["peak"]

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self._data["steps"]

    @property
    def warnings(self) -> list[dict[str, Any]]:
        return self._data["warnings"]

    def phases(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every phase instance in order, optionally only those called ``name``."""
        return [p for s in self._data["steps"] for p in s["phases"]
                if name is None or p["phase"] == name]


def dumps_report(data: Any, indent: int | None = 2) -> str:
    """A report as JSON text, indented for people except the per-step rows of ``at_a_glance``
    (and of the merged report's ``step_summaries``), which stay one line each: a long run has
    one row per step, and indenting every number of it would triple the file."""
    if indent is None:
        return json.dumps(data)
    rows: list[str] = []
    # Each row is serialized compactly and stands in the indented text as a placeholder string
    # with a random tag, which no string of the report (labels come from traces) can match.
    tag = secrets.token_hex(16)

    def compact(obj: Any) -> Any:
        rows.append(json.dumps(obj, separators=(",", ":")))
        return f"{tag}:{len(rows) - 1}"

    shallow = dict(data)
    glance = shallow.get("at_a_glance")
    if isinstance(glance, dict) and isinstance(glance.get("rows"), list):
        shallow["at_a_glance"] = dict(glance, rows=[compact(r) for r in glance["rows"]])
    ranks = shallow.get("ranks")
    if isinstance(ranks, dict) and isinstance(ranks.get("step_summaries"), dict):
        shallow["ranks"] = dict(ranks, step_summaries={
            k: {name: compact(v) if isinstance(v, list) else v for name, v in s.items()}
            if isinstance(s, dict) else s
            for k, s in ranks["step_summaries"].items()})
    text = json.dumps(shallow, indent=indent)
    return re.sub(f'"{tag}:(\\d+)"', lambda m: rows[int(m.group(1))], text)


def load(path: str | os.PathLike[str], **analysis_options: Any) -> Report:
    """Reads a ridgescope trace file, or a torch memory snapshot pickle (docs/snapshot.md), into
    a Report. Raises TraceFormatError naming the problem for anything else.
    ``analysis_options`` go to ``Report.from_trace`` (or ``Report.from_snapshot``), e.g.
    ``device="cuda:1"`` (both) and ``rules="rules.toml"`` (snapshots)."""
    p = Path(path)
    kind = file_kind(p)
    if kind == "trace":
        if analysis_options.get("rules") is not None:
            raise RidgescopeError("category rules apply to torch memory snapshots PyTorch wrote, not to "
                                  f"ridgescope traces ({p})")
        analysis_options.pop("rules", None)
        return Report.from_trace(p, **analysis_options)
    if kind == "pickle":  # a torch memory snapshot pickle (restricted unpickler)
        return Report.from_snapshot(p, **analysis_options)
    raise TraceFormatError(f"{p} is not a ridgescope trace (bad magic at byte offset 0)")
