"""Specification of bounded traces under torchrun (docs/long-runs.md, docs/distributed.md): every
rank keeps its own bounded trace, and the merged report of the job has every rank's per-step
summaries."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ridgescope as rs
from ridgescope.cli import main as cli_main
from ridgescope.distributed import merge_traces

STEPS, BIG_STEP = 40, 12
TRAIN = f"""
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(dist.get_rank())
for step in range({STEPS}):
    opt.zero_grad(set_to_none=True)
    batch = 512 if dist.get_rank() == 1 and step == {BIG_STEP} else 16
    model(torch.randn(batch, 64, generator=g)).sum().backward()
    opt.step()
dist.destroy_process_group()
"""


def test_torchrun_ranks_keep_bounded_traces_that_merge_with_every_steps_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Given `torchrun --nproc-per-node 2 -m ridgescope.cli run --keep-steps 3 train.py` where
    rank 1 takes one large batch in step 12, then each rank wrote a bounded trace with a summary
    of all 40 steps; the merged report holds both ranks' per-step summaries and names rank 1,
    step 12 as the highest."""
    (tmp_path / "train.py").write_text(TRAIN)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "ridgescope.cli", "run", "--keep-steps", "3", "train.py"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    traces = sorted(tmp_path.glob("train.rank*.rstrace"))
    assert [t.name for t in traces] == ["train.rank0.rstrace", "train.rank1.rstrace"]
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
    assert f"the highest step peak is rank 1's" in out and f"in step {BIG_STEP}" in out
