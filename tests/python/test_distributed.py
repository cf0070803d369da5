"""Distributed training under tracking (docs/distributed.md), on the CPU with gloo, in worlds of
2 and 4 ranks started by torch.multiprocessing: DDP buckets, FSDP2 shards and all-gathers, FSDP1
flat parameters, ZeroRedundancyOptimizer, bitwise-identical losses, the merged report of every
rank, and a rank that is killed.

Each world runs once in the session, for both pytest workers (tests/python/run_once.py), its
ranks forked from a server that has imported torch (tests/python/fork_server.py); the job is
tests/python/distributed_jobs.py: every rank runs
every scenario untracked and tracked and records what torch itself says (the reducer's bucket
sizes, the DTensors' local shards, the optimizers' state); the tests compare the rank's trace
with that. The user's way in under torchrun is specified in test_flight_ranks.py."""
from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

import ridgescope as rs
from ridgescope import _C
from ridgescope.cli import main as cli_main
from ridgescope.distributed import merge_traces

import boundary_replay
import distributed_jobs
from fork_server import free_port, run_ranks
from run_once import once

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

COMMON = ["ddp", "ddp_view", "fsdp2", "fsdp1", "zero"]


def run_job(out: Path, world: int, scenarios: list[str], kill: bool = False) -> dict[int, Any]:
    """Runs the job on ``world`` processes; returns each rank's results. With ``kill``, rank 1
    must end by SIGKILL and every other rank normally."""
    run_ranks(distributed_jobs.job, world, (world, free_port(), str(out), scenarios, kill),
              killed_rank=1 if kill else None)
    return {r: json.loads((out / f"results.rank{r}.json").read_text()) for r in range(world)}


def _job_once(tmp_path_factory: pytest.TempPathFactory, world: int, scenarios: list[str],
              kill: bool = False) -> tuple[Path, dict[int, Any]]:
    """The world's job, once for both pytest workers (tests/python/run_once.py)."""
    return once(tmp_path_factory, f"world{world}", lambda out: run_job(out, world, scenarios, kill))


@pytest.fixture(scope="module")
def world2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, Any]]:
    return _job_once(tmp_path_factory, 2,
                     COMMON + ["ddp_inner", "ddp_view_held", "fsdp2_mp", "fsdp2_offload"], kill=True)


@pytest.fixture(scope="module")
def world4(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, Any]]:
    return _job_once(tmp_path_factory, 4, ["ddp_skewed"] + COMMON + ["hsdp"])


@pytest.fixture(params=[2, 4], ids=["world2", "world4"])
def job(request: pytest.FixtureRequest) -> tuple[int, dict[int, Any]]:
    out, results = request.getfixturevalue(f"world{request.param}")
    return request.param, results


def _report(result: dict[str, Any]) -> dict[str, Any]:
    assert result["error"] is None, result["error"]
    return rs.load(result["trace"]).to_dict()


def _phase(report: dict[str, Any], step: int, name: str) -> dict[str, Any]:
    s = next(s for s in report["steps"] if s["step"] == step)
    return next(p for p in s["phases"] if p["phase"] == name)


def _unknown_share(report: dict[str, Any]) -> float:
    return report["peak"]["by_category"]["unknown"] / report["peak"]["bytes"]


def test_ddp_buckets_are_comm_buffers(job: tuple[int, dict[int, Any]]) -> None:
    """Scenario: DDP with gradient_as_bucket_view=False and small buckets (several of them).
    Given each rank's trace, when the report is read, then at the end of every backward
    comm_buffer equals the sum of the reducer's bucket sizes as DDP itself reports them
    (before its rebuild in step 1, and after; plus a first bucket still live there because gloo's
    worker thread had not yet released its last allreduce, read from the trace, which must free it
    later), gradient equals the parameter bytes, the bucket
    section lists DDP's buckets, and unknown is under 1 % of the peak."""
    world, results = job
    for rank in range(world):
        res = results[rank]["ddp"]
        report = _report(res)
        assert len(res["bucket_bytes"]) >= 3
        replaced = boundary_replay.replaced_buckets(res["trace"], "DDP bucket ")
        for step in range(distributed_jobs.STEPS):
            end = _phase(report, step, "backward")["end_by_category"]
            buckets = res["first_bucket_bytes"] if step == 0 else res["bucket_bytes"]
            # beside the buckets, a first one gloo's worker had not yet released (rarely)
            assert end["comm_buffer"] == sum(buckets) + replaced.get(step, 0), (rank, step)
            assert end["gradient"] == res["parameter_bytes"], (rank, step)
        ddp = report["distributed"]["strategies"][0]
        assert ddp["strategy"] == "ddp" and ddp["gradient_as_bucket_view"] is False
        assert [b["bytes"] for b in ddp["buckets"]] == res["bucket_bytes"]
        assert ddp["buckets_category"] == "comm_buffer"
        assert _unknown_share(report) < 0.01
        labels = {b["label"] for b in report["peak"]["by_label"] if b["category"] == "comm_buffer"}
        assert any(label.startswith("DDP bucket ") and "layers." in label for label in labels)


