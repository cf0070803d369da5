"""Specification of the `ridgescope report` command."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

import ridgescope as rs
from conftest import make_mlp, mlp_batch, mlp_loss, train
from inprocess_cli import ridgescope


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "run.rstrace"
    model = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with rs.track(model=model, optimizer=opt, out=path):
        train(model, opt, lambda i: mlp_batch(16, i), mlp_loss, steps=2)
    return path




def test_report_prints_the_text_report(trace):
    out = ridgescope("report", str(trace))
    assert out.returncode == 0, out.stderr
    assert out.stdout == rs.load(trace).summary()
    assert "Peak:" in out.stdout and "AdamW" in out.stdout


def test_report_json_is_the_same_report(trace, tmp_path):
    target = tmp_path / "r.json"
    out = ridgescope("report", str(trace), "--format", "json", "-o", str(target))
    assert out.returncode == 0, out.stderr
    assert json.loads(target.read_text()) == rs.load(trace).to_dict()


def test_the_console_script_is_installed():
    """The `ridgescope` command is installed beside the interpreter and calls ridgescope.cli's
    main (that it runs, with the same output as `python -m ridgescope`, is specified in
    test_cli_run.py)."""
    from importlib.metadata import entry_points
    exe = Path(sys.executable).with_name("ridgescope")
    assert exe.is_file() and os.access(exe, os.X_OK)
    assert "ridgescope.cli" in exe.read_text() and "main" in exe.read_text()
    assert [e.value for e in entry_points(group="console_scripts", name="ridgescope")] == ["ridgescope.cli:main"]


@pytest.mark.parametrize("content", [None, b"garbage", b"\x80\x04garbage"])
def test_bad_input_is_one_line_and_a_nonzero_exit(tmp_path, content):
    path = tmp_path / "bad.rstrace"
    if content is not None:
        path.write_bytes(content)
    out = ridgescope("report", str(path))
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("ridgescope report: error:")


def test_a_truncated_trace_reports_its_prefix_and_warns(trace):
    data = trace.read_bytes()
    trace.write_bytes(data[: len(data) // 2])
    out = ridgescope("report", str(trace))
    assert out.returncode == 0
    assert "warning: The trace is incomplete" in out.stderr


def test_usage_errors_exit_2_with_help():
    out = ridgescope("report", "x.rstrace", "--format", "pdf")
    assert out.returncode == 2 and "invalid choice" in out.stderr
    out = ridgescope("--help")
    assert out.returncode == 0 and "report" in out.stdout


def test_explain_answers_a_request_at_an_instant(trace):
    out = ridgescope("explain", str(trace), "--request", "1MiB", "--at", "0.001")
    assert out.returncode == 0, out.stderr
    assert "At 0.001 s" in out.stdout and "No out-of-memory error" in out.stdout
    bad = ridgescope("explain", str(trace), "--request", "lots")
    assert bad.returncode == 1 and bad.stderr.startswith("ridgescope explain: error: --request")


def test_diff_shows_checkpointing_lowering_activations_and_adding_recompute(tmp_path):
    """Given the same GPT trained with and without activation checkpointing, `ridgescope diff`
    shows the activation peak falling and recomputation appearing inside backward."""
    from conftest import gpt_inputs, make_gpt
    import models
    for name, ckpt in (("plain", False), ("ckpt", True)):
        model = make_gpt(layers=3, checkpointing=ckpt)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with rs.track(model=model, optimizer=opt, out=tmp_path / f"{name}.rstrace"):
            train(model, opt, lambda i: gpt_inputs(16, i), models.gpt_loss, steps=2)
    out = ridgescope("diff", str(tmp_path / "plain.rstrace"), str(tmp_path / "ckpt.rstrace"),
                     "--format", "json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    act = d["peak"]["by_category"]["activation"]
    assert act["b"] < act["a"] and act["change"] == act["b"] - act["a"]
    assert d["phases"]["backward > recompute"]["in"] == "b"
    assert d["phases"]["backward > recompute"]["count_b"] == 3 * 2
    assert d["phases"]["forward"]["peak_b"] < d["phases"]["forward"]["peak_a"]
    text = ridgescope("diff", str(tmp_path / "plain.rstrace"), str(tmp_path / "ckpt.rstrace")).stdout
    assert "only in the second run" in text and "activation" in text
