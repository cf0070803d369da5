"""Specification of `ridgescope run` under torchrun (docs/distributed.md, docs/long-runs.md): the
user's way in, `torchrun --nproc-per-node 2 -m ridgescope.cli run --keep-steps 3 train.py` on an
unmodified DDP script. Each rank finds the DDP wrapper by itself, keeps its own bounded trace,
and the merged report of the job has every rank's per-step summaries.

The job runs once in the session, for both pytest workers (tests/python/run_once.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ridgescope as rs
from ridgescope.cli import main as cli_main
from ridgescope.distributed import merge_traces

from run_once import once

STEPS, BIG_STEP = 40, 12
TRAIN = f"""
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)))
opt = torch.optim.AdamW(model.parameters())
g = torch.Generator().manual_seed(dist.get_rank())
for step in range({STEPS}):
    opt.zero_grad(set_to_none=True)
    batch = 512 if dist.get_rank() == 1 and step == {BIG_STEP} else 16
    model(torch.randn(batch, 64, generator=g)).sum().backward()
    opt.step()
dist.destroy_process_group()
"""


def _torchrun(folder: Path) -> list[Path]:
    (folder / "train.py").write_text(TRAIN)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "ridgescope.cli", "run", "--keep-steps", "3", "train.py"]
    done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return sorted(folder.glob("train.rank*.rstrace"))


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return once(tmp_path_factory, "torchrun-ddp", _torchrun)[1]


def _phase(report: dict, step: int, name: str) -> dict:
    s = next(s for s in report["steps"] if s["step"] == step)
    return next(p for p in s["phases"] if p["phase"] == name)


def test_each_rank_finds_ddp_by_itself_and_one_report_names_the_highest(
        traces: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Then each rank wrote its own trace, found the DDP wrapper by itself and counted its
    bucket as comm_buffer at the end of the last step's backward (a kept step), with under 1 %
    unknown at the peak, and `ridgescope report train.rank*.rstrace` names rank 1 as the
    highest."""
    assert [t.name for t in traces] == ["train.rank0.rstrace", "train.rank1.rstrace"]
    for rank, t in enumerate(traces):
        report = rs.load(t).to_dict()
        ddp = report["distributed"]["strategies"][0]
        assert report["distributed"]["rank"] == rank and ddp["strategy"] == "ddp"
        end = _phase(report, STEPS - 1, "backward")["end_by_category"]
        assert end["comm_buffer"] == ddp["bucket_bytes"] == end["gradient"] > 0
        assert report["peak"]["by_category"]["unknown"] < 0.01 * report["peak"]["bytes"]
    assert cli_main(["report", *map(str, traces)]) == 0
    assert "Highest peak: rank 1" in capsys.readouterr().out


def test_torchrun_ranks_keep_bounded_traces_that_merge_with_every_steps_summary(
        traces: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Given rank 1 takes one large batch in step 12, then each rank wrote a bounded trace with a
    summary of all 40 steps; the merged report holds both ranks' per-step summaries and names
    rank 1, step 12 as the highest."""
    for t in traces:
        g = rs.load(t).to_dict()["at_a_glance"]
        assert g["keep_steps"] == 3 and g["steps"] >= STEPS
    s = merge_traces(traces)["ranks"]
    series = s["step_summaries"]
    assert sorted(series) == ["0", "1"]
    for rank in ("0", "1"):
        assert series[rank]["step"][:STEPS] == list(range(STEPS)) and series[rank]["keep_steps"] == 3
    assert series["1"]["max_peak_step"] == BIG_STEP
    assert series["1"]["max_peak_bytes"] == max(series["1"]["peak_bytes"]) > series["0"]["max_peak_bytes"]
    assert s["highest"]["rank"] == 1 and s["highest"]["step"] == BIG_STEP
    assert cli_main(["report", *map(str, traces)]) == 0
    out = capsys.readouterr().out
    assert "the highest step peak is rank 1's" in out and f"in step {BIG_STEP}" in out
