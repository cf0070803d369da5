"""Specification of allocation sites (docs/sites.md) on real CPU training runs of the tests'
TinyGPT: every block at the peak has a site; a tensor made at a known line of this file has
exactly that file, line and function; blocks made in backward name the autograd node and the
module whose forward created it, both as torch's own graph says; stacks="python" and "all"
record whole stacks; the snapshot export carries the frames, so torch's _memory_viz shows the
same file:line."""
from __future__ import annotations

import inspect
import json
import os
import pickle
from pathlib import Path

import pytest
import torch

import ridgescope as rs
from conftest import gpt_inputs, make_gpt
import models

MARKER_BYTES = 777_777  # a size nothing else has: the marker tensor's block, uint8


def this_line() -> int:
    return inspect.currentframe().f_back.f_lineno


def step_with_marker(model, opt, i: int, after_backward=None):
    """One training step of the tests' loop that also makes a marker tensor at a known line."""
    x, y = gpt_inputs(8, i)
    opt.zero_grad(set_to_none=True)
    loss = models.gpt_loss(model, x, y)
    marker = torch.empty(MARKER_BYTES, dtype=torch.uint8); line = this_line()  # noqa: E702
    loss.backward()
    if after_backward is not None:
        after_backward()
    opt.step()
    return marker, line


def tracked_run(path: Path, steps: int = 2, stacks: str | None = "site", after_backward=None,
                keep_last: list | None = None):
    """Tracks `steps` steps; each marker dies with its step, but the last one is appended to
    `keep_last` when given (so that it is live when tracking ends)."""
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with rs.track(model=model, optimizer=opt, out=path, stacks=stacks):
        for i in range(steps):
            if keep_last is not None and i == steps - 1:
                marker, line = step_with_marker(model, opt, i, after_backward)
                keep_last.append(marker)
            else:
                line = step_with_marker(model, opt, i, after_backward)[1]  # the marker dies here
    return model, opt, rs.Report.from_trace(path, top_blocks=100000).to_dict(), line


def frame_of(report: dict, index: int | None) -> dict:
    assert index is not None
    return report["frames"][index]


def library_dirs() -> list[str]:
    return [os.path.dirname(torch.__file__) + os.sep, os.path.dirname(rs.__file__) + os.sep]


def test_every_block_at_the_peak_has_a_site_and_the_marker_its_exact_line(trace_path):
    """Scenario: a tracked TinyGPT training loop makes a uint8 tensor of 777,777 bytes at a known
    line of this file in every step.
    Given the report of the run,
    then every block live at the peak names a site, none of them inside torch or ridgescope,
    the marker's block names this file, that line and this function exactly,
    and the peak's stacks add up to the peak bytes."""
    _, _, r, line = tracked_run(trace_path)
    p = r["peak"]
    blocks = p["top_blocks"]
    assert sum(b["bytes"] for b in blocks) == p["bytes"]  # every block is listed
    for b in blocks:
        assert b["site"], b
        f = frame_of(r, b["site_frame"])
        if f["kind"] == "python":
            assert not any(f["file"].startswith(d) for d in library_dirs()), f
    markers = [b for b in blocks if b["bytes"] == MARKER_BYTES]
    assert len(markers) == 1
    f = frame_of(r, markers[0]["site_frame"])
    assert (f["kind"], f["file"], f["line"], f["function"]) == ("python", __file__, line, "step_with_marker")
    assert markers[0]["site"] == f"{os.path.basename(__file__)}:{line} in step_with_marker"
    assert sum(s["bytes"] for s in p["stacks"]) == p["bytes"]
    assert all(s["site"] != "(no site recorded)" for s in p["by_site"])
    # the model's activations are placed in its forward code (examples/models.py)
    activation_sites = {frame_of(r, s["frame"])["file"] for s in p["by_site"] if s["category"] == "activation"}
    assert models.__file__ in activation_sites
    sites = json.loads(r["metadata"]["sites"])
    assert {k: sites[k] for k in ("mode", "python_frames", "reason")} == {
        "mode": "site", "python_frames": True, "reason": ""}
    # the directories the capture took as library code, for the report to judge frames alike
    assert set(library_dirs()) <= set(sites["library_roots"])
    assert os.path.dirname(os.__file__) + os.sep in sites["stdlib_roots"]
    # every frame of the report carries the core's verdict and texts: the marker's is the user's
    assert (f["library"], f["text"]) == (False, markers[0]["site"])
    assert f["location"] == f"{__file__}:{line} in step_with_marker"


