"""Specification: a simulated device capacity makes a real CPU training loop run out of memory
the way a GPU would, and the trace records the failure before the exception reaches the loop."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ridgescope as rs
from ridgescope import _C
from ridgescope._format import parse_bytes
from conftest import gpt_inputs, make_gpt, train
from inprocess_cli import ridgescope
import models

CAPACITY = 3 * 1024 * 1024  # below the tiny GPT's steady-state peak


def test_a_training_loop_past_the_capacity_raises_torch_out_of_memory(trace_path):
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(torch.OutOfMemoryError, match="simulated capacity"):
        with rs.track(model=model, optimizer=opt, out=trace_path, capacity=CAPACITY):
            train(model, opt, lambda i: gpt_inputs(16, i), models.gpt_loss, steps=3)
    assert not _C._cpu_allocator_installed()  # restored on the way out
    r = rs.load(trace_path).to_dict()
    assert r["device_capacity_bytes"] == CAPACITY
    assert len(r["ooms"]) == 1
    oom = r["ooms"][0]
    assert oom["phase"] in ("forward", "backward", "optimizer_step")
    assert oom["live_bytes"] + oom["request_bytes"] > CAPACITY
    assert oom["device_free_bytes"] == CAPACITY - oom["live_bytes"]
    assert sum(oom["by_category"].values()) == oom["live_bytes"]
    assert r["peak"]["bytes"] <= CAPACITY
    assert r["consistency"]["mismatches"] == 0


def test_without_the_capacity_the_same_loop_runs(trace_path):
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with rs.track(model=model, optimizer=opt, out=trace_path) as s:
        train(model, opt, lambda i: gpt_inputs(16, i), models.gpt_loss, steps=3)
    assert s.report().peak_bytes > CAPACITY  # so the test above really crosses the limit


SCRIPT = r"""
import sys, torch
sys.path.insert(0, {examples!r})
import ridgescope as rs
from models import TinyGPT, gpt_batch, gpt_loss
torch.manual_seed(0)
model = TinyGPT(vocab=256, d_model=64, layers=2, seq_len=32)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
session = rs.track(model=model, optimizer=opt, out={path!r}, capacity={capacity})
session.start()
for step in range(5):
    x, y = gpt_batch(16, 32, 256, seed=step)
    opt.zero_grad()
    gpt_loss(model, x, y).backward()
    opt.step()
