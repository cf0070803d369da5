"""Specification of the phases of ``optimizer.step(closure)`` (python/ridgescope/_instrument.py).

Scenario: the closure form of a training step, as LBFGS requires and Lightning's automatic
optimisation uses for every optimizer: ``step`` calls the closure, which runs zero_grad,
forward and backward, and then updates. The optimizer_step phase is the update alone, so
forward and backward are top-level phases of the step as in the ordinary loop; results are
bitwise identical with and without tracking."""
from __future__ import annotations

import warnings

import torch

import ridgescope as rs
from conftest import make_mlp, mlp_batch


def closure_training(model, opt, steps: int) -> list[float]:
    losses = []
    for step in range(steps):
        x, y = mlp_batch(16, step)

        def closure():
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            losses.append(loss.item())
            return loss

        opt.step(closure)
    return losses


def run(make_opt, steps: int, tracked: bool, path=None):
    model = make_mlp()
    opt = make_opt(model)
    if not tracked:
        return closure_training(model, opt, steps), model, opt, None
    with rs.track(model=model, optimizer=opt, out=path) as session:
        losses = closure_training(model, opt, steps)
    return losses, model, opt, session.report()


def top_level(step: dict) -> list[str]:
    return [p["phase"] for p in step["phases"] if p["depth"] == 0]


def test_step_with_a_closure_reads_like_an_ordinary_step(tmp_path):
    """Given AdamW stepped with a closure for 3 steps, then each step is zero_grad, forward,
    backward, optimizer_step at the top level (forward and backward are not inside the
    optimizer step), and losses and weights are bitwise identical to an untracked run."""
    adamw = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tracked, model, opt, report = run(adamw, 3, True, tmp_path / "run.rstrace")
    plain, untracked, _, _ = run(adamw, 3, False)
    assert tracked == plain
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), untracked.parameters()))
    steps = [s for s in report.steps if s["complete"]]
    assert len(steps) == 3
    for step in steps:
        assert top_level(step) == ["zero_grad", "forward", "backward", "optimizer_step"]
    # the optimizer state is still found at the update (AdamW's two moments and a counter)
    params = list(model.parameters())
    state = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values())
    assert report.to_dict()["optimizer"]["state_bytes"] == state == \
        2 * sum(p.numel() * p.element_size() for p in params) + 4 * len(params)


def test_lbfgs_line_search_is_inside_its_optimizer_step(tmp_path):
    """Given LBFGS (it calls the closure several times within one step), then each step's first
    forward and backward come before its optimizer_step and the later ones (its line search)
    are inside it, 2 steps and 2 optimizer steps are counted, and the results are bitwise
    identical to an untracked run."""
    lbfgs = lambda m: torch.optim.LBFGS(m.parameters(), lr=0.1, max_iter=4)  # noqa: E731
    tracked, model, _, report = run(lbfgs, 2, True, tmp_path / "run.rstrace")
    plain, untracked, _, _ = run(lbfgs, 2, False)
    assert tracked == plain and len(plain) > 2  # more closure calls than steps
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), untracked.parameters()))
    assert report.to_dict()["optimizer"]["steps"] == 2
    steps = [s for s in report.steps if s["complete"]]
    assert len(steps) == 2
    for step in steps:
        assert top_level(step) == ["zero_grad", "forward", "backward", "optimizer_step"]
        inside = [p for p in step["phases"] if p["depth"] > 0]
        assert inside and {p["parent"] for p in inside} == {"optimizer_step"}
    forwards = report.phases("forward")
    assert len(forwards) == len(plain)  # one per closure call
