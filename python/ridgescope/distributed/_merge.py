"""The merged report of a distributed job: every rank's trace in one report (docs/distributed.md,
docs/report_schema.md "ranks").

An aggregator over several traces, not a branch of the single-trace analysis: each trace is
analysed on its own by the native analysis, one at a time, and reduced at once to a small
per-rank summary (its peak and composition, its phases' peaks, a short live-bytes series);
only those summaries are kept, so memory grows with the number of ranks by a few kilobytes
each, never with the traces' events, and 1024 or more ranks merge in bounded memory. A trace
that cannot be read is listed and left out; a truncated one (a rank that died) is merged up to
its readable prefix and flagged."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable

from .. import _C
from .._errors import RidgescopeError
from ._section import distributed_section

# Live-bytes columns kept per rank for the HTML page's side-by-side charts.
RANK_TIMELINE_COLUMNS = 120
# A phase is "divergent" when its highest peak on one rank exceeds its lowest on another by at
# least this fraction of the highest.
DIVERGENCE_FRACTION = 0.01
MAX_LISTED_DIVERGENT = 12
# Per-step summaries kept per rank (docs/long-runs.md): every step up to this many, else the
# step with the highest peak of each of this many equal runs of steps.
RANK_MAX_STEP_SUMMARIES = 4000
MAX_LISTED_MISSING = 100

_RANK_IN_NAME = re.compile(r"rank[-_.]?(\d+)")


def expand_inputs(inputs: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The trace files named: files as given, and the ``*.rstrace`` files of each directory
    (sorted). Raises RidgescopeError for a path that does not exist or a directory without
    traces."""
    out: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(p.glob("*.rstrace"))
            if not found:
                raise RidgescopeError(f"{p} is a directory with no .rstrace files")
            out.extend(found)
        elif p.exists():
            out.append(p)
        else:
            raise RidgescopeError(f"no such file or directory: {p}")
    return out


def _dense_series(timeline: dict[str, Any]) -> list[int]:
    """The timeline's max_bytes for every column (the listed columns carry forward)."""
    n = int(timeline.get("columns", 0))
    index, values = timeline.get("index", []), timeline.get("max_bytes", [])
    out = [0] * n
    last, j = 0, 0
    for i in range(n):
        if j < len(index) and index[j] == i:
            last = values[j]
            j += 1
        out[i] = last
    return out


def _phase_peaks(report: dict[str, Any]) -> dict[str, int]:
    """Each phase (nested ones as 'parent > phase'): its highest peak over the run."""
    out: dict[str, int] = {}
    for s in report.get("steps", []):
        for p in s["phases"]:
            key = f"{p['parent']} > {p['phase']}" if p["parent"] else p["phase"]
            if p["peak_bytes"] > out.get(key, -1):
                out[key] = p["peak_bytes"]
    return out


