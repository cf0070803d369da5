"""Cross-check of ridgescope against a tool nobody here wrote: torch.profiler's memory profile.

The same small CPU training runs (fresh model and AdamW from the same seed, the same batches)
are run twice: once under ``rs.track`` and once under
``torch.profiler.profile(record_shapes=True, profile_memory=True, with_stack=True)``, never
both at once. The profiler's ``MemoryProfile`` (``torch/profiler/_memory_profiler.py``) gives a
timeline of (time, action, (TensorKey, version), bytes) and a category for every tensor
version; replaying that timeline gives the profiler's bytes per category at any instant.

Compared instants: the end of every optimizer step (``Optimizer.step#...`` record_function end
vs ridgescope's ``optimizer_step`` phase end), the end of every model forward (the root
module's ``nn.Module: ...`` call end vs the ``forward`` phase end), and each tool's own peak.

Parameters, gradients and optimizer state must agree to the byte at the step and forward
boundaries, and so must the total live bytes. The other categories are defined differently by
the two tools; their figures are printed (run with ``-s``) and explained in docs/accuracy.md.

    .venv/bin/python -m pytest -q tests/python/test_profiler_crosscheck.py -s
"""
from __future__ import annotations

import gc
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import models  # noqa: E402

import ridgescope as rs  # noqa: E402

try:  # private API of torch.profiler: read the installed source, it is what we compare with
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, _utils as _prof_utils, profile
    from torch.profiler._memory_profiler import Action, Category, TensorKey
    _HAVE_MEMORY_PROFILE = hasattr(profile, "_memory_profile")
except ImportError:  # pragma: no cover - depends on the torch build
    _HAVE_MEMORY_PROFILE = False

pytestmark = pytest.mark.skipif(not _HAVE_MEMORY_PROFILE,
                                reason="this torch has no torch.profiler memory profile")

STEPS = 3
PERSISTENT = ("parameter", "gradient", "optimizer_state")
# Order of the printed rows: ridgescope's categories, then the profiler's own.
ROWS = ("parameter", "gradient", "optimizer_state", "activation", "input", "temporary",
        "autograd_detail", "unknown", "buffer", "workspace", "comm_buffer")


def _profiler_category_name(category: "Category | None") -> str:
    """The profiler's Category as a ridgescope-style row name (None: the profiler's unknown)."""
    return "unknown" if category is None else category.name.lower()


# ------------------------------------------------------------------------------------ workloads
@dataclass
class Workload:
    name: str
    make_model: Callable[[], torch.nn.Module]
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
    warm_steps: int = 0  # untracked steps before the tracked or profiled window


def _tiny_gpt() -> torch.nn.Module:
    torch.manual_seed(0)
    return models.TinyGPT(vocab=256, d_model=64, n_heads=4, layers=2, seq_len=32)


def _gpt_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return models.gpt_batch(batch=4, seq_len=32, vocab=256, seed=step)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return models.MLP(d_in=128, hidden=256, d_out=10, layers=3)


def _mlp_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(16, 128, generator=g), torch.randint(0, 10, (16,), generator=g)


def _mlp_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


WORKLOADS = {
    "tiny_gpt": Workload("tiny_gpt", _tiny_gpt, _gpt_batch, models.gpt_loss),
    "mlp": Workload("mlp", _mlp, _mlp_batch, _mlp_loss),
    # Parameters, gradients and AdamW state all exist before tracking starts: ridgescope adopts
    # them (register_existing), the profiler sees them as PREEXISTING.
    "tiny_gpt_warm": Workload("tiny_gpt_warm", _tiny_gpt, _gpt_batch, models.gpt_loss,
                              warm_steps=1),
}


def _fresh(w: Workload) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    gc.collect()  # nothing of an earlier run may be freed inside the measured window
    model = w.make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # FP32, default single-tensor
    for step in range(w.warm_steps):
        _one_step(w, model, optimizer, step)
    return model, optimizer


def _one_step(w: Workload, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              step: int) -> None:
    x, y = w.batch(step)
    optimizer.zero_grad(set_to_none=True)
    loss = w.loss(model, x, y)
    loss.backward()
    optimizer.step()


