"""Specification of the HTML report, checked in a real headless Chromium: the report of a real
CPU training run opens from file:// with no network request and no console error, shows the
chart (stacked categories, reserved and capacity lines, phase bands, step boundaries, the peak
marker), every table and the model header, shows the same peak as the report JSON to the byte,
and zooms to one step. A screenshot is saved as a test artifact.

Needs Debian's `chromium` and Python's `playwright` (scripts/setup.sh installs both; playwright
never downloads a browser here: it drives /usr/bin/chromium)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import ridgescope as rs
from ridgescope._reporters._html import HTML_TIMELINE_COLUMNS, render_html
from ridgescope._report import Report
from conftest import ROOT, gpt_inputs, make_gpt, train
import models

CHROMIUM = os.environ.get("RIDGESCOPE_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = ROOT / "build" / "test-artifacts"
CAPACITY = 64 * 1024 * 1024       # known to the report, far above the run: the capacity line
OOM_CAPACITY = 3 * 1024 * 1024    # below the tiny GPT's steady-state peak: one OOM

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - setup.sh installs it
    sync_playwright = None

pytestmark = pytest.mark.skipif(
    sync_playwright is None or shutil.which(CHROMIUM) is None,
    reason=f"needs Python's playwright and Chromium at {CHROMIUM} (scripts/setup.sh installs both)")


def tracked_run(path: Path, capacity: int, steps: int = 3) -> Report:
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    try:
        with rs.track(model=model, optimizer=opt, out=path, capacity=capacity):
            train(model, opt, lambda i: gpt_inputs(16, i), models.gpt_loss, steps=steps)
    except torch.OutOfMemoryError:
        pass  # the OOM run: the trace holds the failure
    return Report.from_trace(path, timeline_columns=HTML_TIMELINE_COLUMNS)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("html")
    out = {}
    for name, capacity in (("train", CAPACITY), ("oom", OOM_CAPACITY)):
        report = tracked_run(d / f"{name}.rstrace", capacity)
        html = d / f"{name}.html"
        report.to_html(html)
        out[name] = (report.to_dict(), html)
    return out


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


class Page:
    """A page opened from file://, recording every request and every console error."""

    def __init__(self, browser, path: Path) -> None:
        self.url = path.resolve().as_uri()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-ready='1']", timeout=15000)

    def attr(self, selector: str, name: str) -> str | None:
        return self.page.get_attribute(selector, name)

    def count(self, selector: str) -> int:
        return self.page.locator(selector).count()

    def attrs(self, selector: str, name: str) -> list[str]:
        return self.page.eval_on_selector_all(selector, f"els => els.map(e => e.getAttribute({name!r}))")

    def visible_range(self) -> tuple[int, int]:
        return int(self.attr("#rs-range", "data-t0")), int(self.attr("#rs-range", "data-t1"))


