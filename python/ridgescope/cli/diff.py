"""``ridgescope diff A B``: what changed between two runs, at the peak and phase by phase."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import _device_rules
from ._output import emit
from typing import Any

HELP = ("Compare two traces (e.g. before and after activation checkpointing): the change per "
        "category at the peak and in each phase's peak, and phases that appear in only one run.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", type=Path, help="the first trace (the baseline)")
    parser.add_argument("b", type=Path, help="the second trace")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="text (default) or json (the comparison as data)")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="write to this file instead of standard output")
    _device_rules.add_arguments(parser)


def _phase_peaks(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per phase name (and parent, for nested ones): the highest peak over the run, with its
    composition and how many instances there were."""
    out: dict[str, dict[str, Any]] = {}
    for s in r["steps"]:
        for p in s["phases"]:
            key = f"{p['parent']} > {p['phase']}" if p["parent"] else p["phase"]
            cur = out.setdefault(key, {"count": 0, "peak_bytes": -1, "peak_by_category": {}})
            cur["count"] += 1
            if p["peak_bytes"] > cur["peak_bytes"]:
                cur["peak_bytes"] = p["peak_bytes"]
                cur["peak_by_category"] = p["peak_by_category"]
    return out


def _stacks_at_peak(r: dict[str, Any]) -> dict[tuple, dict[str, Any]]:
    """The peak's live bytes by allocation stack, keyed by the stack's frames as texts (stack
    ids differ between traces; the frames do not), with a label: the site and the user frame
    that called it."""
    from .._reporters._text import frame_text, user_callers

    frames = r.get("frames") or []
    out: dict[tuple, dict[str, Any]] = {}
    for st in r["peak"].get("stacks") or []:
        fr = [frames[i] for i in st["frames"]]
        key = tuple(frame_text(f) for f in fr)
        if not fr:
            label = "(no stack recorded)"
        else:
            site = st["site"] if st.get("site") is not None else None
            head = frame_text(fr[site]) if site is not None else f"(no site) {frame_text(fr[0])}"
            caller = next((f for f in user_callers(fr, site) if f["kind"] == "python"), None)
            label = head + (f" from {frame_text(caller)}" if caller is not None else "")
        cur = out.setdefault(key, {"label": label, "bytes": 0, "by_category": {}})
        cur["bytes"] += st["bytes"]
        for c, n in st["by_category"].items():
            if n:
                cur["by_category"][c] = cur["by_category"].get(c, 0) + n
    return out