def _train(w: Workload, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    # The ordinary loop, written out so that `loss`, `x` and `y` stay alive across the step
    # boundary exactly as in a user's loop (both tools must see them the same way).
    for step in range(w.warm_steps, w.warm_steps + STEPS):
        x, y = w.batch(step)
        optimizer.zero_grad(set_to_none=True)
        loss = w.loss(model, x, y)
        loss.backward()
        optimizer.step()
    del x, y, loss


# ------------------------------------------------------------------------------------ ridgescope
@dataclass
class Measured:
    """One tool's bytes per category at the compared instants."""
    zero_grad_start: dict[str, int] = field(default_factory=dict)        # first step
    forward_end: list[dict[str, int]] = field(default_factory=list)      # per step
    optimizer_end: list[dict[str, int]] = field(default_factory=list)    # per step
    peak: dict[str, int] = field(default_factory=dict)
    peak_where: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _run_ridgescope(w: Workload, trace: Path) -> Measured:
    model, optimizer = _fresh(w)
    with rs.track(model=model, optimizer=optimizer, out=trace) as session:
        _train(w, model, optimizer)
    data = session.report().to_dict()
    m = Measured()
    m.zero_grad_start = next(p for p in data["steps"][0]["phases"]
                             if p["phase"] == "zero_grad")["start_by_category"]
    for step in data["steps"]:
        phases = {p["phase"]: p for p in step["phases"] if p["depth"] == 0}
        m.forward_end.append(phases["forward"]["end_by_category"])
        m.optimizer_end.append(phases["optimizer_step"]["end_by_category"])
    m.peak = data["peak"]["by_category"]
    m.peak_where = f"step {data['peak']['step']}, {data['peak']['phase']}"
    m.extra = {"consistency": data["consistency"], "warnings": data["warnings"],
               "peak_bytes": data["peak"]["bytes"],
               "peak_inferred": {k: v for k, v in data["peak"]["inferred_by_category"].items()
                                 if v},
               "true_parameter_bytes": sum(p.numel() * p.element_size()
                                           for p in model.parameters()),
               "true_optimizer_state_bytes": sum(
                   v.numel() * v.element_size() for s in optimizer.state.values()
                   for v in s.values() if isinstance(v, torch.Tensor))}
    return m


# ------------------------------------------------------------------------------------ profiler
def _run_profiler(w: Workload) -> Measured:
    model, optimizer = _fresh(w)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
                 with_stack=True) as prof:
        _train(w, model, optimizer)
    memory_profile = prof._memory_profile()
    categories = memory_profile._categories
    cpu = torch.device("cpu")

    # Replay the timeline (sorted by (time, action) by MemoryProfile.timeline) as
    # MemoryProfileTimeline._coalesce_timeline does, but at nanosecond resolution, and keep the
    # state after every distinct timestamp.
    state = {name: 0 for name in ROWS}
    snapshots: list[tuple[int, dict[str, int]]] = []

    def category(key: Any, version: int) -> str:
        if not isinstance(key, TensorKey):  # an allocation the profiler could not tie to a tensor
            return "unknown"
        return _profiler_category_name(categories.get(key, version))

    last_time = None
    for time_ns, action, (key, version), nbytes in memory_profile.timeline:
        if key.device != cpu:
            continue
        if last_time is not None and time_ns != last_time:
            snapshots.append((last_time, dict(state)))
        last_time = time_ns
        if action in (Action.PREEXISTING, Action.CREATE):
            state[category(key, version)] += nbytes
        elif action == Action.INCREMENT_VERSION:
            state[category(key, version)] -= nbytes
            state[category(key, version + 1)] += nbytes
        elif action == Action.DESTROY:
            state[category(key, version)] -= nbytes
        else:  # pragma: no cover
            raise AssertionError(f"unknown profiler action {action}")
    snapshots.append((last_time, dict(state)))

    events = list(_prof_utils.traverse_dfs(prof.profiler.kineto_results.experimental_event_tree()))

    def spans(pred: Callable[[Any], bool]) -> list[tuple[int, int]]:
        return sorted((e.start_time_ns, e.end_time_ns) for e in events if pred(e))

    root = f"nn.Module: {type(model).__name__}_"
    forward = spans(lambda e: e.typed[0] == _EventType.PyCall and e.name.startswith(root))
    opt_step = spans(lambda e: e.typed[0] == _EventType.TorchOp
                     and e.name.startswith("Optimizer.step#"))
    backward = spans(lambda e: e.typed[0] == _EventType.PyCall
                     and e.name.startswith("torch/autograd/__init__.py(")
                     and e.name.endswith("): backward"))
    zero_grad = spans(lambda e: e.typed[0] == _EventType.TorchOp
                      and e.name.startswith("Optimizer.zero_grad#"))
    assert len(forward) == len(opt_step) == len(backward) == len(zero_grad) == STEPS, \
        (len(forward), len(opt_step), len(backward), len(zero_grad))

    def at(time_ns: int) -> dict[str, int]:
        found = None
        for t, snap in snapshots:
            if t > time_ns:
                break
            found = snap
        assert found is not None
        return found

    m = Measured()
    m.zero_grad_start = at(zero_grad[0][0])
    m.forward_end = [at(end) for _, end in forward]
    m.optimizer_end = [at(end) for _, end in opt_step]
    peak_time, m.peak = max(snapshots, key=lambda s: sum(s[1].values()))
    step = sum(1 for _, end in opt_step if end < peak_time)
    where = "idle"
    for name, ranges in (("zero_grad", zero_grad), ("forward", forward), ("backward", backward),
                         ("optimizer_step", opt_step)):
        if any(start <= peak_time <= end for start, end in ranges):
            where = name
    m.peak_where = f"step {step}, {where}"
    m.extra = {"timeline_entries": len(memory_profile.timeline)}
    return m