def test_the_report_of_a_real_run_opens_offline_with_the_chart_and_every_table(runs, browser):
    r, html = runs["train"]
    page = Page(browser, html)
    try:
        # Given the report of a real CPU training run, opened from file://
        # then nothing but the file itself was requested, and nothing went wrong
        assert page.requests == [page.url]
        assert page.errors == []

        # the chart: stacked categories, the reserved and capacity lines, phase bands, step
        # boundaries and the peak marker, all present
        assert page.count("#rs-chart") == 1
        drawn = set(page.attrs(".rs-area", "data-category"))
        at_peak = {c for c, b in r["peak"]["by_category"].items() if b}
        assert at_peak <= drawn
        assert page.count("#rs-reserved-line") == 1
        assert page.attr("#rs-capacity-line", "data-bytes") == str(CAPACITY)
        columns = r["timeline"]["phases"]  # columnar: one entry per phase in each array
        phases = list(zip(columns["begin_time_ns"], columns["end_time_ns"]))
        assert len(phases) == sum(len(s["phases"]) for s in r["steps"]) > 0
        assert page.count(".rs-phase-band") == len(phases)
        assert page.count(".rs-step-line") == len(r["timeline"]["step_ends"]["step"]) == 3

        # the peak shown is the report JSON's, to the byte
        peak = r["peak"]["bytes"]
        assert page.attr("#rs-peak-marker", "data-bytes") == str(peak)
        assert page.attr("#rs-peak-marker", "data-time-ns") == str(r["peak"]["time_ns"])
        assert page.attr("#rs-peak-value", "data-bytes") == str(peak)
        assert page.page.text_content("#rs-peak-exact") == f"{peak:,} bytes"
        shown = {e["category"]: int(e["bytes"]) for e in page.page.eval_on_selector_all(
            "#rs-peak-composition tr", "els => els.map(e => ({category: e.dataset.category, bytes: e.dataset.bytes}))")}
        assert shown == {c: b for c, b in r["peak"]["by_category"].items() if b}
        # and hovering the marker tells its composition
        page.page.hover("#rs-peak-marker")
        assert page.page.is_visible("#rs-peak-tip")
        assert f"{peak:,} bytes" in page.page.text_content("#rs-tooltip")

        # every table: steps with their phases, the blocks live at the peak, activation bytes
        # per module, live bytes per label
        assert page.attrs("#rs-table-steps tr.rs-step-row", "data-peak-bytes") == [str(s["peak_bytes"]) for s in r["steps"]]
        assert page.attrs("#rs-table-steps tr.rs-phase-row", "data-peak-bytes") == [
            str(p["peak_bytes"]) for s in r["steps"] for p in s["phases"]]
        assert page.attrs("#rs-table-blocks tbody tr", "data-bytes") == [str(b["bytes"]) for b in r["peak"]["top_blocks"]]
        activations = [l for l in r["peak"]["by_label"] if l["category"] == "activation"]
        assert activations, "the run saves activations, so the module table has rows"
        assert page.attrs("#rs-table-modules tbody tr[data-module]", "data-bytes") == [str(l["bytes"]) for l in activations]
        assert page.attrs("#rs-table-labels tbody tr", "data-bytes") == [str(l["bytes"]) for l in r["peak"]["by_label"]]
        # the model and optimizer header
        assert "TinyGPT" in page.page.text_content("#rs-model")
        assert "AdamW" in page.page.text_content("#rs-optimizer")
        assert page.count("#rs-ooms:not([hidden])") == 0  # no OOM in this run

        # zooming to one step narrows the visible range to that step
        full = page.visible_range()
        assert full[0] == 0 and full[1] >= r["trace"]["duration_ns"]
        step = r["steps"][r["peak"]["step"]]
        page.page.select_option("#rs-step-select", str(step["step"]))
        t0, t1 = page.visible_range()
        assert (t0, t1) != full
        span = step["end_time_ns"] - step["begin_time_ns"]
        assert step["begin_time_ns"] - span * 0.05 <= t0 <= step["begin_time_ns"]
        assert step["end_time_ns"] <= t1 <= step["end_time_ns"] + span * 0.05
        assert page.attr("#rs-chart", "data-t0") == str(t0)
        # only the phases in view are drawn (that step's, and the edges of its neighbours), and
        # the peak (in this step) is still marked
        in_view = [(b, e) for b, e in phases if e >= t0 and b <= t1]
        assert len(step["phases"]) <= len(in_view) < len(phases)
        assert page.count(".rs-phase-band") == len(in_view)
        assert page.attr("#rs-peak-marker", "data-bytes") == str(peak)

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "html-report.png"
        page.page.screenshot(path=str(shot))
        print(f"screenshot: {shot}")

        # a dragged range zooms further; Reset brings the whole run back
        box = page.page.locator("#rs-chart-hit").bounding_box()
        y = box["y"] + box["height"] / 2
        page.page.mouse.move(box["x"] + box["width"] * 0.3, y)
        page.page.mouse.down()
        page.page.mouse.move(box["x"] + box["width"] * 0.6, y, steps=4)
        page.page.mouse.up()
        d0, d1 = page.visible_range()
        assert t0 < d0 < d1 < t1
        page.page.click("#rs-reset")
        assert page.visible_range() == full
        assert page.errors == []
        assert page.requests == [page.url]
    finally:
        page.page.close()


