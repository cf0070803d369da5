"""Specification of the HTML report from the command line (no browser needed here; the page
itself is checked in Chromium by test_html_report.py): `ridgescope report --format html`,
`ridgescope run` writing the page beside the trace, the page's bounded data, and the progress
bar that appears on a terminal only."""
from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import ridgescope as rs
from ridgescope._reporters._html import HTML_MAX_STEPS, page_data
from ridgescope._progress import Progress
from conftest import ROOT, make_mlp, mlp_batch, mlp_loss, train
from inprocess_cli import ridgescope
from ridgescope.cli import main as cli_main

CLI = [sys.executable, "-m", "ridgescope.cli"]
DATA = re.compile(r'<script type="application/json" id="rs-data">(.*?)</script>', re.S)


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli_html") / "mlp.rstrace"
    model = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with rs.track(model=model, optimizer=opt, out=path):
        train(model, opt, lambda i: mlp_batch(8, i), mlp_loss, steps=2)
    return path


def embedded(html: str) -> dict:
    m = DATA.search(html)
    assert m, "the page embeds the report as JSON"
    return json.loads(m.group(1))


def test_report_format_html_writes_one_self_contained_page(trace, tmp_path):
    out = tmp_path / "run.html"
    # When the report is asked for as HTML, with standard error a pipe (not a terminal)
    p = ridgescope("report", str(trace), "--format", "html", "-o", str(out))
    assert p.returncode == 0, p.stderr
    # then standard error says only where the page went: no progress bar outside a terminal
    assert p.stderr == f"wrote {out}\n"
    html = out.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>")
    # nothing is fetched: no src/href to anything but data: URLs, and a CSP that forbids it
    assert not re.search(r'\b(?:src|href)\s*=\s*"(?!data:)', html)
    assert "default-src 'none'" in html
    # and the embedded data is the report: the same peak, to the byte, as --format json
    j = ridgescope("report", str(trace), "--format", "json")
    assert j.returncode == 0, j.stderr
    report = json.loads(j.stdout)
    data = embedded(html)
    assert data["peak"] == report["peak"]
    assert data["steps"] == report["steps"]
    # with a finer timeline than the JSON's default
    assert data["timeline"]["columns"] > report["timeline"]["columns"]
    assert max(data["timeline"]["max_bytes"]) == report["peak"]["bytes"]


def test_ridgescope_run_writes_the_html_report_beside_the_trace(tmp_path):
    script = ROOT / "examples" / "train_plain.py"
    p = subprocess.run([*CLI, "run", "-o", str(tmp_path / "plain.rstrace"), str(script), "--steps", "1"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    html = tmp_path / "plain.html"
    assert f"ridgescope: HTML report {html}" in p.stderr
    data = embedded(html.read_text(encoding="utf-8"))
    assert data["peak"]["bytes"] == rs.load(tmp_path / "plain.rstrace").peak_bytes
    assert "\r" not in p.stderr  # no progress bar in a pipe


def test_a_long_run_lists_a_bounded_number_of_steps_keeping_the_peak_step():
    # Given a report of 1000 steps whose peak is in step 700
    steps = [{"step": i, "peak_bytes": 1000 + (i % 7), "phases": []} for i in range(1000)]
    steps[700]["peak_bytes"] = 5000
    data = {"peak": {"step": 700, "bytes": 5000}, "steps": steps}
    page = page_data(data)
    kept = [s["step"] for s in page["steps"]]
    # then the page lists at most HTML_MAX_STEPS of them, in order, with the peak's step and
    # its neighbours, the first and the last, and says how many there were
    assert len(kept) == HTML_MAX_STEPS
    assert kept == sorted(kept)
    assert {0, 1, 695, 700, 705, 998, 999} <= set(kept)
    assert page["html_steps"] == {"total": 1000, "listed": HTML_MAX_STEPS}
    assert data["steps"] is steps and len(steps) == 1000  # the report itself is untouched
    # and a short run is embedded whole
    short = {"peak": {"step": 0}, "steps": steps[:10]}
    assert page_data(short) is short


def test_the_progress_bar_draws_only_on_a_terminal():
    # Given a stream that is not a terminal, nothing is written at all
    pipe = io.StringIO()
    with Progress(["analysing the trace", "rendering"], stream=pipe) as progress:
        with progress.stage("analysing the trace"):
            time.sleep(0.05)
        with progress.stage("rendering"):
            pass
    assert pipe.getvalue() == ""

    # Given a terminal, the bar is drawn in place, names its stage, and is erased at the end
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Terminal()
    with Progress(["analysing the trace", "rendering"], stream=tty, interval_s=0.01) as progress:
        with progress.stage("analysing the trace"):
            time.sleep(0.05)
        with progress.stage("rendering"):
            pass
    text = tty.getvalue()
    assert "1/2 analysing the trace" in text
    assert "2/2 rendering" in text
    assert "[" + "#" * 24 + "]" in text  # both stages done: a full bar
    assert text.count("\r") >= 4  # redrawn in place, several times
    assert text.endswith("\r")  # the line is left blank for what follows


def test_the_command_line_shows_progress_on_a_real_terminal(trace, tmp_path, capsys):
    # When standard error is a pseudo-terminal (the command run in this process, its stderr the
    # terminal's other end, read as it is written), the bar appears there (and nothing on stdout)
    out = tmp_path / "tty.html"
    primary, secondary = pty.openpty()
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(primary, 4096)
            except OSError:  # EIO: the terminal's other end is closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        with open(secondary, "w", encoding="utf-8", closefd=True) as terminal, \
                contextlib.redirect_stderr(terminal):
            assert sys.stderr.isatty()
            code = cli_main(["report", str(trace), "--format", "html", "-o", str(out)])
    finally:
        reader.join(timeout=60)
        os.close(primary)
    text = b"".join(chunks).decode(errors="replace")
    assert code == 0
    assert "analysing the trace" in text and "rendering the report" in text
    assert f"wrote {out}" in text
    assert capsys.readouterr().out == ""
