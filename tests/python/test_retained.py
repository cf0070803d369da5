"""Specification of the retained-tensor verdict (docs/sites.md, "Retained tensors") on real CPU
training loops of the tests' TinyGPT: a loop that appends an intermediate to a list every step,
and one that keeps a whole graph alive by appending an evaluation loss without .item(), get the
verdict naming the line and the growth per step to the byte (the truth from torch: the kept
tensors' storages); lazy AdamW state, a cache that grows and then plateaus, and gradient
accumulation get none."""
from __future__ import annotations

import inspect
import os

import torch
import torch.nn.functional as F

import ridgescope as rs
from conftest import gpt_inputs, make_gpt, train
from inprocess_cli import ridgescope
import models

STEPS = 6


def this_line() -> int:
    return inspect.currentframe().f_back.f_lineno


def storage_bytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def retained(path) -> dict | None:
    return rs.load(path).to_dict()["retained"]


def test_an_intermediate_appended_to_a_list_every_step(trace_path):
    """Scenario: the loop appends a 256 KiB intermediate (a float32 tensor of 65,536 values made
    at a known line) to a Python list in every one of 6 steps.
    Then the retained-tensor verdict holds since step 1, grows by the tensor's storage bytes at
    every step end exactly, names this file's line and function, category unknown; the warning
    says it with the remedy and `ridgescope explain` prints it."""
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    kept: list[torch.Tensor] = []
    with rs.track(model=model, optimizer=opt, out=trace_path):
        for step in range(STEPS):
            x, y = gpt_inputs(8, step)
            opt.zero_grad(set_to_none=True)
            loss = models.gpt_loss(model, x, y)
            kept.append(torch.full((65536,), float(step))); line = this_line()  # noqa: E702
            loss.backward()
            opt.step()
    each = storage_bytes(kept[0])
    assert each == 256 * 1024
    r = retained(trace_path)
    assert r is not None
    assert (r["since_step"], r["last_step"], r["growth_steps"]) == (1, STEPS - 1, STEPS - 1)
    assert r["growth_per_step_bytes"] == each and r["growth_constant"]
    assert (r["bytes"], r["blocks"]) == (sum(map(storage_bytes, kept)), STEPS)
    assert len(r["sites"]) == 1
    site = r["sites"][0]
    name = os.path.basename(__file__)
    assert site["site"] == f"{name}:{line} in test_an_intermediate_appended_to_a_list_every_step"
    assert (site["category"], site["growth_per_step_bytes"]) == ("unknown", each)
    summary = (f"256 KiB more is live at the end of every step since step 1 ({STEPS} blocks, 1.50 MiB now), "
               f"allocated at {name}:{line} in `test_an_intermediate_appended_to_a_list_every_step`, category unknown: "
               "a tensor kept across steps (for example appended to a list).")
    assert r["verdict"]["kind"] == "retained_tensors"
    assert r["verdict"]["summary"] == summary
    warning = next(w for w in rs.load(trace_path).warnings if w["kind"] == "retained_tensors")
    assert warning["message"] == summary + " Remedy: keep `.item()`/`.detach().cpu()` of it, or drop the reference."
    done = ridgescope("explain", str(trace_path))
    assert done.returncode == 0, done.stderr
    explained = done.stdout
    assert f"Retained tensors (retained_tensors): {summary}" in explained


LOSS_LINES: list[int] = []


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """An evaluation loss made at a known line of this file, with its graph (no torch.no_grad())."""
    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1)); LOSS_LINES.append(this_line())  # noqa: E702
    return loss


