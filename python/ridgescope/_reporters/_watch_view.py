"""What ``ridgescope watch`` shows of running jobs (docs/long-runs.md): for each trace, the step
and phase it is in, its live bytes by category now, and the per-step peaks so far; for several
rank traces, one row per rank with the highest marked. Drawn with ``rich`` on a terminal, or as
plain lines (one per new step of each trace) elsewhere. The state comes from ``_C.TraceFollower``,
which reads each trace as it grows."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _C
from .._format import format_bytes
from ._glance_text import sparkline

RECENT_STEPS = 64  # per-step peaks kept for the sparkline and the table
_RANK = re.compile(r"rank[-_.]?(\d+)")


@dataclass
class Watched:
    """One trace being followed."""
    path: Path
    follower: Any = None
    view: dict[str, Any] = field(default_factory=dict)
    steps: int = 0                 # summaries seen (complete steps)
    recent: list[dict[str, Any]] = field(default_factory=list)  # the last RECENT_STEPS summaries
    max_peak: int = 0
    max_step: int | None = None
    printed: int = -1              # the last step printed (plain mode)
    consumed: int = 0              # summaries read from the follower
    rewrites: int = 0              # rewrites of the file seen

    @property
    def rank(self) -> str:
        m = _RANK.search(self.path.name)
        return m.group(1) if m else self.path.stem

    def poll(self) -> bool:
        """Reads what the trace gained; True when there is something new to show."""
        if self.follower is None:
            self.follower = _C.TraceFollower(str(self.path))
        before = (self.view.get("file_bytes"), self.view.get("rewrites"))
        view = self.follower.poll(self.consumed)
        if view["rewrites"] != self.rewrites:  # the file was rewritten: read from its start
            self.rewrites = view["rewrites"]
            self.consumed, self.steps, self.recent = 0, 0, []
            self.max_peak, self.max_step = 0, None
            view = self.follower.poll(0)
        for s in view["summaries"]:
            self.consumed += 1
            if not s["complete"]:
                continue  # the step still running (written at the end of a session)
            self.steps += 1
            if s["peak_bytes"] > self.max_peak:
                self.max_peak, self.max_step = s["peak_bytes"], s["step"]
            self.recent.append(s)
        del self.recent[:-RECENT_STEPS]
        self.view = view
        return (view["file_bytes"], view["rewrites"]) != before or bool(view["summaries"])

    def device(self) -> dict[str, Any] | None:
        """The device with the most live bytes now (the one a person watches)."""
        devices = self.view.get("devices") or []
        return max(devices, key=lambda d: (d["live_bytes"], d["device"]), default=None)

    def live(self) -> int:
        d = self.device()
        return d["live_bytes"] if d else 0

    def state(self) -> str:
        v = self.view
        if not v.get("readable"):
            return v.get("problem") or "waiting for the trace"
        return "ended" if v.get("ended") else "running"


def _phase(w: Watched) -> str:
    phases = w.view.get("phases") or []
    return " > ".join(phases) if phases else "idle"


def _composition(by_category: dict[str, int], limit: int = 4) -> str:
    parts = sorted(((v, k) for k, v in by_category.items() if v > 0), reverse=True)[:limit]
    return ", ".join(f"{k} {format_bytes(v)}" for v, k in parts) or "-"


def plain_lines(traces: list[Watched]) -> list[str]:
    """The lines to print now in plain mode: one per step each trace completed since the last
    call, and one when a trace ends."""
    out = []
    for w in traces:
        new = [s for s in w.recent if s["step"] > w.printed]
        for s in new:
            out.append(f"{w.path.name}: step {s['step']}: peak {format_bytes(s['peak_bytes'])} "
                       f"({s['peak_bytes']} bytes), reserved {format_bytes(s['peak_reserved_bytes'])}, "
                       f"{(s['end_time_ns'] - s['begin_time_ns']) / 1e6:.1f} ms; now step {w.view.get('step')}, "
                       f"{_phase(w)}, live {format_bytes(w.live())}")
            w.printed = s["step"]
    return out


def final_line(w: Watched) -> str:
    """What a trace came to (the numbers its report gives: docs/long-runs.md)."""
    where = f" in step {w.max_step}" if w.max_step is not None else ""
    return (f"{w.path.name}: {w.state()}: {w.steps} step(s), highest step peak "
            f"{format_bytes(w.max_peak)} ({w.max_peak} bytes){where}")


def renderable(traces: list[Watched], title: str) -> Any:
    """The rich view of the traces."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    if len(traces) == 1:
        w = traces[0]
        d = w.device()
        head = Text.assemble((f"{w.path.name}", "bold"), f"  {w.state()}",
                             f"  step {w.view.get('step', 0)}, {_phase(w)}",
                             f"  ({format_bytes(w.view.get('file_bytes', 0))} on disk)")
        parts: list[Any] = [head]
        if d is not None:
            parts.append(Text(f"live now on {d['device']}: {format_bytes(d['live_bytes'])} "
                              f"(reserved {format_bytes(d['reserved_bytes'])})"))
            live = Table()
            live.add_column("category")
            live.add_column("bytes", justify="right")
            for cat, value in sorted(d["by_category"].items(), key=lambda kv: -kv[1]):
                if value:
                    live.add_row(cat, format_bytes(value))
            parts.append(live)
        peaks = [s["peak_bytes"] for s in w.recent]
        if peaks:
            where = f" in step {w.max_step}" if w.max_step is not None else ""
            parts.append(Text(f"per-step peaks, last {len(peaks)} of {w.steps} steps: {sparkline(peaks)}  "
                              f"highest so far {format_bytes(w.max_peak)}{where}"))
            steps = Table()
            for name, justify in (("step", "right"), ("peak", "right"), ("reserved", "right"),
                                  ("time", "right"), ("at the peak", "left")):
                steps.add_column(name, justify=justify)
            for s in w.recent[-5:]:
                steps.add_row(str(s["step"]), format_bytes(s["peak_bytes"]), format_bytes(s["peak_reserved_bytes"]),
                              f"{(s['end_time_ns'] - s['begin_time_ns']) / 1e6:.1f} ms",
                              _composition(s["peak_by_category"], 3))
            parts.append(steps)
        return Panel(Group(*parts), title=title)
    table = Table(title=f"{len(traces)} rank trace(s)", title_justify="left")
    for name, justify in (("rank", "right"), ("state", "left"), ("step", "right"), ("phase", "left"),
                          ("live now", "right"), ("highest step peak", "right"), ("in step", "right")):
        table.add_column(name, justify=justify)
    highest = max(traces, key=lambda w: w.max_peak, default=None)
    for w in sorted(traces, key=lambda w: (len(w.rank), w.rank)):
        style = "bold red" if w is highest and w.max_peak else None
        table.add_row(w.rank, w.state(), str(w.view.get("step", 0)), _phase(w), format_bytes(w.live()),
                      format_bytes(w.max_peak), "" if w.max_step is None else str(w.max_step), style=style)
    note = Text(f"highest: rank {highest.rank}, {format_bytes(highest.max_peak)} in step {highest.max_step}"
                if highest is not None and highest.max_peak else "no step completed yet")
    return Panel(Group(table, note), title=title)