# Backward nodes of view ops: they return a view of the gradient they receive (t() backward is
# grad.t()), so the block is the one the node before them in backward allocated.
VIEW_NODES = {"TBackward0", "TransposeBackward0", "PermuteBackward0", "ViewBackward0"}


def producers_of_gradients(loss: torch.Tensor, params: dict[int, str]) -> dict[str, str]:
    """torch's own graph: for each parameter, the backward node that allocates its gradient: the
    node whose output AccumulateGrad takes, or, past view nodes, the node that feeds them."""
    out: dict[str, str] = {}
    seen: set[int] = set()
    stack = [(loss.grad_fn, None)]  # (node, the node that feeds it in backward)
    while stack:
        node, feeder = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        allocating = feeder if type(node).__name__ in VIEW_NODES and feeder is not None else node
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            if type(nxt).__name__ == "AccumulateGrad" and id(nxt.variable) in params:
                out[params[id(nxt.variable)]] = type(allocating).__name__
            stack.append((nxt, allocating))
    return out


def test_blocks_made_in_backward_name_the_autograd_node_and_its_module(trace_path):
    """Scenario: the same loop for four steps, with a large tensor made right after backward and
    kept, so that the peak comes after the last step's backward and every gradient is live there
    (the module calls of the steps before the one before are forgotten at each step by then).
    Given the report,
    then each gradient's site is the backward node that produced it and the module that owns the
    parameter, as torch's own graph of that step says ("AddmmBackward0 of layers.0.mlp.fc1")."""
    holder = []
    _, _, r, _ = tracked_run(trace_path, steps=4,
                             after_backward=lambda: holder.append(torch.empty(8 << 20, dtype=torch.uint8)))
    model = make_gpt()
    names = {id(p): n for n, p in model.named_parameters()}
    x, y = gpt_inputs(8, 0)
    expected = producers_of_gradients(models.gpt_loss(model, x, y), names)
    assert len(expected) == len(names)
    grads = {b["label"]: b for b in r["peak"]["top_blocks"] if b["category"] == "gradient"}
    assert set(grads) == {f"grad of {n}" for n in names.values()}
    for name, node in expected.items():
        owner = name.rsplit(".", 1)[0]
        b = grads[f"grad of {name}"]
        f = frame_of(r, b["site_frame"])
        assert (f["kind"], f["function"], f["module"]) == ("autograd", node, owner), name
        assert b["site"] == f"{node} of {owner}"


def test_python_stacks_hold_the_whole_stack_and_all_adds_native_frames(tmp_path):
    """Scenario: the loop tracked with stacks="python", then with stacks="all".
    Then the marker's stack runs from the marker line out through this test to pytest, its site
    being the marker line; every gradient's stack starts at its autograd node (the site) with the
    Python frames of loss.backward() above it; with "all" native frames come first."""
    for stacks in ("python", "all"):
        path = tmp_path / f"{stacks}.rstrace"
        _, _, r, line = tracked_run(path, steps=1, stacks=stacks,
                                    after_backward=lambda: torch.empty(8 << 20, dtype=torch.uint8))
        frames = r["frames"]
        by_bytes = {}
        for s in r["peak"]["stacks"]:
            by_bytes.setdefault(s["bytes"], []).append(s)
        marker = by_bytes[MARKER_BYTES][0]
        kinds = [frames[i]["kind"] for i in marker["frames"]]
        site = frames[marker["frames"][marker["site"]]]
        assert (site["file"], site["line"], site["function"]) == (__file__, line, "step_with_marker")
        python = [frames[i] for i in marker["frames"] if frames[i]["kind"] == "python"]
        assert python[0]["file"] == __file__  # torch.empty is C: the innermost Python frame is the line
        assert any(f["function"] == "tracked_run" for f in python)
        assert any("_pytest" in f["file"] for f in python)  # the whole stack, out to pytest
        if stacks == "all":
            assert kinds[0] == "native" and "native" not in kinds[kinds.index("python"):]
        else:
            assert set(kinds) == {"python"}
        grad = next(s for s in r["peak"]["stacks"] if s["by_category"].get("gradient"))
        g = [frames[i] for i in grad["frames"]]
        assert g[grad["site"]]["kind"] == "autograd"
        assert any(f["function"] == "_engine_run_backward" for f in g)
        assert sum(s["bytes"] for s in r["peak"]["stacks"]) == r["peak"]["bytes"]


