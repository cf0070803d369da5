"""Specification of the TensorBoard reporter (``ridgescope report FILE --tensorboard DIR``,
``Report.to_tensorboard``): the event file, read back with TensorBoard's own event reader,
holds one scalar per step for the step's peak and for each category at that peak, equal to the
JSON report of the same trace."""
from __future__ import annotations

import sys

import pytest
import torch

import ridgescope as rs
from ridgescope.cli import main
from conftest import gpt_inputs, make_gpt, train
import models

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing import plugin_event_accumulator  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402


def read_back(logdir) -> dict[str, dict[int, float]]:
    """tag -> {step: value}, through the event accumulator TensorBoard's server uses."""
    events = plugin_event_accumulator.EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    events.Reload()
    out: dict[str, dict[int, float]] = {}
    for tag in events.Tags()["tensors"]:
        assert events.SummaryMetadata(tag).plugin_data.plugin_name == "scalars"  # a scalar chart
        series = events.Tensors(tag)
        assert len({e.step for e in series}) == len(series), f"{tag}: one value per step"
        out[tag] = {e.step: tensor_util.make_ndarray(e.tensor_proto).item() for e in series}
    return out


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("tb") / "run.rstrace"
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with rs.track(model=model, optimizer=opt, out=path):
        train(model, opt, lambda i: gpt_inputs(8, i), models.gpt_loss, steps=3)
    return path


def test_report_tensorboard_writes_one_scalar_per_step_per_category(trace, tmp_path, capsys):
    """Given a 3-step trace, when `ridgescope report FILE --tensorboard DIR` runs, then the
    event file holds, for every step of the JSON report, its peak and each of the ten categories
    at that peak, to the byte; and the text report is still printed."""
    logdir = tmp_path / "tb"
    assert main(["report", str(trace), "--tensorboard", str(logdir)]) == 0
    captured = capsys.readouterr()
    assert "Peak:" in captured.out and f"to {logdir}" in captured.err
    report = rs.load(trace).to_dict()
    assert len(report["steps"]) == 3
    got = read_back(logdir)
    expected = {"ridgescope/peak_bytes": {s["step"]: s["peak_bytes"] for s in report["steps"]}}
    for category in report["categories"]:
        expected[f"ridgescope/peak/{category}"] = {
            s["step"]: s["peak_by_category"][category] for s in report["steps"]}
    assert got == expected
    assert len(got) == 1 + len(rs.CATEGORIES)
    assert any(v > 0 for v in got["ridgescope/peak/activation"].values())


def test_figures_stay_exact_beyond_single_precision(tmp_path):
    """Given a report whose bytes single precision cannot hold (2^40 + 1), then the value read
    back is that integer exactly (written as a double), and the step offset shifts the steps."""
    big = 2 ** 40 + 1
    by_category = {c: 0 for c in rs.CATEGORIES}
    by_category["activation"] = big
    data = {"categories": list(rs.CATEGORIES), "peak": {"by_category": by_category},
            "steps": [{"step": 0, "peak_bytes": big, "peak_by_category": by_category}]}
    from ridgescope._reporters._tensorboard import write_tensorboard

    written = write_tensorboard(data, tmp_path, step_offset=1)
    assert written == {"logdir": str(tmp_path), "steps": 1, "scalars": 1 + len(rs.CATEGORIES)}
    got = read_back(tmp_path)
    assert got["ridgescope/peak_bytes"] == {1: big}
    assert got["ridgescope/peak/activation"] == {1: big}
    assert float(torch.tensor(big, dtype=torch.float32)) != big  # what float32 would have lost


def test_without_tensorboard_the_error_says_what_to_install(trace, tmp_path, monkeypatch, capsys):
    """Given no tensorboard package, then the command fails with one line naming the extra."""
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    assert main(["report", str(trace), "--tensorboard", str(tmp_path / "tb")]) == 1
    err = capsys.readouterr().err
    assert "pip install 'ridgescope[tensorboard]'" in err and "Traceback" not in err
    assert not (tmp_path / "tb").exists()