"""


def test_the_oom_is_on_disk_even_if_the_process_then_dies(trace_path):
    """Given a script that never catches the OOM (and never stops its session), when it dies
    of it, then its trace already holds the failed request."""
    examples = str(Path(__file__).resolve().parents[2] / "examples")
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(examples=examples, path=str(trace_path),
                                                              capacity=CAPACITY)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "OutOfMemoryError" in out.stderr
    r = rs.load(trace_path).to_dict()
    assert len(r["ooms"]) == 1 and r["ooms"][0]["request_bytes"] > 0


@pytest.mark.parametrize("text,expected", [("2GiB", 2 * 1024**3), ("1.5 GB", 1_500_000_000),
                                           ("512MiB", 512 * 1024**2), ("1000", 1000), (4096, 4096)])
def test_capacities_are_read_with_their_units(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["-1GiB", "lots", "3 parsecs", 0, True, 1.5])
def test_a_bad_capacity_is_refused_at_the_call(bad, trace_path):
    with pytest.raises(ValueError, match="capacity"):
        rs.track(out=trace_path, capacity=bad)


def dry_run_phase_peaks(model_fn, batch_fn, loss_fn, tmp_path):
    model = model_fn()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with rs.track(model=model, optimizer=opt, out=tmp_path / "dry.rstrace") as s:
        train(model, opt, batch_fn, loss_fn, steps=2)
    return {(p["step"], p["phase"]): p["peak_bytes"] for st in s.report().steps for p in st["phases"]}


def test_a_real_loop_that_fails_at_its_first_optimizer_step_gets_the_lazy_state_verdict(tmp_path):
    """Given a capacity above the first forward and backward but below what the first AdamW
    step adds, the OOM is in step 0's optimizer step and the verdict names lazy optimizer state
    with optimizer-state remedies only."""
    from conftest import make_mlp, mlp_batch, mlp_loss
    peaks = dry_run_phase_peaks(make_mlp, lambda i: mlp_batch(4, i), mlp_loss, tmp_path)
    capacity = max(peaks[(0, "forward")], peaks[(0, "backward")]) + 1024
    assert capacity < peaks[(0, "optimizer_step")]
    model = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(torch.OutOfMemoryError):
        with rs.track(model=model, optimizer=opt, out=tmp_path / "lazy.rstrace", capacity=capacity):
            train(model, opt, lambda i: mlp_batch(4, i), mlp_loss, steps=2)
    oom = rs.load(tmp_path / "lazy.rstrace").to_dict()["ooms"][0]
    assert (oom["step"], oom["phase"]) == (0, "optimizer_step")
    assert oom["verdict"]["kind"] == "lazy_optimizer_state"
    actions = " ".join(r["action"] for r in oom["verdict"]["remedies"])
    assert "optimizer state" in actions and "checkpointing" not in actions


def test_a_real_loop_that_fails_in_its_first_forward_gets_the_activation_verdict(tmp_path):
    peaks = dry_run_phase_peaks(make_gpt, lambda i: gpt_inputs(16, i), models.gpt_loss, tmp_path)
    capacity = peaks[(0, "forward")] * 3 // 4
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(torch.OutOfMemoryError):
        with rs.track(model=model, optimizer=opt, out=tmp_path / "act.rstrace", capacity=capacity):
            train(model, opt, lambda i: gpt_inputs(16, i), models.gpt_loss, steps=2)
    oom = rs.load(tmp_path / "act.rstrace").to_dict()["ooms"][0]
    assert (oom["step"], oom["phase"]) == (0, "forward")
    assert oom["verdict"]["kind"] == "live_tensors"
    assert oom["verdict"]["dominant_category"] == "activation"
    actions = " ".join(r["action"] for r in oom["verdict"]["remedies"])
    assert "checkpointing" in actions and "optimizer state" not in actions


def test_explain_prints_the_verdict_and_the_dashboards(tmp_path):
    test_a_real_loop_that_fails_in_its_first_forward_gets_the_activation_verdict(tmp_path)
    out = ridgescope("explain", str(tmp_path / "act.rstrace"))
    assert out.returncode == 0, out.stderr
    assert "Why (live_tensors)" in out.stdout and "What to change" in out.stdout
    assert "a dashboard sampling every 15 s" in out.stdout


def test_absent_nvml_is_reported_not_fatal(trace_path):
    """On a machine without the NVIDIA driver, asking for the driver's view still tracks the
    run, and the report says NVML was absent and why."""
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with rs.track(model=model, optimizer=opt, out=trace_path, driver_view=True) as s:
        train(model, opt, lambda i: gpt_inputs(8, i), models.gpt_loss, steps=1)
    dv = s.report().to_dict()["driver_view"]
    if torch.cuda.is_available():  # a GPU machine: NVML must be there and sampling
        assert dv["available"] is True and dv["samples"] > 0
    else:
        assert dv["available"] is False
        assert "NVML" in dv["reason"]
    assert s.report().steps  # tracking went on either way


def test_an_oom_inside_track_prints_the_verdict_before_the_exception_arrives(trace_path, capsys):
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(torch.OutOfMemoryError):
        with rs.track(model=model, optimizer=opt, out=trace_path, capacity=CAPACITY):
            train(model, opt, lambda i: gpt_inputs(16, i), models.gpt_loss, steps=3)
    err = capsys.readouterr().err
    assert "ridgescope: out of memory" in err and "Why (" in err and "What to change" in err
    assert f"ridgescope explain {trace_path}" in err
