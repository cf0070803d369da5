"""Specification of tracking compiled training (python/ridgescope/_compile.py, docs/compile.md).

Every run compiles with Inductor's C++ backend on the CPU. The truth comes from torch: the same
script untracked (its losses, bit for bit, and Dynamo's own counters: frames converted,
recompiles, graph breaks by reason) and the model's and optimizer's tensors (numel x element
size). Compiling is the expensive part, so each way of compiling is run once untracked and once
tracked (module-scoped fixtures); Inductor's on-disk cache serves the second compilation of an
identical graph.

The runs use one CPU thread: Inductor's C++ kernels reduce (and scatter-add, in the embedding's
backward) across OpenMP threads in whatever order the threads finish, so with two threads an
untracked compiled run is not bitwise equal to itself, let alone to a tracked one.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import ridgescope as rs
from conftest import optimizer_state_bytes, param_bytes

import train_compiled  # examples/, on sys.path through conftest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="Inductor's CPU backend needs a C++ compiler")

PERSISTENT = ("parameter", "buffer", "gradient", "optimizer_state", "input")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def fresh_dynamo() -> None:
    """As a new process would start: no compiled code, no counters."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()


def run(how: str, tracked: bool, path: Path | None = None, batches=(4, 4, 4, 4),
        activations: bool = True, fullgraph: bool = False, dynamic: bool | None = None):
    """Trains train_compiled's model the way `how` compiles it, one step per batch size;
    returns (losses, Dynamo's counters, warnings raised, report or None, model, optimizer)."""
    fresh_dynamo()
    model, opt = train_compiled.build(how)
    module, step = None, None
    report = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def loop():
            nonlocal module, step
            module, step = train_compiled.compiled_loop(model, opt, how, fullgraph=fullgraph,
                                                        dynamic=dynamic)
            losses = []
            for i, batch in enumerate(batches):
                x, y = train_compiled.gpt_batch(batch, 16, 64, seed=i)
                losses.append(step(module, opt, x, y).item())
            return losses
        if tracked:
            with rs.track(model=model, optimizer=opt, out=path, activations=activations) as s:
                losses = loop()
            assert s.error is None
            report = s.report().to_dict()
        else:
            losses = loop()
    counters = train_compiled.dynamo_counters()
    messages = sorted({str(w.message) for w in caught})
    return losses, counters, messages, report, model, opt


HOWS = {  # the ways a user compiles, and what each run does beyond 4 steps
    # torch.compile(model); a new batch size recompiles (static shapes: a cheaper compile)
    "module": {"batches": (4, 4, 4, 4, 2), "dynamic": False},
    "method": {"fullgraph": True},            # model.compile(fullgraph=True)
    "step": {},                               # torch.compile(train_step)
    "graph-break": {},                        # torch.compile(model), a graph break on purpose
}


@pytest.fixture(scope="module", params=list(HOWS))
def runs(request, tmp_path_factory):
    how = request.param
    kw = HOWS[how]
    run(how, False, **kw)  # fills Inductor's cache: the two runs compared both read it
    plain = run(how, False, **kw)
    tracked = run(how, True, tmp_path_factory.mktemp(how) / "run.rstrace", **kw)
    yield how, plain, tracked
    fresh_dynamo()


def phases(report, name):
    return [(s["step"], p) for s in report["steps"] for p in s["phases"] if p["phase"] == name]


def test_tracking_changes_no_loss_no_counter_and_warns_nothing(runs):
    """Scenario: a compiled transformer trained with AdamW, untracked and under rs.track.
    Then the losses are bitwise identical, Dynamo's counters (frames converted and compiled,
    recompiles, graph breaks with their reasons) are the same, and tracking adds no warning."""
    how, (plain_losses, plain_counters, plain_warnings, *_), tracked = runs
    losses, counters, tracked_warnings, report, *_ = tracked
    assert [v.hex() for v in losses] == [v.hex() for v in plain_losses]
    assert counters == plain_counters
    assert counters["unique_graphs"] >= 1
    if how == "graph-break":
        assert sum(counters["graph_break"].values()) >= 1
    assert tracked_warnings == plain_warnings
    assert not any("ridgescope" in m or "global hooks" in m for m in tracked_warnings)
    assert len([s for s in report["steps"] if s["complete"]]) == len(losses)


def test_persistent_bytes_are_exact_and_activation_is_the_rest_at_forward_end(runs):
    """Then parameters, gradients (at every backward's end) and AdamW's state are exact; the
    compiled graph's saved tensors are activations, so at every forward's end activation is live
    bytes minus parameters, buffers, gradients, optimizer state and inputs, to the byte; unknown
    stays under 1 % of the peak and the ledger agrees with the allocator at every boundary."""
    how, _, (losses, _, _, r, model, opt) = runs
    p_bytes = param_bytes(model)
    assert r["peak"]["by_category"]["parameter"] == p_bytes
    assert r["model"]["parameter_bytes"] == p_bytes
    backwards = phases(r, "backward")
    assert len(backwards) == len(losses)
    for _, p in backwards:
        assert p["end_by_category"]["gradient"] == p_bytes
    steps = phases(r, "optimizer_step")
    assert len(steps) >= len(losses) - 1  # a compiled step's first call learns that it steps
    state = optimizer_state_bytes(opt)
    for _, p in steps:
        assert p["end_by_category"]["optimizer_state"] == state
    forwards = phases(r, "forward")
    assert [s for s, _ in forwards] == list(range(len(losses)))
    for _, p in forwards:
        e = p["end_by_category"]
        assert e["activation"] > 0
        assert e["activation"] == p["end_bytes"] - sum(e[c] for c in PERSISTENT)
    assert r["peak"]["by_category"]["unknown"] < 0.01 * r["peak"]["bytes"]
    assert r["consistency"]["mismatches"] == 0 and r["consistency"]["samples"] > 0