def _compare_stacks(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Per stack live at either peak: its bytes in a and b, largest change first."""
    sa, sb = _stacks_at_peak(a), _stacks_at_peak(b)
    rows = []
    for key in list(sa) + [k for k in sb if k not in sa]:
        x, y = sa.get(key), sb.get(key)
        cats = {}
        for c in set((x or {}).get("by_category", {})) | set((y or {}).get("by_category", {})):
            cats[c] = {"a": (x or {}).get("by_category", {}).get(c, 0),
                       "b": (y or {}).get("by_category", {}).get(c, 0)}
        rows.append({"stack": (x or y)["label"], "frames": list(key),
                     "a": x["bytes"] if x else 0, "b": y["bytes"] if y else 0,
                     "change": (y["bytes"] if y else 0) - (x["bytes"] if x else 0),
                     "by_category": cats})
    rows.sort(key=lambda r: (-abs(r["change"]), -max(r["a"], r["b"])))
    return rows


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The comparison of two report dicts (b relative to a), as JSON-ready data."""
    cats = a["categories"]
    peak = {c: {"a": a["peak"]["by_category"].get(c, 0), "b": b["peak"]["by_category"].get(c, 0)}
            for c in cats}
    for v in peak.values():
        v["change"] = v["b"] - v["a"]
    pa, pb = _phase_peaks(a), _phase_peaks(b)
    phases = {}
    for key in list(pa) + [k for k in pb if k not in pa]:
        x, y = pa.get(key), pb.get(key)
        entry: dict[str, Any] = {"in": "both" if x and y else ("a" if x else "b"),
                                 "count_a": x["count"] if x else 0, "count_b": y["count"] if y else 0,
                                 "peak_a": x["peak_bytes"] if x else None,
                                 "peak_b": y["peak_bytes"] if y else None}
        if x and y:
            entry["by_category_change"] = {c: y["peak_by_category"].get(c, 0) - x["peak_by_category"].get(c, 0)
                                           for c in cats
                                           if y["peak_by_category"].get(c, 0) != x["peak_by_category"].get(c, 0)}
        phases[key] = entry
    return {"a": a["trace"]["path"], "b": b["trace"]["path"],
            # the ranks of a distributed job's traces (docs/distributed.md), else None
            "rank_a": (a.get("distributed") or {}).get("rank"),
            "rank_b": (b.get("distributed") or {}).get("rank"),
            "peak": {"a": a["peak"]["bytes"], "b": b["peak"]["bytes"],
                     "change": b["peak"]["bytes"] - a["peak"]["bytes"],
                     "phase_a": a["peak"]["phase"], "phase_b": b["peak"]["phase"],
                     "by_category": peak},
            "phases": phases,
            # the peak's live bytes per allocation stack (docs/sites.md), largest change first
            "stacks": _compare_stacks(a, b)}


def render(d: dict[str, Any]) -> str:
    from .._format import format_bytes

    def signed(n: int) -> str:
        return ("+" if n > 0 else "-" if n < 0 else "±") + format_bytes(abs(n))

    p = d["peak"]
    ranks = (f" (rank {d['rank_a']} -> rank {d['rank_b']})"
             if d.get("rank_a") is not None and d.get("rank_b") is not None else "")
    out = [f"ridgescope diff: {d['a']} -> {d['b']}{ranks}", "",
           f"Peak: {format_bytes(p['a'])} ({p['phase_a']}) -> {format_bytes(p['b'])} ({p['phase_b']}), "
           f"{signed(p['change'])}"]
    for c, v in sorted(p["by_category"].items(), key=lambda kv: -abs(kv[1]["change"])):
        if v["a"] or v["b"]:
            out.append(f"  {c:<16} {format_bytes(v['a']):>10} -> {format_bytes(v['b']):>10}  {signed(v['change'])}")
    out += ["", "Per phase (each phase's highest peak in the run):"]
    for key, e in d["phases"].items():
        if e["in"] == "both":
            changes = ", ".join(f"{c} {signed(n)}" for c, n in sorted(e["by_category_change"].items(),
                                                                      key=lambda kv: -abs(kv[1]))[:4])
            out.append(f"  {key:<28} {format_bytes(e['peak_a']):>10} -> {format_bytes(e['peak_b']):>10}"
                       + (f"  ({changes})" if changes else ""))
        else:
            which = "second" if e["in"] == "b" else "first"
            peak = e["peak_b"] if e["in"] == "b" else e["peak_a"]
            count = e["count_b"] if e["in"] == "b" else e["count_a"]
            out.append(f"  {key:<28} only in the {which} run ({count} time(s), peak {format_bytes(peak)})")
    changed = [r for r in d.get("stacks", []) if r["change"]]
    if changed:
        out += ["", "Per allocation stack at the peak (largest changes first):"]
        for r in changed[:10]:
            cats = ", ".join(c for c, v in sorted(r["by_category"].items(), key=lambda kv: -max(kv[1]["a"], kv[1]["b"])))
            out.append(f"  {format_bytes(r['a']):>10} -> {format_bytes(r['b']):>10}  {signed(r['change']):>11}"
                       f"  {r['stack']}  [{cats}]")
        if len(changed) > 10:
            out.append(f"  ... {len(changed) - 10} more changed stack(s) in the JSON output (stacks)")
    return "\n".join(out) + "\n"


def run(args: argparse.Namespace) -> int:
    from .._report import load

    options = _device_rules.load_options(args)
    d = compare(load(args.a, **options).to_dict(), load(args.b, **options).to_dict())
    text = json.dumps(d, indent=2) + "\n" if args.format == "json" else render(d)
    emit(text, args.output)
    return 0
