"""Specification of a report in a notebook (``Report._repr_html_``, python/ridgescope/_notebook.py)
and of ``rs.track`` in a notebook cell.

A notebook shows ``_repr_html_`` inline: it is the very document ``to_html`` writes, inside a
sandboxed ``<iframe srcdoc>`` (the container). Checked in a real headless Chromium (as
tests/python/test_html_report.py does), and the cells run in IPython's own shell, the one
ipykernel runs a notebook's cells in."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from html.parser import HTMLParser

import pytest
import torch

import ridgescope as rs
from conftest import gpt_inputs, make_gpt, train
import models

CHROMIUM = os.environ.get("RIDGESCOPE_CHROMIUM", "/usr/bin/chromium")

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - setup.sh installs it
    sync_playwright = None


class Frames(HTMLParser):
    """The iframes of an HTML fragment, with their attributes (unescaped, as a browser reads)."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[dict[str, str | None]] = []
        self.other_tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "iframe":
            self.frames.append(dict(attrs))
        else:
            self.other_tags.append(tag)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("nb") / "run.rstrace"
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with rs.track(model=model, optimizer=opt, out=path) as session:
        train(model, opt, lambda i: gpt_inputs(8, i), models.gpt_loss, steps=2)
    return session.report()


def test_repr_html_is_the_to_html_document_in_a_sandboxed_frame(report):
    """Given a report, then ``_repr_html_`` is one iframe and nothing else, whose srcdoc is
    exactly the document ``to_html`` writes, sandboxed to scripts only."""
    parser = Frames()
    parser.feed(report._repr_html_())
    assert len(parser.frames) == 1 and parser.other_tags == []
    frame = parser.frames[0]
    assert frame["srcdoc"] == report.to_html()
    assert frame["sandbox"] == "allow-scripts"


@pytest.mark.skipif(sync_playwright is None or shutil.which(CHROMIUM) is None,
                    reason=f"needs Python's playwright and Chromium at {CHROMIUM}")
def test_the_notebook_output_renders_offline_in_chromium(report, tmp_path):
    """Given the output inserted in a page (as a notebook inserts it), when Chromium opens it,
    then the report draws inside the frame with the JSON's peak, with no console error and no
    request but the page itself."""
    page_path = tmp_path / "notebook.html"
    page_path.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
                         f"<div class='output_html'>{report._repr_html_()}</div></body></html>",
                         encoding="utf-8")
    requests, errors = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: errors.append(m.text)
                    if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_path.as_uri())
            frame = page.frame_locator("iframe.ridgescope-report")
            frame.locator("body[data-ready='1']").wait_for(timeout=15000)
            peak = report.peak
            assert frame.locator("#rs-peak-value").get_attribute("data-bytes") == str(peak["bytes"])
            drawn = set(frame.locator(".rs-area").evaluate_all(
                "els => els.map(e => e.dataset.category)"))
            assert {c for c, b in peak["by_category"].items() if b} <= drawn
            assert frame.locator("#rs-table-steps tr.rs-step-row").count() == len(report.steps)
        finally:
            browser.close()
    assert errors == []
    assert requests == [page_path.as_uri()]


CELLS = [
    "import torch\nimport ridgescope as rs",
    "torch.manual_seed(0)\n"
    "model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))",
    "with rs.track(model=model) as session:\n"
    "    for i in range(2):\n"
    "        model.zero_grad()\n"
    "        model(torch.randn(16, 32)).square().mean().backward()",
    "report = session.report()\nreport",
]

SHELL = textwrap.dedent('''
    import json, sys
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=config)
    outcomes = [shell.run_cell(cell, store_history=True) for cell in json.loads(sys.argv[1])]
    report = shell.user_ns["report"]
    shown, _ = shell.display_formatter.format(outcomes[-1].result)
    model = shell.user_ns["model"]
    print(json.dumps({
        "success": [o.success for o in outcomes],
        "errors": [repr(o.error_in_exec or o.error_before_exec) for o in outcomes if not o.success],
        "html_is_repr": shown.get("text/html") == report._repr_html_(),
        "parameter_bytes": report.to_dict()["model"]["parameter_bytes"],
        "expected_parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "activation_bytes": report.peak["by_category"]["activation"],
        "active_after": shell.user_ns["rs"].active_session() is not None,
    }))
''')


def test_rs_track_works_in_notebook_cells(tmp_path):
    """Given cells run one by one in IPython's shell (the model in one cell, ``with rs.track``
    in the next, the report as a cell's last expression), then every cell succeeds, the report
    is exact, and the cell's output is the report's HTML display."""
    pytest.importorskip("IPython")
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")}
    out = subprocess.run([sys.executable, "-c", SHELL, json.dumps(CELLS)], capture_output=True,
                         text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["success"] == [True] * len(CELLS), result["errors"]
    assert result["html_is_repr"]
    assert result["parameter_bytes"] == result["expected_parameter_bytes"]
    assert result["activation_bytes"] > 0 and not result["active_after"]
