"""The merged multi-rank report as one self-contained HTML page (docs/distributed.md): the body,
script and style are ``_html_assets/ranks.html``, ``ranks.js`` (after ``common.js``) and
``ranks.css`` (after the single-run page's ``report.css``), in the head both pages share
(``page.html``); the merged report JSON is embedded as data."""
from __future__ import annotations

from typing import Any

from ._html import RANKS_SCRIPTS, render_page


def render_ranks_html(merged: dict[str, Any]) -> str:
    return render_page(f"ridgescope report: {merged['ranks']['merged']} ranks", "ranks.html",
                       ("report.css", "ranks.css"), RANKS_SCRIPTS, merged)
