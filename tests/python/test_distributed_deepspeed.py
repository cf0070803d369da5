"""DeepSpeed ZeRO stages 1, 2 and 3 under tracking (docs/distributed.md, "DeepSpeed"), on the
CPU with DeepSpeed's CPU accelerator and gloo, in a world of 2 ranks started by
torch.multiprocessing (tests/python/deepspeed_jobs.py: one launch runs the three stages), and the
user's way in, ``torchrun -m ridgescope.cli run`` on an unmodified ZeRO-2 script.

The truth is what DeepSpeed holds: the job reads its partitions, master weights, gradient
partitions, reduce buckets and gathered parameters at every phase boundary; the tests replay the
trace to the same instants (tests/python/boundary_replay.py) and compare the blocks of each
category, address and bytes."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

import ridgescope as rs
import boundary_replay
import deepspeed_jobs
from fork_server import free_port, run_ranks
from run_once import once

needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None or not dist.is_available()
    or not dist.is_gloo_available(), reason="DeepSpeed (scripts/setup.sh) or gloo is missing")


def _job(out: Path) -> dict[int, Any]:
    run_ranks(deepspeed_jobs.job, 2, (2, free_port(), str(out), [1, 2, 3]))
    return {r: json.loads((out / f"results.rank{r}.json").read_text()) for r in range(2)}


@pytest.fixture(scope="module")
def zero(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Any]:
    """The three stages' job, once for both pytest workers (tests/python/run_once.py)."""
    return once(tmp_path_factory, "deepspeed-zero", _job)[1]


@needs_deepspeed
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_partitions_and_buffers_match_deepspeed_at_every_boundary(zero: dict[int, Any],
                                                                   stage: int) -> None:
    """Scenario: ZeRO-N (1, 2, 3) on 2 ranks, AdamW (DeepSpeed's FusedAdam), a small
    reduce_bucket_size (several reductions per backward) and, for ZeRO-3, biases under the
    persistence threshold. Given each rank's trace, when it is replayed to every phase boundary
    (and, in ZeRO-1/2, to a marker inside backward while the reduce bucket is live), then the
    blocks tagged parameter, optimizer_state, gradient and comm_buffer are exactly DeepSpeed's
    own tensors at that instant, address and bytes: the parameter groups or partitions (and
    the persistent parameters), the fp32 master partitions with the optimizer's state, the
    gradient partitions, the reduce bucket and the gathered parameters; so no buffer is
    called gradient beyond the blocks that hold gradients."""
    for rank in range(2):
        res = zero[rank][str(stage)]
        assert res["error"] is None, res["error"]
        assert res["drained"] is None, res["drained"]  # nothing DeepSpeed let go of stays alive
        records = res["records"]
        boundary_replay.compare(res["trace"], records, ("forward", "backward", "optimizer_step"),
                                ("bucket check",))
        checks = [r for r in records if r["where"] == "bucket check"]
        if stage < 3:
            assert len(checks) == deepspeed_jobs.STEPS
            assert all([r[1] for r in c["comm_buffer"]] == [res["reduce_bucket_bytes"]]
                       for c in checks)


@needs_deepspeed
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_report_names_the_stage_the_buffers_and_the_full_model(zero: dict[int, Any],
                                                               stage: int) -> None:
    """Scenario: the same runs. Given each rank's report, then the model section counts every
    parameter (ZeRO-3 from DeepSpeed's ds_numel: its parameters' data is an empty
    placeholder), the distributed section says which stage runs and lists the reduce bucket
    with the config key that sizes it and its bytes, the text says "reduce_bucket_size (5,000
    elements) holds ...", every step is one forward, one backward and one optimizer step, and
    unknown is under 0.5 % of the peak."""
    for rank in range(2):
        res = zero[rank][str(stage)]
        report = rs.load(res["trace"]).to_dict()
        assert report["model"]["parameters"] == res["parameters"] == 8840
        ds = report["distributed"]["strategies"][0]
        assert (ds["strategy"], ds["zero_stage"], ds["parameters"]) == ("deepspeed", stage, 8840)
        buckets = [b for b in ds["buffers"] if b["config_key"] == "reduce_bucket_size"]
        assert [(b["bytes"], b["elements"], b["category"]) for b in buckets] == \
            [(res["reduce_bucket_bytes"], deepspeed_jobs.BUCKET, "comm_buffer")]
        masters = [p for p in ds["partitions"] if p["what"].startswith("fp32 master weights")]
        assert sum(p["bytes"] for p in masters) == res["fp32_partition_bytes"]
        assert all(p["category"] == "optimizer_state" for p in masters)
        text = rs.load(res["trace"]).summary()
        assert f"DeepSpeed ZeRO-{stage}" in text
        assert "reduce_bucket_size (5,000 elements) holds" in text
        assert report["optimizer"]["steps"] == deepspeed_jobs.STEPS
        steps = [s for s in report["steps"] if s["complete"]]
        assert len(steps) == deepspeed_jobs.STEPS
        for s in steps:
            top = [p["phase"] for p in s["phases"] if p["depth"] == 0]
            assert top == ["forward", "backward", "optimizer_step"], (rank, stage, s["step"])
        peak = report["peak"]
        assert peak["by_category"]["unknown"] < 0.005 * peak["bytes"], (rank, stage)