def test_ddp_bucket_views_count_gradients_once(job: tuple[int, dict[int, Any]]) -> None:
    """Scenario: DDP with gradient_as_bucket_view=True. Given each rank's trace, then after the
    first step the gradients are the buckets: gradient equals the parameter bytes and the sum
    of DDP's bucket sizes, no comm_buffer is counted beside them (but a replaced first bucket
    gloo's worker had not yet released, read from the trace), the bucket section and the
    text report say the gradients are bucket views, and unknown is under 1 % of the peak."""
    world, results = job
    for rank in range(world):
        res = results[rank]["ddp_view"]
        report = _report(res)
        assert sum(res["bucket_bytes"]) == res["parameter_bytes"]
        replaced = boundary_replay.replaced_buckets(res["trace"], "gradients (views of DDP")
        for step in range(1, distributed_jobs.STEPS):
            end = _phase(report, step, "backward")["end_by_category"]
            assert end["gradient"] == res["parameter_bytes"], (rank, step)
            # a replaced first bucket gloo's worker had not yet released (rarely) holds no
            # gradient: it is comm_buffer
            assert end["comm_buffer"] == replaced.get(step, 0), (rank, step)
        ddp = report["distributed"]["strategies"][0]
        assert ddp["gradient_as_bucket_view"] is True and ddp["buckets_category"] == "gradient"
        assert "views" in ddp["note"]
        assert "views into the buckets" in rs.load(res["trace"]).summary()
        assert _unknown_share(report) < 0.01


def test_ddp_replaced_bucket_still_held_is_not_gradient(
        world2: tuple[Path, dict[int, Any]]) -> None:
    """Scenario: DDP with gradient_as_bucket_view=True, and the first step's gradients (views of
    DDP's first bucket) kept alive through the second and third backward, as a process group's
    work may keep a bucket the reducer replaced in its rebuild. Given each rank's trace, then at
    the end of those backwards gradient is still exactly the parameter bytes, the replaced
    bucket is comm_buffer with the bytes torch reports for the kept tensors' storage, labelled
    "replaced DDP bucket 0", and once it is let go nothing is left beside the buckets."""
    _, results = world2
    for rank in range(2):
        res = results[rank]["ddp_view_held"]
        report = _report(res)
        assert res["held_bytes"][1] == sum(res["first_bucket_bytes"]) > 0
        for step in range(1, distributed_jobs.STEPS):
            end = _phase(report, step, "backward")["end_by_category"]
            assert end["gradient"] == res["parameter_bytes"], (rank, step)
            held = res["held_bytes"][step] if step < 3 else 0
            assert end["comm_buffer"] == held, (rank, step)
        labels = {e["string"] for e in _C.read_events(res["trace"], 10_000_000)
                  if e["kind"] == "tag" and e["category"] == "comm_buffer"}
        assert labels == {"replaced DDP bucket 0 (held by its last allreduce's work)"}
        assert res["losses"] == res["untracked_losses"]


def test_fsdp2_shards_gathers_and_steps(job: tuple[int, dict[int, Any]]) -> None:
    """Scenario: FSDP2, fully_shard on every Linear and on the root, AdamW, 4 steps. Given each
    rank's trace, then parameter equals the rank's local shard bytes (from the DTensors), the
    optimizer state equals 2x that plus AdamW's step counters, all 4 steps are counted, the
    shards are labelled with their names and shard sizes, and unknown is under 1 % of the
    peak."""
    world, results = job
    for rank in range(world):
        res = results[rank]["fsdp2"]
        report = _report(res)
        assert len(report["steps"]) == distributed_jobs.STEPS
        assert all(s["complete"] for s in report["steps"])
        assert report["optimizer"]["steps"] == distributed_jobs.STEPS
        local = res["local_shard_bytes"]
        assert report["distributed"]["strategies"][0]["local_shard_bytes"] == local
        for s in report["steps"]:
            assert s["end_by_category"]["parameter"] == local, (rank, s["step"])
            assert s["end_by_category"]["optimizer_state"] == res["optimizer_state_bytes"]
        assert res["optimizer_state_bytes"] == 2 * local + res["step_counter_bytes"]
        fsdp = report["distributed"]["strategies"][0]
        assert fsdp["strategy"] == "fsdp2"
        assert all(abs(p["fraction"] - 1 / world) < 1e-12 for p in fsdp["parameters"])
        labels = {b["label"] for b in report["peak"]["by_label"] if b["category"] == "parameter"}
        n = distributed_jobs.WIDTH * distributed_jobs.WIDTH
        assert f"layers.0.weight (shard {n // world} of {n} elements)" in labels
        assert _unknown_share(report) < 0.01


