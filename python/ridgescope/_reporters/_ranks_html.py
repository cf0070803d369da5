"""The merged multi-rank report as one self-contained HTML page (docs/distributed.md): the
template, script and style are ``_html_assets/ranks.html``, ``ranks.js`` (after ``common.js``,
shared with the single-run page) and ``ranks.css`` (with the single-run page's ``report.css``);
the merged report JSON is embedded as data."""
from __future__ import annotations

import html
from typing import Any

from ._html import _PLACEHOLDER, RANKS_SCRIPTS, _asset, embed_json, page_script


def render_ranks_html(merged: dict[str, Any]) -> str:
    script = page_script(RANKS_SCRIPTS)
    style = _asset("report.css") + "\n" + _asset("ranks.css")
    if "</script" in script.lower() or "</style" in style.lower():  # an asset bug, never data
        raise AssertionError("an HTML asset contains a closing script or style tag")
    s = merged["ranks"]
    parts = {
        "TITLE": html.escape(f"ridgescope report: {s['merged']} ranks"),
        "STYLE": style,
        "SCRIPT": script,
        "DATA": embed_json(merged),
    }
    return _PLACEHOLDER.sub(lambda m: parts[m.group(1)], _asset("ranks.html"))