def test_stacks_none_records_no_site_and_a_bad_mode_is_refused(trace_path):
    """stacks=None records no site (the report says so); an unknown mode is a clear error."""
    _, _, r, _ = tracked_run(trace_path, steps=1, stacks=None)
    assert r["frames"] == []
    assert [s["site"] for s in r["peak"]["by_site"]] == ["(no site recorded)"] * len(r["peak"]["by_site"])
    with pytest.raises(ValueError, match="stacks must be one of 'site', 'python', 'all' or None, got 'full'"):
        rs.track(stacks="full")


def test_the_snapshot_export_carries_the_frames_memory_viz_shows(trace_path, tmp_path):
    """Scenario: the run exported with report.to_snapshot().
    Then torch.cuda._memory_viz reads it: its flame graph of the live blocks and of the segments
    names the marker's file:line:function with the marker's exact bytes, and the marker's alloc
    entry carries the recorded frame first, then ridgescope's pseudo frame."""
    from torch.cuda import _memory_viz

    live: list = []  # the last marker, live when tracking ends: in the snapshot's segments
    _, _, _, line = tracked_run(trace_path, steps=2, keep_last=live)
    out = tmp_path / "run.pickle"
    rs.load(trace_path).to_snapshot(out)
    with open(out, "rb") as f:
        snap = pickle.load(f)  # our own export: plain types only
    want = f"{os.path.basename(__file__)}:{line}:step_with_marker"
    lines = _memory_viz.memory(snap, format_flamegraph=lambda text: text).splitlines()
    hits = [x for x in lines if want in x]
    assert len(hits) == 1 and hits[0].endswith(f" {MARKER_BYTES}")
    assert any(want in x for x in _memory_viz.segments(snap, format_flamegraph=lambda text: text).splitlines())
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc" and e["size"] == MARKER_BYTES]
    assert len(allocs) == 2
    assert allocs[0]["frames"][0] == {"filename": __file__, "line": line, "name": "step_with_marker"}
    assert allocs[0]["frames"][-1]["filename"] == "ridgescope"
    assert allocs[0]["user_metadata"]["site"] == f"{os.path.basename(__file__)}:{line} in step_with_marker"


BEFORE_BYTES, AFTER_BYTES = 333_331, 333_349  # sizes nothing else has


def two_optimizer_steps(opt) -> tuple[list, int, int]:
    """Two optimizer steps from two lines of this file, right after one another, between two
    marker tensors."""
    keep = [torch.empty(BEFORE_BYTES, dtype=torch.uint8)]
    opt.step(); first = this_line()  # noqa: E702
    opt.step(); second = this_line()  # noqa: E702
    keep.append(torch.empty(AFTER_BYTES, dtype=torch.uint8))
    return keep, first, second