@needs_deepspeed
def test_losses_bitwise_identical_on_every_rank(zero: dict[int, Any]) -> None:
    """Scenario: every stage, untracked and tracked, same seeds. Then every rank's loss
    sequence is bitwise identical with and without tracking."""
    for rank in range(2):
        for stage, res in zero[rank].items():
            assert res["losses"] == res["untracked_losses"], (rank, stage)


TRAIN_ZERO2 = """
import torch, deepspeed
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # (not compiled: see below)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                            torch.nn.ReLU(), torch.nn.Linear(512, 10))
config = {"train_micro_batch_size_per_gpu": 8,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
          "zero_optimization": {"stage": 2}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
g = torch.Generator().manual_seed(engine.global_rank)
for step in range(2):
    x, y = torch.randn(8, 256, generator=g), torch.randint(0, 10, (8,), generator=g)
    loss = torch.nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    engine.step()
"""


@needs_deepspeed
def test_torchrun_ridgescope_run_zero2(tmp_path: Path) -> None:
    """Scenario: the user's way in, `torchrun --nproc-per-node 2 -m ridgescope.cli run
    train.py` on an unmodified ZeRO-2 script with DeepSpeed's defaults (a 3-layer MLP of
    1,597,480 B, "optimizer": AdamW). Then each rank's peak is the reduce bucket
    (reduce_bucket_size 5e8 elements x 4 B = 2,000,000,000 B), counted as comm_buffer and
    labelled by its config key, not as gradient (gradient stays below the model's bytes), the
    text says "reduce_bucket_size (500,000,000 elements) holds", the model has its 399,370
    parameters, the fp32 master partition (half the model) is optimizer_state, and unknown is
    under 0.5 % of the peak. The script has no ridgescope code; its two settings only keep
    DeepSpeed from compiling CPU ops for minutes on a fresh machine (its shared-memory
    collectives, which training does not use, and FusedAdam: torch's AdamW steps instead; with
    both compiled the report is the same but for the optimizer's class, docs/distributed.md)."""
    (tmp_path / "train.py").write_text(TRAIN_ZERO2)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "ridgescope.cli", "run", "train.py"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(2):
        trace = str(tmp_path / f"train.rank{rank}.rstrace")
        report = rs.load(trace).to_dict()
        peak = report["peak"]
        assert report["model"]["parameters"] == 399_370
        assert report["model"]["parameter_bytes"] == 1_597_480
        bucket = peak["top_blocks"][0]
        assert (bucket["bytes"], bucket["category"]) == (2_000_000_000, "comm_buffer")
        assert "reduce_bucket_size 500,000,000 elements" in bucket["label"]
        assert peak["by_category"]["gradient"] < 1_597_480, (rank, peak["by_category"])
        # half the flat parameters, which DeepSpeed pads to 2 x world size elements: 399,372
        masters = [b for b in peak["top_blocks"] if b["label"].startswith("fp32 master weights")]
        assert [(b["bytes"], b["category"]) for b in masters] == \
            [(399_372 // 2 * 4, "optimizer_state")]
        assert peak["by_category"]["unknown"] < 0.005 * peak["bytes"]
        assert "reduce_bucket_size (500,000,000 elements) holds" in rs.load(trace).summary()


def test_unrecognised_engine_is_described_and_tracking_goes_on(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Scenario: a DeepSpeed engine whose structures are not what ridgescope expects (another
    release; here a stand-in class without them). When it is tracked and trains, then training
    and tracking go on (no error, every step counted), and the distributed section says the
    engine was found but not recognised, with the error."""
    import types

    import torch

    class DeepSpeedEngine(torch.nn.Module):  # no optimizer, no zero_optimization_stage()
        def __init__(self) -> None:
            super().__init__()
            self.module = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.module(x)

    fake = types.ModuleType("deepspeed.runtime.engine")
    fake.DeepSpeedEngine = DeepSpeedEngine  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "deepspeed.runtime.engine", fake)
    engine = DeepSpeedEngine()
    opt = torch.optim.SGD(engine.parameters(), lr=0.1)
    with rs.track(model=engine, optimizer=opt, out=tmp_path / "fake.rstrace") as session:
        for _ in range(2):
            engine(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    assert session.error is None
    report = session.report()
    data = report.to_dict()
    assert len([s for s in data["steps"] if s["complete"]]) == 2
    [failure] = data["distributed"]["strategies"]
    assert failure["strategy"] == "deepspeed" and "AttributeError" in failure["error"]
    assert "deepspeed: found, but its structures were not recognised" in report.summary()