# ------------------------------------------------------------------------------------ fixtures
Pair = tuple[Measured, Measured]  # (ridgescope, profiler)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Pair]:
    """Runs each workload once per tool (lazily, once per module) and prints its table."""
    cache: dict[str, Pair] = {}

    def get(name: str) -> Pair:
        if name not in cache:
            w = WORKLOADS[name]
            ridge = _run_ridgescope(w, tmp_path_factory.mktemp(name) / "run.rstrace")
            prof = _run_profiler(w)  # separately: the two tools never observe the same run
            cache[name] = (ridge, prof)
            _print_table(name, ridge, prof)
        return cache[name]
    return get


def _print_table(name: str, ridge: Measured, prof: Measured) -> None:
    instants = [("start of first zero_grad", ridge.zero_grad_start, prof.zero_grad_start),
                ("end of last forward", ridge.forward_end[-1], prof.forward_end[-1]),
                ("end of last optimizer step", ridge.optimizer_end[-1], prof.optimizer_end[-1]),
                (f"own peak (rs: {ridge.peak_where}; profiler: {prof.peak_where})",
                 ridge.peak, prof.peak)]
    print(f"\n== {name}: bytes per category, ridgescope | torch.profiler")
    for title, r, p in instants:
        print(f"  {title}")
        for row in ROWS:
            rv, pv = r.get(row, 0), p.get(row, 0)
            if rv or pv:
                mark = "" if rv == pv else "   (differs)"
                print(f"    {row:<16} {rv:>10} | {pv:>10}{mark}")
        print(f"    {'total':<16} {sum(r.values()):>10} | {sum(p.values()):>10}")
    print(f"  ridgescope peak bytes from lifetime rules (inferred): {ridge.extra['peak_inferred']}")
    print(f"  ridgescope consistency: {ridge.extra['consistency']}")


def _persistent(d: dict[str, int]) -> dict[str, int]:
    return {k: d.get(k, 0) for k in PERSISTENT}


