"""Specification: a libtorch C++ trainer as C++ users write one (examples/cpp_convnet: a small
convolutional net, a torch::data dataset and loader, SGD with momentum, torch::save checkpoints,
every phase marked with a PhaseGuard) gets a report with the exact persistent bytes, its
checkpoint phases, and a trace that agrees with the allocator throughout.

scripts/test.sh builds the trainer against a plain libtorch, with no Python involved (the CPU
torch 2.13.0 wheel, unpacked), through the installed package alone, and names the binary in
RIDGESCOPE_CPP_CONVNET and the libtorch release in RIDGESCOPE_CPP_CONVNET_TORCH. Under CI the
test fails rather than skips when the binary is missing. The truth is torch's own: the same
model and optimizer built in Python."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

import ridgescope as rs

TRAINER = os.environ.get("RIDGESCOPE_CPP_CONVNET")
LIBTORCH = os.environ.get("RIDGESCOPE_CPP_CONVNET_TORCH")
EPOCHS, BATCH, SAMPLES = 2, 32, 128
STEPS = EPOCHS * SAMPLES // BATCH


class ConvNet(nn.Module):
    """The model of examples/cpp_convnet/train_convnet.cpp."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 8 * 8, 10)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    if not TRAINER:
        if os.environ.get("CI"):
            pytest.fail("RIDGESCOPE_CPP_CONVNET is not set: scripts/test.sh builds the C++ trainer")
        pytest.skip("RIDGESCOPE_CPP_CONVNET not set (run scripts/test.sh to build the libtorch trainer)")
    prefix = tmp_path_factory.mktemp("convnet") / "run"
    out = subprocess.run([TRAINER, "--out", str(prefix), "--epochs", str(EPOCHS), "--batch", str(BATCH),
                          "--samples", str(SAMPLES)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return prefix, out.stdout, json.loads(Path(f"{prefix}.json").read_text())


@pytest.fixture(scope="module")
def truth():
    """Bytes that torch itself gives for the trainer's model, optimizer and batch."""
    model = ConvNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # creates the momentum buffers
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    images = torch.stack([torch.empty(3, 32, 32) for _ in range(BATCH)])
    labels = torch.stack([torch.empty((), dtype=torch.long) for _ in range(BATCH)])
    return {
        "parameter": nbytes(model.parameters()),
        "buffer": nbytes(model.buffers()),
        "optimizer_state": nbytes(s["momentum_buffer"] for s in opt.state.values()),
        "input": nbytes([images, labels]),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def phases(r, name):
    return [p for s in r["steps"] for p in s["phases"] if p["phase"] == name]


def test_parameter_gradient_optimizer_state_and_buffer_bytes_are_exact(run, truth):
    """Given the trainer's report, when its phases are read, then parameters, buffers, the
    gradients at every backward end and the momentum buffers at every optimizer_step end are
    exactly the bytes torch gives for the same model and optimizer; zero_grad (set_to_none)
    leaves no gradient."""
    _, _, r = run
    p_bytes = truth["parameter"]
    assert r["model"]["parameters"] == truth["parameters"]
    assert r["model"]["parameter_bytes"] == p_bytes
    assert r["model"]["buffer_bytes"] == truth["buffer"]
    assert r["peak"]["by_category"]["parameter"] == p_bytes
    assert r["optimizer"]["type"] == "SGD" and r["optimizer"]["state_bytes"] == truth["optimizer_state"]
    assert len(phases(r, "backward")) == len(phases(r, "optimizer_step")) == STEPS
    assert all(p["end_by_category"]["gradient"] == p_bytes for p in phases(r, "backward"))
    assert all(p["end_by_category"]["gradient"] == 0 for p in phases(r, "zero_grad"))
    assert all(p["end_by_category"]["optimizer_state"] == truth["optimizer_state"]
               for p in phases(r, "optimizer_step"))
    every = [p for s in r["steps"] for p in s["phases"]]
    assert all(p["end_by_category"]["parameter"] == p_bytes for p in every)
    assert all(p["end_by_category"]["buffer"] == truth["buffer"] for p in every)


def test_the_loader_batches_are_the_inputs(run, truth):
    """Given batches the data loader stacks in the data phase and the trainer tags as inputs,
    then at the end of every forward the live inputs are exactly one batch."""
    _, _, r = run
    assert all(p["end_by_category"]["input"] == truth["input"] for p in phases(r, "forward"))


def test_every_phase_is_marked_and_each_epoch_ends_in_a_checkpoint(run):
    """Given PhaseGuards around the loader, zero_grad, forward, backward, the optimizer step and
    torch::save, then the report names those phases, one checkpoint per epoch, one optimizer
    step per batch, and the checkpoint the trainer wrote reloads into a fresh model."""
    prefix, stdout, r = run
    names = {p["phase"] for s in r["steps"] for p in s["phases"]}
    assert {"data", "zero_grad", "forward", "backward", "optimizer_step", "checkpoint"} <= names
    assert len(phases(r, "checkpoint")) == EPOCHS
    assert r["optimizer"]["steps"] == STEPS
    assert Path(f"{prefix}.model.pt").stat().st_size > 0 and Path(f"{prefix}.optimizer.pt").stat().st_size > 0
    assert f"checkpoint {prefix}.model.pt reloaded: identical parameters and buffers" in stdout


def test_the_trace_agrees_with_the_allocator_and_opens_with_the_python_tools(run):
    """Given the trace, then the ledger never disagreed with the allocator, no event was
    anomalous, the model is named by its C++ class, the trainer ran on the libtorch it was
    built with, and rs.load gives the very report the C++ program wrote."""
    prefix, _, r = run
    assert r["consistency"]["samples"] > 0 and r["consistency"]["mismatches"] == 0
    assert all(v == 0 for v in r["anomalies"].values()), r["anomalies"]
    assert r["model"]["class"] == "ConvNetImpl"
    if LIBTORCH:
        assert r["run"]["torch_version"] == LIBTORCH
    assert rs.load(f"{prefix}.rstrace").to_dict() == r