def test_fsdp2_unsharded_parameters_are_the_all_gather(job: tuple[int, dict[int, Any]]) -> None:
    """Scenario: the same FSDP2 run, with a marker phase while layers.3's forward runs. Given
    the trace's events, then while layers.3 runs its unsharded parameters are live, labelled
    "all-gather of layers.3" as comm_buffer, their bytes equal layers.3's full parameter bytes,
    and they are freed (resharded) before the forward ends, in every step."""
    world, results = job
    for rank in range(world):
        res = results[rank]["fsdp2"]
        events = _C.read_events(res["trace"], 10_000_000)
        sizes: dict[int, int] = {}
        gathered: dict[int, int] = {}  # addr -> bytes of live blocks tagged for layers.3
        inside = at_forward_end = 0
        for e in events:
            kind = e.get("kind")
            if kind == "alloc":
                sizes[e["addr"]] = e["bytes"]
                gathered.pop(e["addr"], None)
            elif kind == "free":
                sizes.pop(e["addr"], None)
                gathered.pop(e["addr"], None)
            elif kind == "tag" and e["string"] == "all-gather of layers.3":
                assert e["category"] == "comm_buffer"
                gathered[e["addr"]] = sizes[e["addr"]]
            elif kind == "phase_begin" and e["string"] == "inside layers.3":
                assert sum(gathered.values()) == res["layer3_full_bytes"], rank
                inside += 1
            elif kind == "phase_end" and e["string"] == "forward":
                assert sum(gathered.values()) == 0, rank
                at_forward_end += 1
        assert inside == distributed_jobs.STEPS and at_forward_end == distributed_jobs.STEPS


@pytest.mark.parametrize("variant,world", [("fsdp2_mp", 2), ("fsdp2_offload", 2), ("hsdp", 4)])
def test_fsdp2_variants_match_fsdp2_at_every_boundary(variant: str, world: int,
                                                       request: pytest.FixtureRequest) -> None:
    """Scenario: FSDP2 with MixedPrecisionPolicy(param_dtype=bfloat16), with
    CPUOffloadPolicy (it runs on the CPU: the offload is to the device the shards are on), and
    HSDP on a 2 x 2 mesh of 4 ranks (replicate x shard). Given each rank's trace, when it is
    replayed to the end of every forward, backward and optimizer step, to a marker inside
    layers.3's forward and to one inside every post-backward, then the blocks of each category
    are exactly FSDP2's own tensors there, address and bytes: the fp32 local shards
    (parameter), the unsharded all-gather outputs (bf16 under mixed precision), the pending
    all-gather output and the reduce-scatter and all-reduce buffers (comm_buffer), the sharded
    gradients (gradient) and the optimizer's state; unknown is under 1 % of the peak."""
    _, results = request.getfixturevalue(f"world{world}")
    for rank in range(world):
        res = results[rank][variant]
        assert res["error"] is None, res["error"]
        boundary_replay.compare(res["trace"], res["records"],
                                ("forward", "backward", "optimizer_step"),
                                ("inside layers.3", "reduced"))
        report = _report(res)
        fsdp = report["distributed"]["strategies"][0]
        assert fsdp["local_shard_bytes"] == res["local_shard_bytes"]
        assert _unknown_share(report) < 0.01
        inside = [r for r in res["records"] if r["where"] == "inside layers.3"]
        n = distributed_jobs.WIDTH * distributed_jobs.WIDTH + distributed_jobs.WIDTH
        size = 2 if variant == "fsdp2_mp" else 4  # layers.3 gathered whole, in bf16 under mp
        assert all(sum(b for _, b in r["comm_buffer"]) >= n * size for r in inside)
        labels = {e["string"] for e in _C.read_events(res["trace"], 10_000_000)
                  if e["kind"] == "tag" and e["category"] == "comm_buffer"}
        if variant == "fsdp2_mp":
            assert fsdp["mixed_precision"]["param_dtype"] == "bfloat16"
            assert {"all-gather of layers.3 (bfloat16)",
                    "reduce-scatter of layers.3 (bfloat16)"} <= labels
        else:
            assert {"all-gather of layers.3", "reduce-scatter of layers.3"} <= labels
        assert fsdp["cpu_offload"] is (variant == "fsdp2_offload")
        assert fsdp["mesh"] == {"shape": [2, 2] if variant == "hsdp" else [world],
                                "dim_names": ["replicate", "shard"] if variant == "hsdp" else [],
                                "hsdp": variant == "hsdp"}