# ------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_persistent_state_agrees_at_every_optimizer_step_end(measured, name: str) -> None:
    """Scenario: parameters, gradients and optimizer state after each optimizer step.
    Given the workload trained 3 AdamW steps once under ridgescope and once under
          torch.profiler's memory profile, from the same seed and batches,
    When each tool's bytes per category are read at the end of every optimizer step,
    Then parameter, gradient and optimizer_state bytes are identical in the two tools,
     and so is the total of live bytes.
    """
    ridge, prof = measured(name)
    assert len(ridge.optimizer_end) == len(prof.optimizer_end) == STEPS
    for step, (r, p) in enumerate(zip(ridge.optimizer_end, prof.optimizer_end)):
        assert _persistent(r) == _persistent(p), f"step {step}"
        assert sum(r.values()) == sum(p.values()), f"step {step}: total live bytes"
    # The figures are real state, not two copies of the same mistake.
    last = ridge.optimizer_end[-1]
    assert last["parameter"] == ridge.extra["true_parameter_bytes"]
    assert last["gradient"] == ridge.extra["true_parameter_bytes"]
    assert last["optimizer_state"] == ridge.extra["true_optimizer_state_bytes"]


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_persistent_state_agrees_at_every_forward_end(measured, name: str) -> None:
    """Scenario: the activation high-water mark of each step (end of the model's forward).
    Given the same two runs,
    When the bytes per category are read at the end of every forward of the root module,
    Then parameter, gradient and optimizer_state bytes are identical in the two tools, as is
     the total; the activation/input/unknown split is printed, not asserted (the two tools
     define those categories differently, see docs/accuracy.md).
    """
    ridge, prof = measured(name)
    assert len(ridge.forward_end) == len(prof.forward_end) == STEPS
    for step, (r, p) in enumerate(zip(ridge.forward_end, prof.forward_end)):
        assert _persistent(r) == _persistent(p), f"step {step}"
        assert sum(r.values()) == sum(p.values()), f"step {step}: total live bytes"
        assert r["gradient"] == 0  # zero_grad(set_to_none=True) ran before this forward


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_peaks_agree(measured, name: str) -> None:
    """Scenario: each tool's own peak.
    Given the same two runs,
    When each tool's peak (ridgescope's report peak, the profiler's largest total) is taken,
    Then the two peaks have the same bytes, fall in the same step and phase, and carry the
     same gradient and optimizer_state bytes; ridgescope's parameter bytes at its peak are
     the model's exact parameter bytes (the profiler may count more, see docs/accuracy.md).
    """
    ridge, prof = measured(name)
    assert sum(ridge.peak.values()) == ridge.extra["peak_bytes"]
    assert sum(ridge.peak.values()) == sum(prof.peak.values())
    assert ridge.peak_where == prof.peak_where
    assert ridge.peak["gradient"] == prof.peak["gradient"]
    assert ridge.peak["optimizer_state"] == prof.peak["optimizer_state"]
    assert ridge.peak["parameter"] == ridge.extra["true_parameter_bytes"]
    assert prof.peak["parameter"] >= ridge.peak["parameter"]


def test_state_from_before_the_window(measured) -> None:
    """Scenario: tracking starts on a warm model (gradients and AdamW state already exist).
    Given TinyGPT after one untracked step, then 3 steps under each tool,
    When the bytes are read at the start of the first zero_grad in the window,
    Then parameters and optimizer state agree in the two tools, and ridgescope also counts the
     adopted gradients at their exact size; the profiler's figure is printed (it never sees
     gradients that no op reads before zero_grad frees them, see docs/accuracy.md).
    """
    ridge, prof = measured("tiny_gpt_warm")
    r, p = ridge.zero_grad_start, prof.zero_grad_start
    assert r["parameter"] == p["parameter"] == ridge.extra["true_parameter_bytes"]
    assert r["optimizer_state"] == p["optimizer_state"] == ridge.extra["true_optimizer_state_bytes"]
    assert r["gradient"] == ridge.extra["true_parameter_bytes"]
    print(f"\n  warm start, before the first zero_grad: gradient bytes ridgescope {r['gradient']}"
          f" | profiler {p['gradient']}; total {sum(r.values())} | {sum(p.values())}")


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_ridgescope_ledger_matches_its_allocator_count(measured, name: str) -> None:
    """Scenario: ridgescope's own exactness check in the same runs.
    Given the ridgescope run of the workload,
    When its report's consistency section is read,
    Then the allocator source's live-byte count was sampled at every phase boundary and never
     differed from the ledger replayed from the trace, and the report has no ledger_mismatch.
    """
    ridge, _ = measured(name)
    c = ridge.extra["consistency"]
    assert c["samples"] >= 2 * 4 * STEPS  # begin and end of zero_grad/forward/backward/step
    assert c["mismatches"] == 0, c
    assert not [w for w in ridge.extra["warnings"] if w["kind"] == "ledger_mismatch"]
