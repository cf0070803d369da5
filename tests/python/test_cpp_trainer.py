"""Specification: a libtorch C++ trainer (examples/cpp/train_mlp.cpp, built by scripts/test.sh
against the installed C++ package) gets the same answers as the same model trained from Python.

The trainer's path comes from RIDGESCOPE_CPP_TRAINER, which scripts/test.sh sets after
building it; under CI the test fails rather than skips when it is missing."""
from __future__ import annotations

import os
import subprocess

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import ridgescope as rs

TRAINER = os.environ.get("RIDGESCOPE_CPP_TRAINER")
BATCH, STEPS = 64, 3


@pytest.fixture(scope="module")
def cpp_report(tmp_path_factory):
    if not TRAINER:
        if os.environ.get("CI"):
            pytest.fail("RIDGESCOPE_CPP_TRAINER is not set: scripts/test.sh builds the C++ trainer")
        pytest.skip("RIDGESCOPE_CPP_TRAINER not set (run scripts/test.sh to build the C++ trainer)")
    prefix = tmp_path_factory.mktemp("cpp") / "run"
    out = subprocess.run([TRAINER, "--out", str(prefix), "--steps", str(STEPS), "--batch", str(BATCH)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return prefix


class MLP(nn.Module):
    """The model of examples/cpp/train_mlp.cpp."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(128, 256), nn.Linear(256, 256), nn.Linear(256, 10)

    def forward(self, x):
        return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


def python_report(path):
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with rs.track(model=model, optimizer=opt, out=path) as s:
        for _ in range(STEPS):
            x, y = torch.randn(BATCH, 128), torch.randint(0, 10, (BATCH,))
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    return model, s.report().to_dict()


def phases(r, name):
    return [p for s in r["steps"] for p in s["phases"] if p["phase"] == name]


def activation_peak(r):
    return max(max(p["peak_by_category"]["activation"], p["end_by_category"]["activation"])
               for s in r["steps"] for p in s["phases"])


def test_the_cpp_trace_opens_with_the_python_tools(cpp_report):
    r = rs.load(f"{cpp_report}.rstrace").to_dict()
    assert r["model"]["class"] == "MLPImpl"
    assert r["optimizer"]["type"] == "Adam"
    assert len(r["steps"]) == STEPS
    assert r["consistency"]["samples"] > 0 and r["consistency"]["mismatches"] == 0
    # the JSON the C++ program wrote is the same report
    import json
    from pathlib import Path
    assert json.loads(Path(f"{cpp_report}.json").read_text()) == r


def test_cpp_and_python_agree_on_the_bytes(cpp_report, tmp_path):
    """Given the same model trained from C++ and from Python, parameter and gradient bytes are
    equal, optimizer state differs exactly by Python's step counters (4-byte tensors there, an
    int64 field in libtorch's Adam), and the activation peaks agree within 5 % (C++ infers
    activations from lifetimes, Python tags them with the saved-tensor hook)."""
    cpp = rs.load(f"{cpp_report}.rstrace").to_dict()
    model, py = python_report(tmp_path / "py.rstrace")
    p_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    n_tensors = len(list(model.parameters()))
    for r in (cpp, py):
        assert r["model"]["parameter_bytes"] == p_bytes
        assert r["peak"]["by_category"]["parameter"] == p_bytes
        assert all(p["end_by_category"]["gradient"] == p_bytes for p in phases(r, "backward"))
    assert phases(cpp, "optimizer_step")[0]["end_by_category"]["optimizer_state"] == 2 * p_bytes
    assert phases(py, "optimizer_step")[0]["end_by_category"]["optimizer_state"] == 2 * p_bytes + 4 * n_tensors
    assert activation_peak(cpp) == pytest.approx(activation_peak(py), rel=0.05)
    assert cpp["peak"]["inferred_by_category"]["activation"] == cpp["peak"]["by_category"]["activation"]
