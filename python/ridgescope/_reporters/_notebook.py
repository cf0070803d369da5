"""A report in a notebook: ``Report._repr_html_`` shows the same self-contained page that
``Report.to_html`` writes, inside an ``<iframe srcdoc=...>``.

The container is what makes the one document safe to show inline: the page's style and
element ids cannot collide with the notebook's (or with a second report in the same
notebook), and its script runs in a sandbox (``allow-scripts`` only: an opaque origin, no
access to the notebook, its cookies or storage). The page keeps its own Content-Security-Policy,
so it still makes no network request. Nothing here is specific to Jupyter: any front end that
renders ``text/html`` output (JupyterLab, Notebook 7, VS Code, Colab) shows it."""
from __future__ import annotations

import html

# Tall enough for the chart and the peak's composition; the reader can drag it taller.
FRAME_HEIGHT_PX = 900


def iframe(document: str, height_px: int = FRAME_HEIGHT_PX) -> str:
    """The HTML fragment that shows ``document`` (a whole page) in a sandboxed frame."""
    return (f'<iframe class="ridgescope-report" sandbox="allow-scripts" '
            f'style="width:100%;height:{int(height_px)}px;border:1px solid #d0d7de;'
            f'resize:vertical;overflow:auto" '
            f'title="ridgescope memory report" srcdoc="{html.escape(document, quote=True)}">'
            f'</iframe>')
