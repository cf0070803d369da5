"""Specification of the saved-tensor hook pair during backward (python/ridgescope/_saved_hooks.py).

torch copies its stack of default saved-tensor hooks around every autograd node it runs. A plain
backward saves nothing, so ridgescope's pair is off the stack while it runs and back when it
returns. What torch saves is tagged exactly as before, and the script's own hooks and
checkpointing are never disturbed. These specifications keep the pair on for every step
(``activations="every_step"``); by default it runs in the first steps only (the last ones here)."""
from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint as ckpt

import ridgescope as rs
import ridgescope._saved_hooks as saved_hooks
from ridgescope._saved_hooks import EVERY_STEP
from conftest import make_mlp, mlp_batch, mlp_loss

top = torch._C._autograd._top_saved_tensors_default_hooks


def is_ridgescope_pair(pair) -> bool:
    return pair is not None and getattr(pair[0], "__name__", "") == "pack_saved"


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Net(torch.nn.Module):
    """Two blocks; the first may be checkpointed (reentrant or not)."""

    def __init__(self, checkpoint: str | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = Block(), Block()
        self.checkpoint = checkpoint

    def forward(self, x):
        if self.checkpoint is None:
            h = self.a(x)
        else:
            h = ckpt.checkpoint(self.a, x, use_reentrant=self.checkpoint == "reentrant")
        return self.b(h).square().mean()


def test_a_plain_backward_runs_without_the_pair_and_every_step_gets_it_back(trace_path):
    """Given a tracked MLP trained 3 steps, when each backward runs, then torch's stack of default
    hooks is empty inside it (seen from a gradient hook), ridgescope's pair is on top again after
    it, and the forwards after a restored pair (steps 1 and 2) tag the same activation bytes."""
    model = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    inside, after = [], []
    with rs.track(model=model, optimizer=opt, out=trace_path, activations=EVERY_STEP) as session:
        for i in range(3):
            x, y = mlp_batch(16, i)
            loss = mlp_loss(model, x, y)
            loss.register_hook(lambda g: inside.append(top(True)))
            opt.zero_grad()
            loss.backward()
            after.append(top(True))
            opt.step()
    assert inside == [None, None, None]
    assert all(is_ridgescope_pair(p) for p in after)
    assert top(True) is None  # nothing left behind
    forwards = [p for s in session.report().to_dict()["steps"] for p in s["phases"] if p["phase"] == "forward"]
    assert len(forwards) == 3
    assert forwards[1]["end_by_category"]["activation"] == forwards[2]["end_by_category"]["activation"] > 0


def test_the_activations_tagged_are_those_of_the_pair_kept_through_backward(tmp_path, monkeypatch):
    """Given the same 3 steps tracked twice, once with the pair kept on the stack through
    backward (the earlier behaviour), then every phase of the report has the same bytes by
    category, and the run's losses are bitwise those of an untracked run."""
    def three_steps(model, opt):
        losses = []
        for i in range(3):
            x, y = mlp_batch(16, i)
            opt.zero_grad()
            loss = mlp_loss(model, x, y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    def run(path):
        model = make_mlp()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with rs.track(model=model, optimizer=opt, out=path, activations=EVERY_STEP) as session:
            losses = three_steps(model, opt)
        r = session.report().to_dict()
        return losses, [(p["phase"], p["end_by_category"], p["peak_by_category"])
                        for s in r["steps"] for p in s["phases"]]

    suspended_losses, suspended = run(tmp_path / "suspended.rstrace")
    monkeypatch.setattr(saved_hooks.SavedTensorHooks, "suspend", lambda self, *args: None)
    kept_losses, kept = run(tmp_path / "kept.rstrace")
    assert suspended == kept
    model = make_mlp()
    plain = three_steps(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    assert suspended_losses == kept_losses == plain


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
@pytest.mark.parametrize("how", ["backward", "grad"])
def test_a_backward_that_builds_a_graph_keeps_the_pair(trace_path, how):
    """Given a gradient penalty (create_graph=True, by Tensor.backward or autograd.grad), when its
    backward runs, then ridgescope's pair stays on top: the graph it builds saves tensors for
    the second backward, and they are tagged."""
    model = make_mlp()
    x, y = mlp_batch(8, 0)
    x.requires_grad_(True)
    inside = []
    with rs.track(model=model, out=trace_path, activations=EVERY_STEP):
        loss = mlp_loss(model, x, y)
        loss.register_hook(lambda g: inside.append(top(True)))
        if how == "backward":
            loss.backward(create_graph=True)
            penalty = x.grad.square().sum()
        else:
            (g,) = torch.autograd.grad(loss, x, create_graph=True)
            penalty = g.square().sum()
        penalty.backward()
    assert len(inside) == 1 and is_ridgescope_pair(inside[0])
    assert top(True) is None


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_checkpointing_recomputes_as_before(tmp_path, mode):
    """Given a block under activation checkpointing, when backward recomputes it, then a
    reentrant recomputation (no hooks on the stack) saves through ridgescope's pair, a
    non-reentrant one through torch's own pair (its count of saved tensors must match), the
    recompute phase is recorded every step, and the losses are bitwise those untracked."""
    def train(tracked):
        model = Net(checkpoint=mode)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        seen, losses = [], []

        def during_recompute(module, args, out):
            if torch._C._current_graph_task_id() != -1:  # inside backward
                seen.append(top(True))
        model.a.fc1.register_forward_hook(during_recompute)
        session = rs.track(model=model, optimizer=opt, out=tmp_path / f"{mode}.rstrace", activations=EVERY_STEP) if tracked else None
        if session:
            session.start()
        for i in range(3):
            torch.manual_seed(i)
            loss = model(torch.randn(8, 16, requires_grad=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        if session:
            session.stop()
        return seen, losses, session

    seen, losses, session = train(tracked=True)
    _, plain, _ = train(tracked=False)
    assert losses == plain
    assert len(seen) == 3
    if mode == "reentrant":
        assert all(is_ridgescope_pair(p) for p in seen)
    else:
        assert all(p is not None and not is_ridgescope_pair(p) for p in seen)
    phases = [p["phase"] for s in session.report().to_dict()["steps"] for p in s["phases"]]
    assert phases.count("recompute") == 3
    assert top(True) is None


def test_hooks_of_the_script_above_the_pair_are_left_alone(trace_path):
    """Given a script that pushes its own saved-tensor hooks after tracking started, when its
    backward runs, then its pair stays on top inside backward (nothing is suspended), and it is
    still on top when the session stops inside its block."""
    model = make_mlp()
    x, y = mlp_batch(8, 0)
    mine = []
    pack, unpack = (lambda t: (mine.append(1), t)[1]), (lambda t: t)
    session = rs.track(model=model, out=trace_path, activations=EVERY_STEP).start()
    inside = []
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = mlp_loss(model, x, y)
        loss.register_hook(lambda g: inside.append(top(True)))
        loss.backward()
        session.stop()
        assert top(True)[0] is pack
    assert inside[0][0] is pack and mine
    # ridgescope's pair was under the script's: it was not popped by a stop made above it.
    assert is_ridgescope_pair(top(True))
    torch._C._autograd._pop_saved_tensors_default_hooks()
    assert top(True) is None


# --------------------------------------------------------------------------- the hook's steps
def _snapshot_allocations(trace, tmp_path, name):
    """(size, category, label, category_inferred, step) of every allocation, in order, from the
    trace's snapshot export."""
    import pickle
    path = tmp_path / f"{name}.pickle"
    rs.load(trace).to_snapshot(path)
    with open(path, "rb") as f:
        snapshot = pickle.load(f)  # noqa: S301 - ridgescope's own export of the run just made
    out = []
    for e in snapshot["device_traces"][0]:
        if e["action"] == "alloc":
            m = e.get("user_metadata") or {}
            out.append((e["size"], e.get("category"), m.get("label"), m.get("category_inferred"), m.get("step")))
    return out


def _glance_rows(trace):
    g = rs.load(trace).to_dict()["at_a_glance"]
    keep = [i for i, c in enumerate(g["columns"]) if not c.endswith("_ns")]
    return [[row[i] for i in keep] for row in g["rows"]]


def _default_and_truth(tmp_path, batches, on_top):
    """The same training from the same seed by default (`on_top`: whether the pair was on top at
    each step's backward) and with the hook on every step."""
    torch.manual_seed(0)
    default = _train(tmp_path / "default.rstrace", True, batches, on_top)
    torch.manual_seed(0)
    return default, _train(tmp_path / "truth.rstrace", EVERY_STEP, batches)


def _train(trace, activations, batches, on_top=None):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with rs.track(model=model, optimizer=opt, out=trace, activations=activations):
        for x in batches:
            opt.zero_grad()
            loss = model(x)
            if on_top is not None:
                on_top.append(is_ridgescope_pair(top(True)))
            loss.backward()
            opt.step()
    return trace


@pytest.mark.parametrize("keep_steps", ["all", 3])
def test_by_default_the_hook_runs_in_the_first_two_steps_and_later_steps_read_what_it_said(tmp_path, keep_steps):
    """Given two blocks trained 6 steps from the same seed, by default and with the hook on every
    step, when the default's third step begins, then the pair is off torch's stack; and every
    allocation of the default run has the category and the label (the module that saved it) the
    every-step run gives it, none of them inferred, and the per-step summaries are the same, in a
    full trace and in a bounded one (which keeps the first two steps)."""
    batches = [torch.randn(64, 16, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    on_top = []
    default, truth = _default_and_truth(tmp_path, batches, on_top)
    assert on_top == [True, True, False, False, False, False]
    if keep_steps != "all":
        bounded = tmp_path / "bounded.rstrace"
        rs._C.compact_trace(str(default), str(bounded), keep_steps)
        kept = rs.load(bounded).to_dict()
        assert kept["at_a_glance"]["windows"][0]["first_step"] == 0
        assert "first_steps" in kept["at_a_glance"]["windows"][0]["reasons"]
        assert kept["peak"]["by_label"] == rs.load(truth).to_dict()["peak"]["by_label"]
        assert _glance_rows(bounded) == _glance_rows(truth)
        return
    ours, theirs = _snapshot_allocations(default, tmp_path, "d"), _snapshot_allocations(truth, tmp_path, "t")
    assert [a[0] for a in ours] == [a[0] for a in theirs]
    later = [(a, b) for a, b in zip(ours, theirs) if a[4] >= 2]
    activations = [(a, b) for a, b in later if b[1] == "activation"]
    assert sum(a[0] for a, _ in activations if a[2].startswith("activation saved in")) > 0
    assert ours == theirs
    assert _glance_rows(default) == _glance_rows(truth)


def test_a_step_with_inputs_of_a_new_shape_runs_the_hook_again_and_is_marked(tmp_path):
    """Given a default run whose fourth step takes a batch of another size, then the pair is on
    the stack for that step only (and the first two), the step is marked, and every allocation
    of the run is as the every-step run's."""
    batches = [torch.randn(32 if i == 3 else 64, 16, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    on_top = []
    default, truth = _default_and_truth(tmp_path, batches, on_top)
    assert on_top == [True, True, False, True, False, False]
    assert rs.load(default).to_dict()["at_a_glance"]["marks"] == [[3, saved_hooks.NEW_SHAPES_MARK]]
    assert _snapshot_allocations(default, tmp_path, "d") == _snapshot_allocations(truth, tmp_path, "t")


def test_activations_takes_true_false_or_every_step():
    with pytest.raises(ValueError, match="activations must be True, False or 'every_step'"):
        rs.track(activations="sometimes")


def test_the_hook_comes_back_for_new_shapes_a_bounded_number_of_times(tmp_path):
    """Given a default run whose batch size changes every step, then the hook comes back for the
    first MAX_NEW_SHAPE_STEPS new shapes after its own steps and no more, each of them marked."""
    n = 2 + saved_hooks.MAX_NEW_SHAPE_STEPS + 3
    batches = [torch.randn(8 + i, 16, generator=torch.Generator().manual_seed(i)) for i in range(n)]
    on_top = []
    torch.manual_seed(0)
    trace = _train(tmp_path / "default.rstrace", True, batches, on_top)
    assert on_top == [True] * (2 + saved_hooks.MAX_NEW_SHAPE_STEPS) + [False] * 3
    marks = rs.load(trace).to_dict()["at_a_glance"]["marks"]
    assert marks == [[s, saved_hooks.NEW_SHAPES_MARK] for s in range(2, 2 + saved_hooks.MAX_NEW_SHAPE_STEPS)]


def test_a_new_shape_inside_the_scripts_own_hooks_leaves_them_on_top(tmp_path):
    """Given a default run whose fourth step takes a new batch size inside torch's save_on_cpu
    (the script's own saved-tensor hooks), then ridgescope's pair is not pushed above them: the
    top pair in that forward is the script's, and the step is not marked."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tops = []
    with rs.track(model=model, optimizer=opt, out=tmp_path / "t.rstrace") as session:
        for i in range(5):
            x = torch.randn(32 if i == 3 else 64, 16)
            opt.zero_grad()
            if i == 3:
                with torch.autograd.graph.save_on_cpu():
                    loss = model(x)
                    tops.append(top(True))
            else:
                loss = model(x)
            loss.backward()
            opt.step()
    assert tops[0] is not None and not is_ridgescope_pair(tops[0])
    assert rs.load(session.path).to_dict()["at_a_glance"]["marks"] == []