def test_an_out_of_memory_run_marks_the_failure_and_shows_its_verdict(runs, browser):
    r, html = runs["oom"]
    assert len(r["ooms"]) == 1
    oom = r["ooms"][0]
    page = Page(browser, html)
    try:
        assert page.requests == [page.url]
        assert page.errors == []
        assert page.attrs(".rs-oom-marker", "data-request-bytes") == [str(oom["request_bytes"])]
        assert page.attr("#rs-capacity-line", "data-bytes") == str(OOM_CAPACITY)
        assert page.attr("#rs-oom-0", "data-request-bytes") == str(oom["request_bytes"])
        assert page.page.text_content("#rs-oom-0 .rs-verdict") == oom["verdict"]["summary"]
        assert page.count("#rs-oom-0 .rs-remedies li") == len(oom["verdict"]["remedies"]) > 0
    finally:
        page.page.close()


def test_text_from_the_trace_cannot_break_out_of_the_page(runs, browser, tmp_path):
    # Given a report whose labels hold markup that would end the embedded script
    r, _ = runs["train"]
    data = json.loads(json.dumps(r))
    hostile = "</script><script>document.title='pwned'</script><!-- & <b>x</b>"
    data["peak"]["top_blocks"][0]["label"] = hostile
    text = render_html(data)
    # then the page holds exactly its own two closing script tags, and the label reads back as text
    assert text.lower().count("</script") == 2
    path = tmp_path / "hostile.html"
    path.write_text(text, encoding="utf-8")
    page = Page(browser, path)
    try:
        assert page.errors == []
        assert page.page.title().startswith("ridgescope report")
        assert page.page.text_content("#rs-table-blocks tbody tr:first-child td:nth-child(3)") == hostile
    finally:
        page.page.close()


def test_an_empty_trace_still_opens_cleanly(browser, tmp_path):
    # Given a trace that is only its 16-byte file header (no event at all)
    trace = tmp_path / "empty.rstrace"
    trace.write_bytes(b"RIDGESCP" + (1).to_bytes(4, "little") + bytes(4))
    report = Report.from_trace(trace, timeline_columns=HTML_TIMELINE_COLUMNS)
    path = tmp_path / "empty.html"
    report.to_html(path)
    page = Page(browser, path)
    try:
        # then the page says there is nothing, without an error, and marks no peak
        assert page.errors == []
        assert page.requests == [page.url]
        assert page.attr("#rs-peak-value", "data-bytes") == "0"
        assert page.count("#rs-peak-marker") == 0
        assert page.count("#rs-table-steps tbody tr") == 1  # "The trace has no steps."
        assert page.count("#rs-chart") == 1
    finally:
        page.page.close()


def test_a_report_read_from_a_pytorch_snapshot_says_what_was_inferred(browser, tmp_path):
    # Given a snapshot pickle written the way PyTorch writes it (no ridgescope categories)
    import pickle
    from test_snapshot import torch_like_snapshot
    snap = tmp_path / "torch_snapshot.pickle"
    snap.write_bytes(pickle.dumps(torch_like_snapshot()))
    report = rs.load(snap, timeline_columns=HTML_TIMELINE_COLUMNS)
    path = tmp_path / "snapshot.html"
    # when its HTML report is opened
    report.to_html(path)
    page = Page(browser, path)
    try:
        # then it shows the same peak and says that categories, phases and sizes were inferred
        assert page.errors == [] and page.requests == [page.url]
        assert int(page.attr("#rs-peak-value", "data-bytes")) == report.to_dict()["peak"]["bytes"]
        provenance = page.page.inner_text("#rs-warnings [data-kind='snapshot']")
        assert "written by pytorch" in provenance
        assert "categories, phases, block sizes" in provenance
        assert page.count("#rs-warnings [data-kind='snapshot_note']") == len(report.to_dict()["snapshot"]["notes"])
        # and next to the peak's composition, how its bytes were decided: the weaker rules' share,
        # their bytes per category and the rules themselves, as the JSON says
        d = report.to_dict()
        conf = d["snapshot"]["confidence"]
        assert float(page.attr("#rs-peak-confidence", "data-weak-share")) == pytest.approx(conf["weak_share_of_peak"])
        for c, n in d["peak"]["by_category"].items():
            if n:
                cell = f"#rs-peak-composition tr[data-category='{c}'] td.rs-weak"
                assert int(page.attr(cell, "data-weak-bytes")) == conf["peak_by_evidence"]["weak"][c]
        shown = [r for r in d["snapshot"]["reasons"] if r["peak_bytes"] > 0][:12]
        assert page.count("#rs-peak-reasons tr[data-rule]") == len(shown)
    finally:
        page.page.close()