def test_every_temporary_of_a_library_loop_names_the_user_line_that_called_it(tmp_path):
    """Scenario: torch's single-tensor AdamW (a loop over parameters in library code that makes
    temporaries at several of its own lines, one parameter after another) is stepped twice from
    two consecutive lines of this file, with nothing allocated between the two steps.
    Given the run exported as a snapshot (one entry for every allocation, its site first),
    then the allocations between the markers are the two steps' temporaries, as many in each,
    and every one of the first step names the first line and this function, every one of the
    second step the second line: the line the user wrote, whichever of torch's lines made it and
    however many allocations before it came from the same loop at the same depth."""
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    path = tmp_path / "run.rstrace"
    with rs.track(model=model, optimizer=opt, out=path):
        x, y = gpt_inputs(8, 0)
        models.gpt_loss(model, x, y).backward()
        opt.step()  # the state is made here: the two steps below only update it
        _, first, second = two_optimizer_steps(opt)
    out = tmp_path / "run.pickle"
    rs.load(path).to_snapshot(out)
    with open(out, "rb") as f:
        snap = pickle.load(f)  # our own export: plain types only
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    at = {e["size"]: i for i, e in enumerate(allocs) if e["size"] in (BEFORE_BYTES, AFTER_BYTES)}
    window = allocs[at[BEFORE_BYTES] + 1:at[AFTER_BYTES]]
    per_step = len(window) // 2
    assert len(window) == 2 * per_step
    assert per_step >= 2 * len(list(model.parameters()))  # two temporaries a parameter at least
    sites = [(e["frames"][0]["filename"], e["frames"][0]["line"], e["frames"][0]["name"]) for e in window]
    assert sites == ([(__file__, first, "two_optimizer_steps")] * per_step
                     + [(__file__, second, "two_optimizer_steps")] * per_step)


def test_ridgescope_run_records_the_scripts_own_lines(tmp_path):
    """Scenario: `ridgescope run --stacks python` on an unmodified script that makes a tensor at
    its line 4 (a module-level statement run by runpy).
    Then the tensor's site is the script's line 4 in <module>, and its whole stack ends in
    ridgescope's and runpy's frames, which the site skips."""
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text("import torch\n"
                      "keep = []\n"
                      "for i in range(2):\n"
                      "    keep.append(torch.empty(333_333, dtype=torch.uint8))\n")
    out = tmp_path / "train.rstrace"
    subprocess.run([sys.executable, "-m", "ridgescope.cli", "run", "--stacks", "python", "-o", str(out), str(script)],
                   check=True, capture_output=True, cwd=tmp_path)
    r = rs.load(out, top_blocks=1000).to_dict()
    blocks = [b for b in r["peak"]["top_blocks"] if b["bytes"] == 333_333]
    assert len(blocks) == 2
    assert {b["site"] for b in blocks} == {"train.py:4 in <module>"}
    stack = next(s for s in r["peak"]["stacks"] if s["bytes"] == 2 * 333_333)
    files = [r["frames"][i]["file"] for i in stack["frames"]]
    assert files[stack["site"]] == str(script)
    assert any(f.endswith("runpy.py") or f == "<frozen runpy>" for f in files[stack["site"] + 1:])
    assert any(f.startswith(os.path.dirname(rs.__file__)) for f in files[stack["site"] + 1:])


def compiled_body(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) * 2 + 1


def test_allocations_of_a_compiled_function_are_placed_in_it_not_in_generated_code(tmp_path):
    """Scenario: a function compiled with torch.compile (the eager backend: Dynamo's graph runs as
    torch.fx generated code) is called three times and its results kept.
    Then the blocks it made are placed in that function (this file), never in the code Dynamo and
    torch.fx generated (`<eval_with_key>`) or in torch."""
    compiled = torch.compile(compiled_body, backend="eager")
    x = torch.randn(1000)
    out = tmp_path / "compiled.rstrace"
    with rs.track(out=out):
        kept = [compiled(x) for _ in range(3)]
    r = rs.load(out, top_blocks=1000).to_dict()
    mine = [b for b in r["peak"]["top_blocks"] if b["bytes"] == storage_nbytes(kept[0])]
    assert len(mine) >= 3
    for b in mine:
        f = r["frames"][b["site_frame"]]
        assert (f["file"], f["function"]) == (__file__, "compiled_body"), b["site"]


def storage_nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()