def test_the_compile_phase_is_in_step_0_and_again_only_where_dynamo_recompiles(runs):
    """Then `compile` appears in step 0 with its peak bytes, nested where it happens (inside the
    first forward of a compiled model), and in a later step only when a new input shape makes
    Dynamo recompile."""
    how, _, (losses, counters, _, r, *_) = runs
    compiles = phases(r, "compile")
    assert compiles and all(p["peak_bytes"] > 0 for _, p in compiles)
    assert compiles[0][0] == 0
    recompiled = [s for s, _ in compiles if s > 0]
    if how == "module":  # the fifth step has a new batch size
        assert counters["unique_graphs"] == 2
        assert recompiled and set(recompiled) == {len(losses) - 1}
    else:
        assert recompiled == []
    if how in ("module", "method", "graph-break"):
        first = next(p for p in r["steps"][0]["phases"] if p["phase"] == "compile")
        assert first["parent"] == "forward" and first["depth"] == 1


def test_saved_tensors_of_compiled_graphs_are_labelled_by_the_compiled_region(runs):
    """Then the compiled graph's saved tensors carry the module (or function) that was
    compiled, there being no finer name inside a compiled graph."""
    how, _, (*_, r, model, opt) = runs
    labels = {b["label"] for b in r["peak"]["by_label"] if b["category"] == "activation"}
    region = "train_step (compiled)" if how == "step" else "GraphBreakGPT" if how == "graph-break" \
        else "TinyGPT"
    assert any(l == f"activation saved in {region}" for l in labels), labels


def test_without_the_saved_tensor_hook_unknown_stays_under_one_percent(tmp_path):
    """Given activations=False, when a compiled model trains, then lifetimes find the compiled
    graph's saved tensors: unknown stays under 1 % of the peak and activation is what the hook
    would have tagged, within 1 %."""
    *_, hooked, _, _ = run("module", True, tmp_path / "hook.rstrace")
    losses, counters, _, life, model, _ = run("module", True, tmp_path / "life.rstrace",
                                              activations=False)
    assert life["peak"]["by_category"]["unknown"] < 0.01 * life["peak"]["bytes"]
    assert life["peak"]["by_category"]["activation"] == pytest.approx(
        hooked["peak"]["by_category"]["activation"], rel=0.01)
    assert life["peak"]["inferred_by_category"]["activation"] > 0
    assert life["peak"]["by_category"]["parameter"] == param_bytes(model)


@pytest.mark.parametrize("how", ["module", "method"])
def test_a_model_compiled_and_run_before_tracking_starts_is_not_recompiled(how, tmp_path):
    """Given a model compiled (torch.compile(model) or model.compile()) and trained two steps
    before rs.track starts, when three more steps are tracked, then Dynamo converts and compiles
    nothing more (its counters do not move), nothing warns, and the tracked steps have their
    forward, backward and optimizer_step with unknown under 1 %."""
    fresh_dynamo()
    model, opt = train_compiled.build(how)
    module, step = train_compiled.compiled_loop(model, opt, how)

    def train(first, n):
        for i in range(first, first + n):
            x, y = train_compiled.gpt_batch(4, 16, 64, seed=i)
            step(module, opt, x, y)
    train(0, 2)
    before = train_compiled.dynamo_counters()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with rs.track(model=model, optimizer=opt, out=tmp_path / "r.rstrace") as s:
            train(2, 3)
    assert train_compiled.dynamo_counters() == before
    assert [str(w.message) for w in caught] == []
    r = s.report().to_dict()
    assert [[p["phase"] for p in st["phases"]] for st in r["steps"]] == \
        [["zero_grad", "forward", "backward", "optimizer_step"]] * 3
    assert r["peak"]["by_category"]["unknown"] < 0.01 * r["peak"]["bytes"]
    assert r["peak"]["by_category"]["parameter"] == param_bytes(model)