def saved_storages(root: torch.Tensor) -> dict[int, int]:
    """torch's own graph: the storages (data pointer -> bytes) of every tensor saved for backward
    in the graph of `root`, through the nodes' `_saved_*` attributes."""
    out: dict[int, int] = {}
    seen: set[int] = set()
    stack = [root.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            value = getattr(node, attr)
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    out[t.untyped_storage().data_ptr()] = storage_bytes(t)
        stack.extend(n for n, _ in node.next_functions if n is not None)
    return out


def test_a_graph_kept_alive_by_an_evaluation_loss_appended_without_item(trace_path):
    """Scenario: after every training step the loop evaluates a fixed batch without
    torch.no_grad() and appends the loss itself, not loss.item(), to a history list; each kept
    loss keeps its whole graph, with every tensor saved for its backward.
    Then the verdict holds since step 1, grows at every step end by exactly the bytes of one
    graph (its saved tensors' storages that are neither parameters nor the fixed batch, and the
    loss itself: torch's own graph says which), mostly activations, and names the evaluation
    loss's line as the latest site."""
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    xv, yv = gpt_inputs(8, 1000)
    history: list[torch.Tensor] = []
    with rs.track(model=model, optimizer=opt, out=trace_path):
        for step in range(STEPS):
            x, y = gpt_inputs(8, step)
            opt.zero_grad(set_to_none=True)
            models.gpt_loss(model, x, y).backward()
            opt.step()
            history.append(evaluate(model, xv, yv))
    fixed = {p.untyped_storage().data_ptr() for p in model.parameters()}
    fixed |= {xv.untyped_storage().data_ptr(), yv.untyped_storage().data_ptr()}
    graph = {ptr: n for ptr, n in saved_storages(history[-1]).items() if ptr not in fixed}
    graph[history[-1].untyped_storage().data_ptr()] = storage_bytes(history[-1])
    r = retained(trace_path)
    assert r is not None
    assert (r["since_step"], r["last_step"]) == (1, STEPS - 1)
    assert r["growth_per_step_bytes"] == sum(graph.values()) and r["growth_constant"]
    latest = r["sites"][r["latest"]]
    assert latest["site"] == f"{os.path.basename(__file__)}:{LOSS_LINES[-1]} in evaluate"
    assert r["verdict"]["dominant_category"] == "activation"
    assert "the autograd graph of a forward is kept across steps" in r["verdict"]["summary"]
    assert "torch.no_grad()" in r["verdict"]["remedies"][0]["action"]


def test_state_that_grows_once_a_plateauing_cache_and_accumulation_give_no_verdict(tmp_path):
    """Scenario: three loops of 6 steps that grow memory without keeping a tensor across steps
    for good: AdamW creating its state lazily in the first step; a cache that keeps one tensor
    per step for the first three steps and then only reuses them; gradient accumulation over two
    micro-batches with set_to_none=False (gradients made once and accumulated in place).
    Then none of them gets the retained-tensor verdict or its warning."""
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lazy = tmp_path / "lazy.rstrace"
    with rs.track(model=model, optimizer=opt, out=lazy):
        train(model, opt, lambda i: gpt_inputs(8, i), models.gpt_loss, steps=STEPS)
    assert rs.load(lazy).to_dict()["optimizer"]["state_bytes"] > 0
    assert any(w["kind"] == "lazy_optimizer_state" for w in rs.load(lazy).warnings)

    cache: dict[int, torch.Tensor] = {}
    cached = tmp_path / "cache.rstrace"
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with rs.track(model=model, optimizer=opt, out=cached):
        for step in range(STEPS):
            x, y = gpt_inputs(8, step)
            opt.zero_grad(set_to_none=True)
            key = min(step, 2)
            if key not in cache:
                cache[key] = torch.full((65536,), float(step))
            (models.gpt_loss(model, x, y) + cache[key].sum() * 0).backward()
            opt.step()
    assert len(cache) == 3

    accumulated = tmp_path / "accumulate.rstrace"
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with rs.track(model=model, optimizer=opt, out=accumulated):
        train(model, opt, lambda i: gpt_inputs(4, i), models.gpt_loss, steps=STEPS, micro_batches=2,
              set_to_none=False)

    for path in (lazy, cached, accumulated):
        d = rs.load(path).to_dict()
        assert d["retained"] is None, (path.name, d["retained"])
        assert not any(w["kind"] == "retained_tensors" for w in d["warnings"])
        assert len(d["steps"]) >= STEPS
