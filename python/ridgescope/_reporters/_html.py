"""The HTML report: one self-contained file (inline script and style, the report JSON embedded
as data, no request to any network address when opened). The page is drawn with hand-written
SVG by the script modules of ``REPORT_SCRIPTS`` (``_html_assets/report_*.js``, after
``common.js``, which the ranks page shares), in ``report.html`` (the body) inside ``page.html``
(the head both pages share); docs/html-report.md describes it.

The chart reads the report's ``timeline`` (docs/report_schema.md): each column keeps its lowest
and highest live bytes, so the peak is never hidden by downsampling, and the size of the page
is bounded by the column count, not by the number of events in the trace."""
from __future__ import annotations

import html
import json
import os
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

# Columns of the timeline the HTML report asks the analysis for: enough to zoom into one step
# of a long run, and bounded (about 1.3 MB of JSON when every column changes).
HTML_TIMELINE_COLUMNS = 10000
# Steps listed in the page's tables (each costs about 4 kB of JSON); the chart draws them all.
HTML_MAX_STEPS = 300

_PLACEHOLDER = re.compile(r"\{\{([A-Z]+)\}\}")

# A page's script: these modules of _html_assets/, in order, inside one function (one scope, no
# globals). common.js holds what both pages draw alike (category colours, byte formatting).
REPORT_SCRIPTS = ("common.js", "report_base.js", "report_cards.js", "report_tables.js",
                  "report_chart.js", "report_sites.js", "report_ledgers.js", "report_glance.js",
                  "report_main.js")
# Steps of the run at a glance a page embeds: a longer run is cut to the step with the highest
# peak of each of this many equal runs of steps, and every step that stands out.
HTML_MAX_GLANCE_ROWS = 2000
RANKS_SCRIPTS = ("common.js", "ranks.js")


@lru_cache(maxsize=None)
def _asset(name: str) -> str:
    return resources.files("ridgescope._reporters").joinpath("_html_assets", name).read_text(encoding="utf-8")


def page_script(modules: tuple[str, ...]) -> str:
    """The page's script: its modules concatenated inside one strict-mode function."""
    body = "\n".join(_asset(name) for name in modules)
    return "(function () {\n  'use strict';\n" + body + "})();\n"


def embed_json(data: Any) -> str:
    """JSON that is safe inside a ``<script>`` element: no ``</script>``, ``<!--`` or other
    markup can end or confuse it (``<``, ``>`` and ``&`` are written as \\u escapes, which
    ``JSON.parse`` reads back unchanged)."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page_data(data: dict[str, Any], max_steps: int = HTML_MAX_STEPS) -> dict[str, Any]:
    """The data a page embeds: the report JSON, with ``steps`` cut to ``max_steps`` for long
    runs (so the page stays small: its size is bounded by the timeline's columns and this
    cap, not by the trace). Kept: the first and last steps, the steps with the highest peaks and
    those around the run's peak, in step order; ``html_steps`` says how many there were."""
    data = _glance_rows(data)
    steps = data.get("steps", [])
    if len(steps) <= max_steps:
        return data
    keep: set[int] = set()
    peak_step = data.get("peak", {}).get("step")
    at_peak = [i for i, s in enumerate(steps) if s["step"] == peak_step]
    for i in at_peak:
        keep.update(range(max(0, i - 5), min(len(steps), i + 6)))
    edge = max_steps // 6
    keep.update(range(min(edge, len(steps))))
    keep.update(range(max(0, len(steps) - edge), len(steps)))
    for i in sorted(range(len(steps)), key=lambda i: (-steps[i]["peak_bytes"], i)):
        if len(keep) >= max_steps:
            break
        keep.add(i)
    out = dict(data)
    out["steps"] = [steps[i] for i in sorted(keep)]
    out["html_steps"] = {"total": len(steps), "listed": len(out["steps"])}
    return out


def _glance_rows(data: dict[str, Any], max_rows: int = HTML_MAX_GLANCE_ROWS) -> dict[str, Any]:
    """The report with its ``at_a_glance`` rows cut to ``max_rows`` buckets (each bucket's step
    with the highest peak) plus the steps that stand out, for a long run."""
    g = data.get("at_a_glance")
    if not g or len(g.get("rows", [])) <= max_rows:
        return data
    rows, peak = g["rows"], g["columns"].index("peak_bytes")
    keep = {s["step"] for s in g["standouts"]}
    chosen = []
    for b in range(max_rows):
        lo, hi = b * len(rows) // max_rows, (b + 1) * len(rows) // max_rows
        chosen.append(max(range(lo, max(hi, lo + 1)), key=lambda i: rows[i][peak]))
    chosen = sorted(set(chosen) | {i for i, r in enumerate(rows) if r[0] in keep})
    out = dict(data)
    out["at_a_glance"] = dict(g, rows=[rows[i] for i in chosen])
    return out


def render_page(title: str, body: str, styles: tuple[str, ...], scripts: tuple[str, ...],
                data: Any) -> str:
    """A whole page: ``page.html`` (the head both pages share) around the ``body`` asset, with
    the ``styles`` and the ``scripts`` modules inlined and ``data`` embedded as JSON."""
    script = page_script(scripts)
    style = "\n".join(_asset(name) for name in styles)
    if "</script" in script.lower() or "</style" in style.lower():  # an asset bug, never data
        raise AssertionError("an HTML asset contains a closing script or style tag")
    parts = {"TITLE": html.escape(title), "STYLE": style, "BODY": _asset(body), "SCRIPT": script,
             "DATA": embed_json(data)}
    # One pass over the template: text substituted in is never scanned again.
    return _PLACEHOLDER.sub(lambda m: parts[m.group(1)], _asset("page.html"))


def render_html(data: dict[str, Any], library_frames: bool = False) -> str:
    """The HTML page of a report (``Report.to_dict()``), as text; ``library_frames``: the flame
    graph opens with library frames shown (its checkbox toggles them)."""
    trace = data.get("trace", {}).get("path", "")
    shown = page_data(data)
    if library_frames:
        shown = {**shown, "html_view": {"library_frames": True}}
    return render_page(f"ridgescope report: {os.path.basename(trace) or 'run'}", "report.html",
                       ("report.css",), REPORT_SCRIPTS, shown)


def write_html(data: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Writes the HTML page of a report to ``path`` (UTF-8) and returns the path."""
    out = Path(path)
    out.write_text(render_html(data), encoding="utf-8")
    return out
