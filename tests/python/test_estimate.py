"""Specification of rs.estimate and `ridgescope fit` (issue 7: will it fit?).

The dry run runs full training steps under fake tensors and must agree with a tracked real run
of the same workload on the CPU (tests/python/test_track_cpu.py's workloads): parameter,
gradient and optimizer-state bytes exactly, the activation peak within 3 %."""
from __future__ import annotations

import json
import resource

import pytest
import torch

import ridgescope as rs
from ridgescope._estimate import activation_peak
from ridgescope._estimate._cuda_costs import CUDA_BLOCK, DEFAULT_CUDA_WORKSPACE
from ridgescope._zoo import SPECS
from ridgescope.cli import main as cli_main
from conftest import (gpt_inputs, make_gpt, make_mlp, mlp_batch, mlp_loss, optimizer_state_bytes,
                      param_bytes, train)
import models

STEPS = 2
BATCH = 16


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


WORKLOADS = {
    # name: (make_model, make_batch, loss of a tracked run, model kwargs)
    "mlp": (make_mlp, lambda: mlp_batch(BATCH, 0), mlp_loss, {}),
    "gpt": (make_gpt, lambda: gpt_inputs(BATCH, 0), models.gpt_loss, {}),
    "gpt-checkpointing": (make_gpt, lambda: gpt_inputs(BATCH, 0), models.gpt_loss,
                          {"checkpointing": True}),
}


def tracked(workload, path):
    make_model, make_batch, loss, kwargs = WORKLOADS[workload]
    model = make_model(**kwargs)
    opt = adamw(model)
    with rs.track(model=model, optimizer=opt, out=path) as session:
        train(model, opt, lambda i: make_batch(), loss, steps=STEPS)
    return model, opt, session.report()


def dry(workload, **kw):
    make_model, make_batch, _, kwargs = WORKLOADS[workload]
    return rs.estimate(lambda: make_model(**kwargs), adamw, make_batch, device="cpu",
                       capacity=None, steps=STEPS, **kw)


def phases(report, name):
    return [p for p in report.phases() if p["phase"] == name]


@pytest.mark.parametrize("workload", ["mlp", "gpt"])
def test_parameter_gradient_and_optimizer_state_bytes_are_predicted_exactly(workload, trace_path):
    """Given an FP32 model with AdamW, when the step is dry-run on the CPU, then the parameter
    bytes at the peak, the gradient bytes at the end of every backward and the optimizer state
    after the first step equal the tracked real run's and the model's own, to the byte."""
    model, opt, real = tracked(workload, trace_path)
    est = dry(workload)
    p_bytes = param_bytes(model)
    assert est.by_category["parameter"] == real.peak["by_category"]["parameter"] == p_bytes
    for e, r in zip(phases(est.report, "backward"), phases(real, "backward"), strict=True):
        assert e["end_by_category"]["gradient"] == r["end_by_category"]["gradient"] == p_bytes
    e0, r0 = phases(est.report, "optimizer_step")[0], phases(real, "optimizer_step")[0]
    assert e0["start_by_category"]["optimizer_state"] == 0
    assert (e0["end_by_category"]["optimizer_state"] == r0["end_by_category"]["optimizer_state"]
            == optimizer_state_bytes(opt))


@pytest.mark.parametrize("workload", ["mlp", "gpt", "gpt-checkpointing"])
def test_activation_peak_and_peak_are_within_three_percent_of_the_tracked_run(workload, trace_path):
    """The activation peak (largest activation bytes at any phase's peak or end) and the overall
    peak of the dry run are within 3 % of the tracked real run's; the report has the same
    phases in the same order, each phase's peak within 3 %."""
    _, _, real = tracked(workload, trace_path)
    est = dry(workload)
    assert activation_peak(real) > 0
    assert est.activation_peak == pytest.approx(activation_peak(real), rel=0.03)
    assert est.peak_allocated == pytest.approx(real.peak_bytes, rel=0.03)
    assert [p["phase"] for p in est.report.phases()] == [p["phase"] for p in real.phases()]
    for e, r in zip(est.report.phases(), real.phases()):
        assert e["peak_bytes"] == pytest.approx(r["peak_bytes"], rel=0.03), e["phase"]
    assert est.report.peak["phase"] == real.peak["phase"]
    assert est.by_category["unknown"] == 0