def test_every_model_the_run_held_is_listed_with_its_bytes(browser, tmp_path):
    """Given a run with a frozen deepcopy of the trained model (a DPO-style reference), then the
    model card lists both models, each with its bytes at the peak as in the report JSON."""
    import copy
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with rs.track(model=model, optimizer=opt, out=tmp_path / "two.rstrace"):
        ref_model = copy.deepcopy(model).requires_grad_(False)
        train(model, opt, lambda i: gpt_inputs(4, i), models.gpt_loss, steps=1)
    report = Report.from_trace(tmp_path / "two.rstrace", timeline_columns=HTML_TIMELINE_COLUMNS)
    path = tmp_path / "two.html"
    report.to_html(path)
    listed = {m["name"]: m for m in report.to_dict()["model"]["models"]}
    assert sorted(listed) == ["model", "ref_model"] and ref_model is not None
    page = Page(browser, path)
    try:
        assert page.errors == []
        assert page.attrs("#rs-models tr[data-model]", "data-model") == list(listed)
        assert page.attrs("#rs-models tr[data-model]", "data-bytes") == [
            str(m["at_peak"]["parameter_bytes"] + m["at_peak"]["buffer_bytes"]) for m in listed.values()]
    finally:
        page.page.close()


def test_the_host_memory_layers_and_a_device_ledger_are_drawn_beside_the_composition(runs, browser, tmp_path):
    # Given the report of the real CPU run: its host readings are listed, to the byte of the JSON
    r, html = runs["train"]
    page = Page(browser, html)
    try:
        assert page.errors == []
        rows = r["host_memory"]["rows"]
        assert page.count("#rs-host-memory tbody tr") == len(rows)
        first = page.attrs("#rs-host-memory tbody tr:first-child td.rs-num", "data-bytes")
        o = rows[0]["outside"]
        assert first == [str(v) for v in (rows[0]["resident_bytes"], rows[0]["pytorch_bytes"], rows[0]["untouched_bytes"],
                                          rows[0]["allocator_slack_bytes"], rows[0]["outside_bytes"], o["files_bytes"],
                                          o["shared_memory_bytes"], o["other_heap_bytes"], o["remainder_bytes"])]
    finally:
        page.page.close()
    # and a device ledger (a CUDA report's section, with CUPTI refused) says why it is not itemised.
    data = json.loads(json.dumps(r))
    data["device_ledger"] = {
        "available": True, "reason": "", "driver_source": "process", "other_processes": 0, "itemised": False,
        "itemise_reason": "CUPTI is in use by another tool", "readings": 1, "total_bytes": 8 << 30,
        "context_bytes": 500 << 20, "modules_loaded": 0, "module_bytes": 0, "outside_inside_reserved": 0,
        "at_peak": {"time_ns": 1, "step": 0, "phase": "forward", "driver_bytes": 2600 << 20, "reserved_bytes": 2 << 30,
                    "outside_bytes": 0, "context_bytes": 500 << 20, "unexplained_bytes": 52 << 20, "exact": True},
        "max_driver": None, "last": None, "rows": [], "rows_dropped": 0, "groups": []}
    path = tmp_path / "ledger.html"
    path.write_text(render_html(data), encoding="utf-8")
    page = Page(browser, path)
    try:
        assert page.errors == []
        assert page.attrs("#rs-device-ledger td.rs-num", "data-bytes") == [
            str(2600 << 20), str(2 << 30), "0", str(500 << 20), str(52 << 20)]
        assert "CUPTI is in use by another tool" in page.page.text_content("#rs-not-itemised")
    finally:
        page.page.close()
