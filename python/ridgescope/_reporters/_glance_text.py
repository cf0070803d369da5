"""The run at a glance, as text (docs/long-runs.md): the peak of every step in one line, the
categories that grow over the run, the steps that stand out and the windows of steps whose
events the trace kept. Reads the report's ``at_a_glance`` section (docs/report_schema.md)."""
from __future__ import annotations

from typing import Any

from .._format import format_bytes

SPARK = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 64
MAX_STANDOUTS = 8
# A full trace shows the section only past this many steps (a bounded one always).
MIN_STEPS = 20
_REASON_TEXT = {"oom": "out of memory", "mark": "marked", "growth": "end bytes kept growing",
                "new_maximum": "new maximum", "above_median": "above the median",
                "highest_peak": "highest peak", "last_steps": "last steps", "all": "every step",
                "first_steps": "first steps (the saved-tensor hook's)"}


def column(g: dict[str, Any], name: str) -> list[int]:
    """One column of the per-step rows (``[]`` when the section has no such column)."""
    try:
        i = g["columns"].index(name)
    except ValueError:
        return []
    return [row[i] for row in g["rows"]]


def buckets(values: list[int], width: int) -> list[int]:
    """The highest value of each of ``width`` equal runs of ``values`` (all of them if fewer)."""
    if len(values) <= width:
        return list(values)
    out = []
    for b in range(width):
        lo, hi = b * len(values) // width, (b + 1) * len(values) // width
        out.append(max(values[lo:max(hi, lo + 1)]))
    return out


def sparkline(values: list[int], width: int = SPARK_WIDTH) -> str:
    vs = buckets(values, width)
    top = max(vs, default=0)
    lo = min(vs, default=0)
    if top == 0:
        return ""
    span = top - lo
    return "".join(SPARK[4] if span == 0 else SPARK[min(len(SPARK) - 1, (v - lo) * len(SPARK) // (span + 1))]
                   for v in vs)


def shows_glance(d: dict[str, Any]) -> bool:
    g = d.get("at_a_glance") or {}
    return bool(g.get("rows")) and (g.get("keep_steps") is not None or g["steps"] > MIN_STEPS)


def glance_lines(d: dict[str, Any]) -> list[str]:
    """The section's lines, with a blank line after; [] when not shown."""
    if not shows_glance(d):
        return []
    g = d["at_a_glance"]
    kept = sum(w["last_step"] - w["first_step"] + 1 for w in g["windows"])
    keep = (f"keep_steps {g['keep_steps']}" if g["keep_steps"] is not None else "every step kept")
    out = [f"The run at a glance: {g['steps']:,} step(s) summarised, the events of {kept:,} kept ({keep})"]
    median, top = g["median_peak_bytes"], g["max_peak_bytes"]
    over = f" ({100 * (top / median - 1):+.0f}% over the median)" if median else ""
    out.append(f"  peak per step: median {format_bytes(median)}, highest {format_bytes(top)} in step "
               f"{g['max_peak_step']}{over}")
    peaks = column(g, "peak_bytes")
    line = sparkline(peaks)
    if line:
        first, last = g["rows"][0][0], g["rows"][-1][0]
        out.append(f"  {line}  steps {first}..{last}, {format_bytes(min(peaks))} to {format_bytes(max(peaks))}")
    if g["growing_categories"]:
        out.append("  growing over the run (median of the first tenth -> of the last tenth of the steps):")
        for c in g["growing_categories"]:
            out.append(f"    {c['category']:<16} {format_bytes(c['first_bytes']):>10} -> "
                       f"{format_bytes(c['last_bytes']):>10}  (+{format_bytes(c['growth_bytes'])}, about "
                       f"{format_bytes(int(c['growth_per_step_bytes']))} per step)")
    marks = dict((s, name) for s, name in g["marks"])
    if g["standouts"]:
        shown = g["standouts"][:MAX_STANDOUTS]
        out.append(f"  steps that stand out ({g['standouts_total']:,}; peak above the median by more than "
                   f"{100 * g['standout_fraction']:.0f}%, a new maximum, growth, an OOM or a mark):")
        for s in shown:
            why = ", ".join(_REASON_TEXT.get(r, r) + (f" '{marks[s['step']]}'" if r == "mark" and s["step"] in marks else "")
                            for r in s["reasons"])
            out.append(f"    step {s['step']:<8} peak {format_bytes(s['peak_bytes']):>10} "
                       f"({100 * s['over_median']:+.0f}%): {why}")
        if g["standouts_total"] > len(shown):
            out.append(f"    ... {g['standouts_total'] - len(shown):,} more (the JSON report lists up to 100)")
    if g["keep_steps"] is not None and g["windows"]:
        parts = []
        for w in g["windows"]:
            span = f"{w['first_step']}" if w["first_step"] == w["last_step"] else f"{w['first_step']}-{w['last_step']}"
            why = ", ".join(_REASON_TEXT.get(r, r) for r in w["reasons"]) or "kept"
            parts.append(f"{span} ({why})")
        out.append("  events kept for steps " + "; ".join(parts))
    return out + [""]