def test_fsdp1_flat_parameters_and_zero_shards(job: tuple[int, dict[int, Any]]) -> None:
    """Scenario: FSDP1 (FullyShardedDataParallel, flat parameters) and ZeroRedundancyOptimizer
    (parameters_as_bucket_view=True) over DDP. Given each rank's trace, then with FSDP1
    parameter and optimizer_state equal the rank's flat-parameter shards and its optimizer's
    state exactly; with ZeRO, parameter is the whole (replicated) model, labelled by the
    per-rank buckets it is a view of, optimizer_state is this rank's partition's state exactly,
    and the wrapper's step and its local optimizer's count as one step."""
    world, results = job
    for rank in range(world):
        res = results[rank]["fsdp1"]
        report = _report(res)
        last = report["steps"][-1]["end_by_category"]
        assert last["parameter"] == res["local_shard_bytes"], rank
        assert last["optimizer_state"] == res["optimizer_state_bytes"], rank
        assert report["distributed"]["strategies"][0]["strategy"] == "fsdp1"
        assert _unknown_share(report) < 0.01

        res = results[rank]["zero"]
        report = _report(res)
        assert len(report["steps"]) == distributed_jobs.STEPS  # one step, not one per optimizer
        # the local optimizer's step inside the wrapper's is not a phase of its own
        assert report["optimizer"]["steps"] == distributed_jobs.STEPS
        assert all([p["phase"] for p in s["phases"]].count("optimizer_step") == 1
                   for s in report["steps"])
        labels = {b["label"] for b in report["peak"]["by_label"] if b["category"] == "parameter"}
        assert labels == {f"parameters of rank {r}'s partition (ZeRO bucket)" for r in range(world)}
        for s in report["steps"]:
            assert s["end_by_category"]["parameter"] == res["parameter_bytes"], rank
            assert s["end_by_category"]["optimizer_state"] == res["local_optimizer_state_bytes"]
        kinds = [s["strategy"] for s in report["distributed"]["strategies"]]
        assert kinds == ["ddp", "zero"]
        assert _unknown_share(report) < 0.01
    partitions = [results[r]["zero"]["local_optimizer_state_bytes"] for r in range(world)]
    assert all(0 < p < sum(partitions) for p in partitions)  # sharded: every rank holds a part


def test_ddp_inner_module_as_the_model(world2: tuple[Path, dict[int, Any]]) -> None:
    """Scenario: DDP, with the wrapped module passed as the model (``rs.track(model=ddp.module)``),
    so the outermost module that runs is the DDP wrapper around it. Then every step has its
    forward (opened at the wrapper), DDP's buckets are found and counted as comm_buffer at the
    end of every backward after the first (with a first bucket gloo's worker had not yet
    released, read from the trace), and unknown is under 1 % of the peak."""
    _, results = world2
    for rank in range(2):
        res = results[rank]["ddp_inner"]
        report = _report(res)
        assert len(report["steps"]) == distributed_jobs.STEPS
        for s in report["steps"]:
            assert [p["phase"] for p in s["phases"]] == ["zero_grad", "forward", "backward",
                                                         "optimizer_step"], (rank, s["step"])
        replaced = boundary_replay.replaced_buckets(res["trace"], "DDP bucket ")
        for step in range(1, distributed_jobs.STEPS):
            end = _phase(report, step, "backward")["end_by_category"]
            # beside the buckets, a first one gloo's worker had not yet released (rarely)
            assert end["comm_buffer"] == sum(res["bucket_bytes"]) + replaced.get(step, 0), (rank, step)
        assert report["distributed"]["strategies"][0]["strategy"] == "ddp"
        assert _unknown_share(report) < 0.01