def test_ridgescope_run_of_a_compiled_script_is_the_untracked_script(tmp_path):
    """Given examples/train_compiled.py (torch.compile of a transformer, AdamW, 4 steps), when
    it runs plainly and under `ridgescope run`, then both exit 0 with the same losses and
    Dynamo counters on stdout, and ridgescope adds to stderr only its report lines."""
    script = EXAMPLES / "train_compiled.py"
    args = ["--json", "--threads", "1"]
    plain = subprocess.run([sys.executable, str(script), *args], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
    tracked = subprocess.run([sys.executable, "-m", "ridgescope", "run", str(script), *args],
                             cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr
    assert tracked.returncode == 0, tracked.stderr
    assert json.loads(tracked.stdout) == json.loads(plain.stdout)
    def lines(text):  # torch's log lines carry a time and a process id: not ridgescope's doing
        return [re.sub(r"^([DIWEC])\d{4} [\d:.]+ \d+ ", r"\1 ", line) for line in text.splitlines()]
    extra = [line for line in lines(tracked.stderr) if line not in lines(plain.stderr)]
    assert extra and all(line.startswith("ridgescope: ") or not line.strip() for line in extra), extra
    r = rs.load(tmp_path / "train_compiled.rstrace").to_dict()
    model, _ = train_compiled.build("module")
    assert r["peak"]["by_category"]["parameter"] == param_bytes(model)
    assert len([s for s in r["steps"] if s["complete"]]) == 4
    assert r["peak"]["by_category"]["unknown"] < 0.01 * r["peak"]["bytes"]


def test_a_compiled_module_given_to_track_is_named_as_the_model_it_compiles(tmp_path):
    """Given rs.track(model=torch.compile(model)), then the parameters are named as in the model
    (no `_orig_mod.` prefix) and their bytes are exact (nothing is compiled: the names are read
    when tracking starts)."""
    model, opt = train_compiled.build("module")
    with rs.track(model=torch.compile(model), optimizer=opt, out=tmp_path / "r.rstrace") as s:
        pass
    r = s.report(top_blocks=200).to_dict()
    labels = {b["label"] for b in r["peak"]["top_blocks"] if b["category"] == "parameter"}
    assert "head.weight" in labels and not any("_orig_mod" in l for l in labels)
    assert r["peak"]["by_category"]["parameter"] == param_bytes(model)


# ------------------------------------------------------------------ pieces that need no compiler
def test_cuda_graph_pools_are_summed_per_pool_from_torchs_segments():
    """Given torch.cuda.memory_snapshot()'s segments (here as a GPU with two CUDA graph pools
    would list them), then each (device, segment_pool_id) is its own pool with its segments'
    reserved and allocated bytes, the default pool (0, 0) included, and the text report lists
    them when a private pool exists."""
    from ridgescope._compile import summarize_pools
    from ridgescope._reporters._text import _pool_lines
    MiB = 1 << 20
    segments = [
        {"device": 0, "segment_pool_id": (0, 0), "total_size": 20 * MiB, "allocated_size": 3 * MiB},
        {"device": 0, "segment_pool_id": (0, 1), "total_size": 2 * MiB, "allocated_size": 512},
        {"device": 0, "segment_pool_id": (0, 1), "total_size": 4 * MiB, "allocated_size": 4 * MiB},
        {"device": 0, "segment_pool_id": (0, 0), "total_size": 2 * MiB, "allocated_size": 0},
        {"device": 1, "segment_pool_id": (7, 0), "total_size": 2 * MiB, "allocated_size": MiB},
    ]
    pools = summarize_pools(segments)
    assert pools == [
        {"device": 0, "pool_id": [0, 0], "segments": 2, "reserved_bytes": 22 * MiB,
         "allocated_bytes": 3 * MiB},
        {"device": 0, "pool_id": [0, 1], "segments": 2, "reserved_bytes": 6 * MiB,
         "allocated_bytes": 4 * MiB + 512},
        {"device": 1, "pool_id": [7, 0], "segments": 1, "reserved_bytes": 2 * MiB,
         "allocated_bytes": MiB},
    ]
    lines = _pool_lines({"metadata": {"cuda_pools": json.dumps({"pools": pools})}})
    assert any("pool (0, 1)" in line and "6.00 MiB reserved in 2 segment(s)" in line for line in lines)
    assert _pool_lines({"metadata": {"cuda_pools": json.dumps({"pools": pools[:1]})}}) == []
    assert _pool_lines({"metadata": {}}) == []


def test_hidden_hooks_come_back_in_their_order_and_nesting_needs_the_last_show():
    """Given three global forward pre-hooks of which ridgescope owns the middle one, when it is
    hidden twice (a compiled block inside a compiled model) and shown twice, then torch's hook
    dictionary lacks it until the last show and then holds all three in the original order."""
    from ridgescope._compile import _HiddenHooks
    mm = torch.nn.modules.module
    calls = []
    handles = [mm.register_module_forward_pre_hook(lambda m, a, i=i: calls.append(i)) for i in range(3)]
    try:
        hidden = _HiddenHooks()
        hidden.set_handles([handles[1]])
        order = list(mm._global_forward_pre_hooks)
        hidden.hide()
        hidden.hide()
        assert handles[1].id not in mm._global_forward_pre_hooks
        hidden.show()
        assert handles[1].id not in mm._global_forward_pre_hooks
        hidden.show()
        assert list(mm._global_forward_pre_hooks) == order
        torch.nn.Identity()(torch.ones(1))
        assert calls == [0, 1, 2]
    finally:
        for h in handles:
            h.remove()