def step_series(report: dict[str, Any], limit: int = RANK_MAX_STEP_SUMMARIES) -> dict[str, Any]:
    """A rank's per-step summaries (its report's ``at_a_glance``), as columns: every step, or on a
    longer run the step with the highest peak of each of ``limit`` equal runs of steps."""
    g = report.get("at_a_glance") or {}
    rows, cols = g.get("rows") or [], g.get("columns") or []
    names = ("step", "duration_ns", "peak_bytes", "peak_reserved_bytes", "end_bytes", "ooms")
    index = {name: cols.index(name) for name in names if name in cols}
    chosen = list(range(len(rows)))
    if len(rows) > limit:
        peak = index["peak_bytes"]
        chosen = [max(range(b * len(rows) // limit, max((b + 1) * len(rows) // limit, b * len(rows) // limit + 1)),
                      key=lambda i: rows[i][peak]) for b in range(limit)]
    out: dict[str, Any] = {"steps": len(rows), "keep_steps": g.get("keep_steps"),
                           "median_peak_bytes": g.get("median_peak_bytes", 0),
                           "max_peak_bytes": g.get("max_peak_bytes", 0), "max_peak_step": g.get("max_peak_step"),
                           "sampled": len(rows) > limit}
    for name, i in index.items():
        out[name] = [rows[j][i] for j in chosen]
    return out


def rank_summary(path: Path, report: dict[str, Any], position: int) -> dict[str, Any]:
    """What the merged report keeps of one rank's report."""
    d = distributed_section(report) or {}
    rank = d.get("rank")
    if rank is None:
        m = _RANK_IN_NAME.search(path.name)
        rank = int(m.group(1)) if m else position
    peak = report["peak"]
    trace = report["trace"]
    by_category = peak["by_category"]
    unknown = by_category.get("unknown", 0)
    status, problem = "ok", trace["problem"]
    if trace["truncated"]:
        status = "truncated"
    elif report.get("run", {}).get("ridgescope_version") and "recorder" not in report:
        # rs.track writes `run` metadata when tracking starts and `session` metadata when it
        # stops: a trace with the first and not the second ended with its process (killed)
        status = "truncated"
        problem = ("the trace has no end-of-session record: its process stopped while "
                   "tracking (killed?)")
    return {
        "rank": int(rank),
        "rank_from": "metadata" if d.get("rank") is not None else "file name or position",
        "world_size": d.get("world_size"),
        "local_rank": d.get("local_rank"),
        "host": d.get("host"),
        "backend": d.get("backend"),
        "strategies": [s.get("strategy") for s in d.get("strategies", [])],
        "path": str(path),
        "status": status,
        "problem": problem,
        "device": report.get("device"),
        "peak_bytes": peak["bytes"],
        "reserved_bytes": peak["reserved_bytes"],
        "step": peak["step"],
        "phase": peak["phase"],
        "by_category": dict(by_category),
        "unknown_fraction": unknown / peak["bytes"] if peak["bytes"] else 0.0,
        "steps": len(report.get("steps", [])),
        "complete_steps": sum(1 for s in report.get("steps", []) if s["complete"]),
        "final_live_bytes": report["totals"]["final_live_bytes"],
        "duration_ns": trace["duration_ns"],
        "events": trace["events"],
        "phases": _phase_peaks(report),
        "summarised_steps": (report.get("at_a_glance") or {}).get("steps", 0),
        "keep_steps": (report.get("at_a_glance") or {}).get("keep_steps"),
        "step_series": step_series(report),
        "timeline": {"end_time_ns": report["timeline"]["end_time_ns"],
                     "max_bytes": _dense_series(report["timeline"])},
    }


def analyse_rank(path: Path, position: int) -> dict[str, Any]:
    """One trace, analysed and summarised (or listed as unreadable)."""
    try:
        text = _C.analyze(str(path), 0, None, RANK_TIMELINE_COLUMNS)
    except (_C.TraceError, OSError, RuntimeError) as exc:
        m = _RANK_IN_NAME.search(path.name)
        return {"rank": int(m.group(1)) if m else position, "path": str(path),
                "status": "unreadable", "problem": str(exc)}
    return rank_summary(path, json.loads(text), position)


def _divergent_phases(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    stats: dict[str, dict[str, Any]] = {}
    for r in ranks:
        for key, peak in r["phases"].items():
            s = stats.get(key)
            if s is None:
                stats[key] = {"phase": key, "ranks": 1, "min_bytes": peak, "min_rank": r["rank"],
                              "max_bytes": peak, "max_rank": r["rank"]}
                continue
            s["ranks"] += 1
            if peak < s["min_bytes"]:
                s["min_bytes"], s["min_rank"] = peak, r["rank"]
            if peak > s["max_bytes"]:
                s["max_bytes"], s["max_rank"] = peak, r["rank"]
    out = []
    for s in stats.values():
        s["spread_bytes"] = s["max_bytes"] - s["min_bytes"]
        s["spread_fraction"] = s["spread_bytes"] / s["max_bytes"] if s["max_bytes"] else 0.0
        s["on_every_rank"] = s["ranks"] == len(ranks)
        if s["spread_fraction"] >= DIVERGENCE_FRACTION or not s["on_every_rank"]:
            out.append(s)
    out.sort(key=lambda s: (-s["spread_bytes"], s["phase"]))
    return out[:MAX_LISTED_DIVERGENT]


def merge_summaries(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The `ranks` section from per-rank summaries (any order)."""
    summaries = sorted(summaries, key=lambda r: (r["rank"], r["path"]))
    merged = [r for r in summaries if r["status"] != "unreadable"]
    problems: list[dict[str, Any]] = []
    for r in summaries:
        if r["status"] == "unreadable":
            problems.append({"kind": "unreadable", "rank": r["rank"], "path": r["path"],
                             "message": f"{r['path']} could not be read ({r['problem']}); "
                                        "it is left out of the merge"})
        elif r["status"] == "truncated":
            problems.append({"kind": "truncated", "rank": r["rank"], "path": r["path"],
                             "message": f"rank {r['rank']}'s trace is truncated ({r['problem']}): "
                                        "merged up to its readable prefix (did the rank die?)"})
    seen: dict[int, str] = {}
    for r in merged:
        if r["rank"] in seen:
            problems.append({"kind": "duplicate_rank", "rank": r["rank"], "path": r["path"],
                             "message": f"rank {r['rank']} appears twice ({seen[r['rank']]} and "
                                        f"{r['path']}): traces of different runs?"})
        seen.setdefault(r["rank"], r["path"])
    worlds = sorted({r["world_size"] for r in merged if r.get("world_size")})
    if len(worlds) > 1:
        problems.append({"kind": "world_size_mismatch", "rank": None, "path": None,
                         "message": f"the traces disagree on the world size ({worlds}): "
                                    "traces of different runs?"})
    world = max(worlds) if worlds else None
    missing: list[int] = []
    n_missing = 0
    if world is not None and world <= 1 << 24:
        present = set(seen)
        for rank in range(world):
            if rank not in present:
                n_missing += 1
                if len(missing) < MAX_LISTED_MISSING:
                    missing.append(rank)
    section: dict[str, Any] = {
        "world_size": world,
        "traces": len(summaries),
        "merged": len(merged),
        "missing_ranks": missing,
        "missing_rank_count": n_missing,
        "hosts": sorted({r["host"] for r in merged if r.get("host")}),
        "backends": sorted({r["backend"] for r in merged if r.get("backend")}),
        "highest": None,
        "divergent_phases": _divergent_phases(merged),
        "problems": problems,
        "table": [{k: v for k, v in r.items() if k not in ("phases", "timeline", "step_series")}
                  for r in summaries],
        # Every rank's per-step summaries (docs/long-runs.md), by rank.
        "step_summaries": {str(r["rank"]): r["step_series"] for r in merged},
        "phases": {str(r["rank"]): r["phases"] for r in merged},
        "timelines": {"columns": RANK_TIMELINE_COLUMNS,
                      "ranks": {str(r["rank"]): r["timeline"] for r in merged}},
    }
    if merged:
        hi = max(merged, key=lambda r: (r["peak_bytes"], -r["rank"]))
        lo = min(merged, key=lambda r: (r["peak_bytes"], r["rank"]))
        peaks = sorted(r["peak_bytes"] for r in merged)
        section["highest"] = {
            "rank": hi["rank"], "peak_bytes": hi["peak_bytes"], "step": hi["step"],
            "phase": hi["phase"], "lowest_rank": lo["rank"], "lowest_peak_bytes": lo["peak_bytes"],
            "over_lowest_bytes": hi["peak_bytes"] - lo["peak_bytes"],
            "over_lowest_fraction": ((hi["peak_bytes"] - lo["peak_bytes"]) / lo["peak_bytes"]
                                     if lo["peak_bytes"] else 0.0),
            "median_peak_bytes": peaks[len(peaks) // 2],
        }
    return section


def merge_traces(paths: Iterable[str | os.PathLike[str]],
                 on_trace: Callable[[int, int, Path], None] | None = None) -> dict[str, Any]:
    """The merged report (``{"schema_version": 1, "ranks": {...}}``) of several rank traces,
    analysed one at a time. ``paths`` may name directories. ``on_trace(i, n, path)`` is called
    before each trace is analysed (progress)."""
    files = expand_inputs(paths)
    summaries = []
    for i, path in enumerate(files):
        if on_trace is not None:
            on_trace(i, len(files), path)
        summaries.append(analyse_rank(path, i))
    return {"schema_version": _C.REPORT_SCHEMA_VERSION, "kind": "ranks",
            "categories": list(_C.CATEGORIES), "ranks": merge_summaries(summaries)}
