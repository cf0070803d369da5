"""The HTML report: one self-contained file (inline script and style, the report JSON embedded
as data, no request to any network address when opened). The page is drawn by
``_html_assets/report.js`` with hand-written SVG; docs/html-report.md describes it.

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
# of a long run, and bounded (about 1.5 MB of JSON when every column changes).
HTML_TIMELINE_COLUMNS = 20000

_PLACEHOLDER = re.compile(r"\{\{([A-Z]+)\}\}")


@lru_cache(maxsize=None)
def _asset(name: str) -> str:
    return resources.files("ridgescope").joinpath("_html_assets", name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """JSON that is safe inside a ``<script>`` element: no ``</script>``, ``<!--`` or other
    markup can end or confuse it (``<``, ``>`` and ``&`` are written as \\u escapes, which
    ``JSON.parse`` reads back unchanged)."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_html(data: dict[str, Any]) -> str:
    """The HTML page of a report (``Report.to_dict()``), as text."""
    script = _asset("report.js")
    style = _asset("report.css")
    if "</script" in script.lower() or "</style" in style.lower():  # an asset bug, never data
        raise AssertionError("an HTML asset contains a closing script or style tag")
    trace = data.get("trace", {}).get("path", "")
    parts = {
        "TITLE": html.escape(f"ridgescope report: {os.path.basename(trace) or 'run'}"),
        "STYLE": style,
        "SCRIPT": script,
        "DATA": embed_json(data),
    }
    # One pass over the template: text substituted in is never scanned again.
    return _PLACEHOLDER.sub(lambda m: parts[m.group(1)], _asset("report.html"))


def write_html(data: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Writes the HTML page of a report to ``path`` (UTF-8) and returns the path."""
    out = Path(path)
    out.write_text(render_html(data), encoding="utf-8")
    return out