def test_losses_bitwise_identical_on_every_rank(job: tuple[int, dict[int, Any]]) -> None:
    """Scenario: every strategy, untracked and tracked, same seeds. Then every rank's loss
    sequence is bitwise identical with and without tracking, and tracking never stopped."""
    world, results = job
    for rank in range(world):
        for name, res in results[rank].items():
            assert res["error"] is None, (rank, name, res["error"])
            assert res["losses"] == res["untracked_losses"], (rank, name)


def test_traces_carry_the_rank(job: tuple[int, dict[int, Any]]) -> None:
    """Given each rank's trace, then its distributed section names its rank, the world size,
    the local rank, the host and the backend, and the file name is per rank."""
    world, results = job
    for rank in range(world):
        res = results[rank]["ddp"]
        d = _report(res)["distributed"]
        assert (d["rank"], d["world_size"], d["local_rank"]) == (rank, world, rank)
        assert d["backend"] == "gloo" and d["host"] == socket.gethostname()
        assert Path(res["trace"]).name == f"ddp.rank{rank}.rstrace"


def test_merged_report_names_the_highest_rank(world4: tuple[Path, dict[int, Any]], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Scenario: 4 ranks of DDP, rank 2 on a 4x larger batch. Given the 4 traces, when they are
    merged (the API and `ridgescope report A B C D` as text, JSON and HTML), then rank 2 is the
    highest peak, by the difference to the lowest, and every rank's figures equal its own
    single-rank report."""
    _, results = world4
    traces = [results[r]["ddp_skewed"]["trace"] for r in range(4)]
    merged = merge_traces(reversed(traces))
    s = merged["ranks"]
    assert (s["world_size"], s["traces"], s["merged"], s["missing_ranks"]) == (4, 4, 4, [])
    singles = {r: rs.load(t).to_dict()["peak"] for r, t in enumerate(traces)}
    assert s["highest"]["rank"] == 2 == max(singles, key=lambda r: singles[r]["bytes"])
    lowest = min(singles.values(), key=lambda p: p["bytes"])
    assert s["highest"]["over_lowest_bytes"] == singles[2]["bytes"] - lowest["bytes"] > 0
    for row in s["table"]:
        peak = singles[row["rank"]]
        assert (row["peak_bytes"], row["reserved_bytes"], row["step"], row["phase"]) == \
            (peak["bytes"], peak["reserved_bytes"], peak["step"], peak["phase"])
        assert row["by_category"] == peak["by_category"] and row["status"] == "ok"
    assert any(p["max_rank"] == 2 for p in s["divergent_phases"])

    assert cli_main(["report", *traces, "--format", "json", "-o", str(tmp_path / "m.json")]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["ranks"]["highest"]["rank"] == 2
    assert cli_main(["report", *traces]) == 0
    text = capsys.readouterr().out
    assert "Highest peak: rank 2" in text and "Phases where ranks diverge" in text
    assert cli_main(["report", *traces, "--format", "html", "-o", str(tmp_path / "m.html")]) == 0
    page = (tmp_path / "m.html").read_text()
    assert 'id="rs-rank-a"' in page and '"highest":{"rank":2' in page

    assert cli_main(["diff", traces[0], traces[2], "--format", "json", "-o", str(tmp_path / "d.json")]) == 0
    d = json.loads((tmp_path / "d.json").read_text())
    assert (d["rank_a"], d["rank_b"]) == (0, 2)
    assert d["peak"]["change"] == singles[2]["bytes"] - singles[0]["bytes"]


def test_killed_rank_is_reported_truncated(world2: tuple[Path, dict[int, Any]], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Scenario: rank 1 is killed (SIGKILL) in its third step while tracking. Given both traces
    (a directory holding them), when merged, then rank 1's readable prefix (its first two
    steps) is merged and flagged truncated, rank 0 is complete, and the text says so."""
    out, _ = world2
    d = tmp_path / "killed"  # the job's folder is shared with the other pytest worker: copies
    d.mkdir()
    for r in (0, 1):
        shutil.copyfile(out / f"killed.rank{r}.rstrace", d / f"killed.rank{r}.rstrace")
    s = merge_traces([d])["ranks"]
    rows = {row["rank"]: row for row in s["table"]}
    assert rows[0]["status"] == "ok" and rows[0]["complete_steps"] == distributed_jobs.STEPS
    assert rows[1]["status"] == "truncated" and rows[1]["complete_steps"] == 2
    assert s["merged"] == 2 and [p["kind"] for p in s["problems"]] == ["truncated"]
    assert cli_main(["report", str(d)]) == 0
    captured = capsys.readouterr()
    assert "rank 1's trace is truncated" in captured.out
    assert "rank 1's trace is truncated" in captured.err