def test_the_report_has_the_shape_of_a_tracked_run(trace_path):
    _, _, real = tracked("mlp", trace_path)
    est = dry("mlp")
    assert est.report.to_dict().keys() == real.to_dict().keys()
    assert set(est.by_category) == set(rs.CATEGORIES)
    assert est.report.to_dict()["model"]["parameters"] == real.to_dict()["model"]["parameters"]
    assert est.report.to_dict()["optimizer"]["type"] == "AdamW"


@pytest.mark.parametrize("foreach", [None, False], ids=["foreach-default", "per-tensor"])
def test_a_cuda_target_rounds_blocks_keeps_step_counters_on_the_host_and_adds_the_workspace(foreach):
    """For a CUDA target each block is rounded up to 512 bytes, AdamW's step counters (and the
    bias corrections computed from them) stay on the host, in the foreach default and in the
    per-tensor implementation alike, two cuBLAS workspaces are live from the first backward
    (one for the thread that runs forward, one for autograd's CUDA worker thread), and the
    optimizer step holds temporaries."""
    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(100, 30), torch.nn.ReLU(),  # noqa: E731
                                       torch.nn.Linear(30, 7))
    shapes = [p.shape for p in make().parameters()]
    blocks = sum(-(-s.numel() * 4 // CUDA_BLOCK) * CUDA_BLOCK for s in shapes)
    est = rs.estimate(make, lambda m: torch.optim.AdamW(m.parameters(), foreach=foreach),
                      lambda: (torch.randn(5, 100), torch.randint(0, 7, (5,))),
                      device="cuda", capacity="1GiB", steps=3)
    for step in phases(est.report, "optimizer_step"):
        assert step["end_by_category"]["optimizer_state"] == 2 * blocks
    first = phases(est.report, "optimizer_step")[0]
    assert first["start_by_category"]["parameter"] == blocks
    assert first["start_by_category"]["gradient"] == blocks
    assert first["end_by_category"]["optimizer_state"] == 2 * blocks  # exp_avg, exp_avg_sq only
    assert est.by_category["workspace"] == 2 * DEFAULT_CUDA_WORKSPACE
    assert first["peak_by_category"]["temporary"] > 0  # foreach intermediates
    assert est.fits and est.margin == (1 << 30) - est.predicted_peak


def test_reserved_bytes_come_from_the_allocator_model():
    """Given the same small CUDA step, the allocator model reserves one 2 MiB small-pool
    segment for every block under 1 MiB and a 32 MiB large segment for each of the two
    workspaces (torch's rules: small requests share 2 MiB segments; a request over 10 MiB gets
    its own segment rounded to 2 MiB): 66 MiB, which the report's peak also shows. With 65 MiB
    of capacity the allocated peak (64.1 MiB) would fit but the allocator cannot serve it: it
    does not fit."""
    pytest.importorskip("ridgescope._allocator_model")
    if not hasattr(rs._C, "AllocatorModel"):
        pytest.skip("this build has no allocator model")
    make = lambda: torch.nn.Sequential(torch.nn.Linear(100, 30), torch.nn.ReLU(),  # noqa: E731
                                       torch.nn.Linear(30, 7))
    batch = lambda: (torch.randn(5, 100), torch.randint(0, 7, (5,)))  # noqa: E731
    est = rs.estimate(make, adamw, batch, device="cuda", capacity="1GiB", steps=2)
    assert est.peak_reserved == 2 * DEFAULT_CUDA_WORKSPACE + (2 << 20)
    assert est.report.peak["reserved_bytes"] == est.peak_reserved
    assert est.peak_allocated < (65 << 20) < est.peak_reserved
    tight = rs.estimate(make, adamw, batch, device="cuda", capacity="65MiB", steps=2)
    assert tight.fits is False and tight.margin < 0
    with pytest.raises(rs.RidgescopeError):
        rs.estimate(make, adamw, batch, device="cuda", alloc_conf="no_such_option:1")


def _workspaces(est) -> dict[str, int]:
    out: dict[str, int] = {}
    for b in est.report.to_dict()["peak"]["top_blocks"]:
        if b["category"] == "workspace":
            out[b["label"]] = out.get(b["label"], 0) + b["bytes"]
    return out


def test_cublas_workspaces_follow_torchs_handles_and_settings(monkeypatch):
    """torch allocates a cuBLAS workspace per handle and stream, at the handle's first BLAS
    call: one for the thread that runs forward, one for autograd's CUDA worker thread, which
    runs backward and a checkpointed forward's recomputation (so checkpointing adds none).
    CUBLAS_WORKSPACE_CONFIG sets the size as torch parses it (":SIZE_KiB:COUNT" summed). In
    torch 2.11, nn.Linear with bias (addmm's cuBLASLt bias epilogue) also gets a separate
    cuBLASLt workspace per handle (CUBLASLT_WORKSPACE_SIZE KiB, 1 MiB by default, at most the
    cuBLAS one); 2.14 shares the cuBLAS workspace."""
    from ridgescope._estimate._cuda_costs import (DEFAULT_CUBLASLT_WORKSPACE, _uses_cublaslt,
                                                  cublas_workspace_bytes, cublaslt_workspace_bytes)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(100, 30), torch.nn.ReLU(),  # noqa: E731
                                       torch.nn.Linear(30, 7))
    batch = lambda: (torch.randn(5, 100), torch.randint(0, 7, (5,)))  # noqa: E731
    est = rs.estimate(make, adamw, batch, device="cuda", capacity=None, steps=2, remedies=False)
    assert _workspaces(est) == {"cuBLAS workspace (main thread)": DEFAULT_CUDA_WORKSPACE,
                                "cuBLAS workspace (autograd thread)": DEFAULT_CUDA_WORKSPACE}
    mk = lambda: torch.nn.Sequential(torch.nn.Linear(100, 7))  # noqa: E731
    # Checkpointing recomputes on the autograd thread: still two workspaces.
    gpt = lambda: models.TinyGPT(vocab=64, d_model=32, layers=2, seq_len=16,  # noqa: E731
                                 checkpointing=True)
    est = rs.estimate(gpt, adamw, lambda: models.gpt_batch(2, 16, 64), device="cuda",
                      capacity=None, steps=1, remedies=False,
                      loss_fn=lambda m, b: models.gpt_loss(m, *b))
    assert sorted(_workspaces(est).values()) == [DEFAULT_CUDA_WORKSPACE] * 2
    # The size, as torch parses CUBLAS_WORKSPACE_CONFIG.
    assert cublas_workspace_bytes({}) == 32 << 20
    assert cublas_workspace_bytes({"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8"}) == 8519680
    assert cublas_workspace_bytes({"CUBLAS_WORKSPACE_CONFIG": "garbage"}) == 32 << 20
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:2")
    est = rs.estimate(mk, adamw, batch, device="cuda", capacity=None, steps=1, remedies=False)
    assert sum(_workspaces(est).values()) == 2 * (8 << 20)
    # cuBLASLt: separate in 2.11, shared in 2.14; which ops use it.
    assert cublaslt_workspace_bytes(32 << 20, {}, (2, 11)) == DEFAULT_CUBLASLT_WORKSPACE
    assert cublaslt_workspace_bytes(32 << 20, {"CUBLASLT_WORKSPACE_SIZE": "4096"}, (2, 11)) == 4 << 20
    assert cublaslt_workspace_bytes(512 << 10, {}, (2, 11)) == 512 << 10
    assert cublaslt_workspace_bytes(32 << 20, {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "1"}, (2, 11)) == 0
    assert cublaslt_workspace_bytes(32 << 20, {}, (2, 14)) == 0
    bias, x, w = torch.zeros(30), torch.zeros(5, 100), torch.zeros(100, 30)
    assert _uses_cublaslt("addmm", (bias, x, w))
    assert not _uses_cublaslt("addmm", (torch.zeros(5, 30), x, w))  # a 2-D "bias": plain cuBLAS
    assert not _uses_cublaslt("addmm", (bias, torch.zeros(1, 100), w))  # one row
    assert not _uses_cublaslt("mm", (x, w))


def test_a_7b_llama_is_predicted_without_allocating_it():
    """A 7B-parameter Llama-style model in bf16 with AdamW is dry-run on this machine: its
    parameter bytes are 2 per parameter, its state 4 (two bf16 moments), and the process's
    resident memory stays far below the model's size."""
    spec = SPECS["llama-7b"]
    est = rs.estimate(spec.make_model, spec.make_optimizer, spec.make_batch, device="cuda",
                      capacity="80GiB", dtype_policy="bf16", batch_size=1, seq_len=512)
    n = est.report.to_dict()["model"]["parameters"]
    assert 6.5e9 < n < 7e9
    assert est.report.to_dict()["model"]["parameter_bytes"] == 2 * n
    assert est.by_category["parameter"] >= 2 * n
    assert max(p["end_by_category"]["optimizer_state"] for p in est.report.phases()) >= 4 * n
    assert est.fits
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 < 4 * 2**30


def test_sweep_fits_linear_batch_and_quadratic_sequence_scaling_for_materialised_scores():
    """tiny-gpt materialises the (batch, heads, s, s) attention scores: the activation peak is
    linear in the batch size and has a real s^2 term."""
    spec = SPECS["tiny-gpt"]
    est = rs.estimate(spec.make_model, spec.make_optimizer, spec.make_batch, device="cpu",
                      capacity=None, steps=1, batch_size=2, seq_len=64)
    sweep = est.sweep(batch_size=[1, 2, 4], seq_len=[64, 128, 256])
    assert len(sweep.rows) == 9
    b = sweep.batch_scaling
    assert b["model"] == "linear" and b["b"] > 0 and b["max_rel_residual"] < 0.01
    s = sweep.seq_scaling
    assert s["model"] == "quadratic" and s["c"] > 0 and s["quadratic_share"] > 0.1
    # the fit reproduces the measured points
    for row in sweep.rows:
        if row["batch_size"] == s["batch_size"]:
            x = row["seq_len"]
            assert s["a"] + s["b"] * x + s["c"] * x * x == pytest.approx(row["activation_peak"], rel=0.02)


def test_sweep_finds_linear_sequence_scaling_with_sdpa_attention():
    """tiny-llama uses scaled_dot_product_attention (a fused kernel keeps no s x s scores):
    the s^2 term is negligible."""
    spec = SPECS["tiny-llama"]
    est = rs.estimate(spec.make_model, spec.make_optimizer, spec.make_batch, device="cpu",
                      capacity=None, steps=1, batch_size=1, seq_len=64)
    s = est.sweep(batch_size=[2], seq_len=[64, 128, 256]).seq_scaling
    assert s["model"] == "linear" and s["quadratic_share"] < 0.01 and s["b"] > 0


def test_when_it_does_not_fit_the_largest_batch_and_remedies_are_reported():
    """Given a capacity between the peaks at batch 3 and 4, the largest batch that fits is 3
    (each candidate a dry run), and every remedy names how it was computed."""
    spec = SPECS["tiny-gpt"]
    peak = {b: rs.estimate(spec.make_model, spec.make_optimizer, spec.make_batch, device="cpu",
                           capacity=None, batch_size=b, seq_len=128).peak_allocated
            for b in (3, 4)}
    assert peak[3] < peak[4]
    cap = (peak[3] + peak[4]) // 2
    est = rs.estimate(spec.make_model, spec.make_optimizer, spec.make_batch, device="cpu",
                      capacity=cap, batch_size=8, seq_len=128)
    assert est.fits is False and est.margin < 0
    assert est.largest_batch == 3
    names = {r.name: r for r in est.remedies}
    assert names["micro-batch 3"].fits and names["micro-batch 3"].method == "dry run"
    assert names["micro-batch 3"].peak_allocated == peak[3]
    ck = names["activation checkpointing"]
    assert ck.method == "dry run" and ck.peak_allocated < est.peak_allocated
    assert {r.method for r in est.remedies} <= {"dry run", "arithmetic"}
    assert "DOES NOT FIT" in est.summary()


def test_bad_arguments_are_clear_errors():
    spec = SPECS["tiny-gpt"]
    with pytest.raises(ValueError, match="dtype_policy"):
        rs.estimate(spec.make_model, spec.make_optimizer, spec.make_batch, device="cpu",
                    dtype_policy="int3")
    with pytest.raises(ValueError, match="capacity"):
        rs.estimate(spec.make_model, spec.make_optimizer, spec.make_batch, capacity="lots")
    with pytest.raises(ValueError, match="make_batch does not accept"):
        rs.estimate(make_mlp, adamw, lambda: mlp_batch(4, 0), batch_size=4)

    def data_dependent():  # .item() has no value under fake tensors
        x = torch.randn(4, 128)
        return x[: int(x.sum().item() > 0) + 1], torch.zeros(2, dtype=torch.long)
    import glob, tempfile
    pattern = f"{tempfile.gettempdir()}/ridgescope-fit-*.rstrace"
    before = set(glob.glob(pattern))
    with pytest.raises(rs.RidgescopeError, match="fake tensors"):
        rs.estimate(make_mlp, adamw, data_dependent, device="cpu")
    assert set(glob.glob(pattern)) <= before  # the failed run's trace is removed
    assert rs.active_session() is None
    assert rs.estimate(make_mlp, adamw, lambda: mlp_batch(4, 0), device="cpu").fits  # hooks gone


def test_fit_cli_on_a_builtin_spec_and_on_a_spec_file(tmp_path, capsys):
    assert cli_main(["fit", "tiny-gpt", "--device", "cpu", "--capacity", "1GiB",
                     "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] is True and data["spec"] == "tiny-gpt"
    assert data["by_category"]["parameter"] > 0 and data["peak_allocated_bytes"] > 0

    spec = tmp_path / "myspec.py"
    spec.write_text(
        "import torch\n"
        "def make_model():\n    return torch.nn.Linear(64, 8)\n"
        "def make_optimizer(model):\n    return torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "def make_batch(batch_size=4):\n"
        "    return torch.randn(batch_size, 64), torch.randint(0, 8, (batch_size,))\n"
        "BATCH_SIZE = 4\n"
        "if __name__ == '__main__':\n    raise SystemExit('the training part must not run')\n")
    assert cli_main(["fit", str(spec), "--device", "cpu", "--capacity", "1KiB"]) == 2
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "parameter" in out
    assert cli_main(["fit", str(spec), "--device", "cpu", "--format", "json",
                     "--sweep-batch", "1,2,4"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["by_category"]["parameter"] == (64 * 8 + 8) * 4
    assert [r["batch_size"] for r in data["sweep"]["rows"]] == [1, 2, 4]

    # Another GPU's cuBLAS workspace (torch's default off Hopper): two of them, one per thread.
    assert cli_main(["fit", str(spec), "--capacity", "1GiB", "--format", "json",
                     "--cublas-workspace", "8519680", "--no-remedies"]) == 0
    assert json.loads(capsys.readouterr().out)["by_category"]["workspace"] == 2 * 8519680
    assert cli_main(["fit", str(spec), "--cublas-workspace", "lots"]) == 1
    assert "--cublas-workspace" in capsys.readouterr().err

    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    assert cli_main(["fit", str(bad)]) == 1
    assert "does not define make_model" in capsys.readouterr().err
    assert cli_main(["fit", "no-such-spec"]) == 1


def test_code_that_names_the_cuda_device_runs_on_a_machine_without_one():
    """Given callables that put the model and the batch on "cuda" in every usual way, the dry
    run for a CUDA target still runs here, with the same parameter bytes (512-byte blocks)."""
    def make_model():
        with torch.device("cuda"):
            m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        return m.cuda().to("cuda:0")

    def make_batch():
        x = torch.randn(4, 64, device="cuda")
        y = torch.randint(0, 8, (4,)).to("cuda", non_blocking=True)
        return x.cuda(), y.to(torch.device("cuda"))

    est = rs.estimate(make_model, adamw, make_batch, device="cuda", capacity="1GiB")
    blocks = sum(-(-n * 4 // CUDA_BLOCK) * CUDA_BLOCK for n in (64 * 64, 64, 64 * 8, 8))
    assert est.by_category["parameter"] == blocks
    assert est.fits


def test_a_sweep_row_is_the_estimate_at_that_point():
    """Each row of a sweep is a full estimate (the same steps): its peaks and verdict equal
    those of rs.estimate called at that batch size."""
    spec = SPECS["tiny-gpt"]
    kw = dict(device="cuda", capacity="99MiB", seq_len=128)
    est = rs.estimate(spec.make_model, spec.make_optimizer, spec.make_batch, batch_size=1, **kw)
    rows = est.sweep(batch_size=[2, 6]).rows
    for row in rows:
        direct = rs.estimate(spec.make_model, spec.make_optimizer, spec.make_batch,
                             batch_size=row["batch_size"], remedies=False, **kw)
        assert (row["peak_allocated"], row["peak_reserved"], row["activation_peak"], row["fits"]) == (
            direct.peak_allocated, direct.peak_reserved, direct.activation_peak, direct.fits)
    assert rows[0]["fits"] != rows[1]["fits"]  # the grid spans the capacity
