"""Specification of the HTML report's allocation sites (docs/sites.md, docs/html-report.md),
checked in a real headless Chromium: the flame graph (icicle) of the peak by stack, drawn by the
page's own code from the embedded report, opens from file:// with no network request and no
console error; its total equals the peak bytes and its top frames add up to it; a frame is
coloured by the category that holds most of its bytes; clicking a frame zooms into it and Reset
comes back; the allocation-sites table and the blocks table name the same sites as the JSON.

Needs Debian's `chromium` and Python's playwright (scripts/setup.sh installs both)."""
from __future__ import annotations

import inspect
import os
import shutil

import pytest
import torch

import ridgescope as rs
from ridgescope._reporters._html import HTML_TIMELINE_COLUMNS
from conftest import gpt_inputs, make_gpt
import models

CHROMIUM = os.environ.get("RIDGESCOPE_CHROMIUM", "/usr/bin/chromium")
MARKER_BYTES = 654_321

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - setup.sh installs it
    sync_playwright = None

pytestmark = pytest.mark.skipif(
    sync_playwright is None or shutil.which(CHROMIUM) is None,
    reason=f"needs Python's playwright and Chromium at {CHROMIUM} (scripts/setup.sh installs both)")

COLORS = {  # the page's category colours (report.js)
    "unknown": "#9ea7b3", "parameter": "#4e79a7", "buffer": "#76b7b2", "gradient": "#f28e2b",
    "optimizer_state": "#e15759", "activation": "#59a14f", "input": "#edc948", "temporary": "#b07aa1",
    "workspace": "#ff9da7", "comm_buffer": "#9c755f"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tracked TinyGPT run with whole Python stacks, keeping a marker tensor made at a known
    line live at the peak; its report and HTML page."""
    d = tmp_path_factory.mktemp("flame")
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    path = d / "run.rstrace"
    with rs.track(model=model, optimizer=opt, out=path, stacks="python"):
        for i in range(2):
            x, y = gpt_inputs(8, i)
            opt.zero_grad(set_to_none=True)
            loss = models.gpt_loss(model, x, y)
            marker = torch.empty(MARKER_BYTES, dtype=torch.uint8); line = inspect.currentframe().f_lineno  # noqa: E702
            loss.backward()
            opt.step()
            del marker
    report = rs.Report.from_trace(path, timeline_columns=HTML_TIMELINE_COLUMNS)
    html = d / "run.html"
    report.to_html(html)
    return report.to_dict(), html, line


@pytest.fixture(scope="module")
def page(run):
    _, html, _ = run
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        pg = browser.new_page(viewport={"width": 1280, "height": 900})
        requests, errors = [], []
        pg.on("request", lambda r: requests.append(r.url))
        pg.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(html.resolve().as_uri())
        pg.wait_for_selector("body[data-ready='1']", timeout=15000)
        yield pg, requests, errors, html.resolve().as_uri()
        browser.close()


def nodes(pg, selector: str = ".rs-flame-node") -> list[dict]:
    return pg.eval_on_selector_all(selector, """els => els.map(e => ({
        bytes: Number(e.dataset.bytes), depth: Number(e.dataset.depth), category: e.dataset.category,
        label: e.dataset.label, fill: e.querySelector('rect').getAttribute('fill')}))""")


def test_the_flame_graph_renders_offline_and_its_total_is_the_peak(run, page):
    """Given the HTML report of the run opened from file://, then nothing but the file was
    requested and nothing went wrong; the icicle's root holds the peak bytes exactly, the frames
    under it add up to the same bytes, and every frame is coloured by its dominant category."""
    r, _, line = run
    pg, requests, errors, url = page
    assert requests == [url]
    assert errors == []
    peak = r["peak"]["bytes"]
    assert int(pg.get_attribute("#rs-flame-root", "data-bytes")) == peak
    assert int(pg.get_attribute("#rs-flame", "data-total-bytes")) == peak
    assert int(pg.get_attribute("#rs-flame", "data-children-bytes")) == peak
    drawn = nodes(pg)
    assert len({n["depth"] for n in drawn}) > 5  # whole stacks: many levels
    for n in drawn:
        if n["depth"] > 0:
            assert n["fill"] == COLORS[n["category"]], n
    # the marker's own frame is drawn, as wide as its bytes, named by its file and line
    marker = [n for n in drawn if n["label"] == f"test_html_flame.py:{line} in run"]
    assert [n["bytes"] for n in marker] == [MARKER_BYTES]
    assert marker[0]["category"] == "unknown"


def test_clicking_a_frame_zooms_into_it_and_reset_comes_back(run, page):
    """When a frame is clicked, the icicle shows that frame on top with its own bytes; Reset
    shows the whole peak again."""
    r, _, _ = run
    pg, _, errors, _ = page
    target = max((n for n in nodes(pg) if n["depth"] == 1), key=lambda n: n["bytes"])
    pg.click(f".rs-flame-node[data-depth='1'][data-label='{target['label']}']")
    assert int(pg.get_attribute("#rs-flame", "data-total-bytes")) == target["bytes"]
    assert int(pg.get_attribute("#rs-flame-root", "data-bytes")) == target["bytes"]
    pg.click("#rs-flame-reset")
    assert int(pg.get_attribute("#rs-flame", "data-total-bytes")) == r["peak"]["bytes"]
    assert errors == []


def test_the_sites_table_and_the_blocks_table_name_the_sites(run, page):
    """The allocation-sites table lists the JSON's rows (bytes by site and category) in order,
    and the blocks table shows each block's site."""
    r, _, line = run
    pg, _, _, _ = page
    rows = pg.eval_on_selector_all("#rs-table-sites tbody tr[data-site]",
                                   "els => els.map(e => [e.dataset.site, e.dataset.category, Number(e.dataset.bytes)])")
    assert rows == [[s["site"], s["category"], s["bytes"]] for s in r["peak"]["by_site"]]
    sites = pg.eval_on_selector_all("#rs-table-blocks tbody td.rs-site", "els => els.map(e => e.textContent)")
    assert sites == [b["site"] or "—" for b in r["peak"]["top_blocks"]]
    assert f"test_html_flame.py:{line} in run" in sites
