"""Specification of how a session sees module calls (python/ridgescope/_module_calls.py).

While a session tracks, ``torch.nn.Module.__call__`` is ridgescope's wrapper and no global module
hook is registered, so torch takes the fast path of ``Module._call_impl`` for every module call;
the wrapper gives each call's module to the session. The truth comes from torch: its hook
dictionaries, its ``Module.__call__`` before and after, and Dynamo's own view of a module call
while it compiles (a backend that runs inside the compilation).
"""
from __future__ import annotations

import shutil

import pytest
import torch

import ridgescope as rs
from ridgescope import _module_calls

mm = torch.nn.modules.module
GLOBAL_HOOKS = ("_global_forward_pre_hooks", "_global_forward_hooks",
                "_global_backward_pre_hooks", "_global_backward_hooks")


class Boom(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x * 2  # an allocation inside the module that raises
        raise ValueError("boom")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(64, 64)
        self.boom = Boom()

    def forward(self, x: torch.Tensor, explode: bool = False) -> torch.Tensor:
        h = self.a(x)
        if explode:
            self.boom(h)
        return h.relu()


def test_while_tracking_no_global_hook_is_registered_and_the_original_call_comes_back(tmp_path):
    # Given torch's Module.__call__ and its global hook dictionaries before tracking
    original = torch.nn.Module.__call__
    before = {name: dict(getattr(mm, name)) for name in GLOBAL_HOOKS}
    model = Net()
    # When a session tracks a forward
    with rs.track(model=model, out=tmp_path / "t.rstrace"):
        during_call, installed = torch.nn.Module.__call__, _module_calls.installed()
        during = {name: dict(getattr(mm, name)) for name in GLOBAL_HOOKS}
        model(torch.randn(4, 64))
    # Then the wrapper stood in for __call__ while it tracked, the dictionaries were as before
    # (torch's fast path), and the original is back afterwards
    assert installed and during_call is not original
    assert during == before
    assert torch.nn.Module.__call__ is original
    assert during_call.__name__ == original.__name__  # looks like Module.__call__


def test_a_module_that_raises_leaves_no_module_behind(tmp_path):
    # Given a model whose child raises inside forward, and a script that catches it
    model = Net()
    x = torch.randn(32, 64)
    path = tmp_path / "t.rstrace"
    with rs.track(model=model, out=path, keep_steps="all"):
        model(x)
        with pytest.raises(ValueError, match="boom"):
            model(x, explode=True)
        # When the script then allocates outside every module and runs forward again
        outside = torch.empty(1000)
        out = model(x)
    peak = rs.load(path).to_dict()["peak"]
    blocks = {b["address"]: b for b in peak["top_blocks"]}
    # Then the block made outside is in no module, and forward's blocks are in theirs
    assert blocks[outside.untyped_storage().data_ptr()]["module"] == ""
    assert blocks[out.untyped_storage().data_ptr()]["module"] == "Net"
    assert {b["module"] for b in peak["top_blocks"]} <= {"", "Net", "a"}


def test_a_patch_over_the_wrapper_is_left_in_place(tmp_path):
    # Given a script (or a library) that patches Module.__call__ while tracking
    original = torch.nn.Module.__call__
    calls = []

    def patched(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return wrapper(self, *args, **kwargs)

    model = Net()
    try:
        with rs.track(model=model, out=tmp_path / "t.rstrace"):
            wrapper = torch.nn.Module.__call__
            torch.nn.Module.__call__ = patched
            model(torch.randn(4, 64))
        # When the session ends, Then the script's patch stays (and still reaches the original)
        assert torch.nn.Module.__call__ is patched
        model(torch.randn(4, 64))
        assert calls == ["Net", "Linear"] * 2
    finally:
        torch.nn.Module.__call__ = original


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile's default stack needs a C++ compiler to import")
def test_dynamo_compiles_module_calls_through_the_original_call(tmp_path):
    # Given a backend that records Module.__call__ as Dynamo compiles
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    original = torch.nn.Module.__call__
    seen = []

    def backend(gm, example_inputs):
        seen.append(torch.nn.Module.__call__)
        return gm.forward

    model = Net()
    x = torch.randn(4, 64)
    # When a function that calls the model is compiled and run while tracking
    with rs.track(model=model, out=tmp_path / "t.rstrace"):
        step = torch.compile(lambda m, t: m(t).sum(), backend=backend)
        values = [step(model, x) for _ in range(3)]
        after = torch.nn.Module.__call__
    # Then Dynamo saw the original __call__, compiled once, and the wrapper came back after
    assert seen and all(c is original for c in seen)
    assert counters["frames"]["ok"] == 1 and not counters["recompiles"]
    assert after is not original
    torch.testing.assert_close(values[-1], model(x).sum())


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile's default stack needs a C++ compiler to import")
def test_a_compilation_no_callback_announced_traces_the_wrapper_without_a_recompile(tmp_path):
    # Given a session whose compile callbacks torch._dynamo.reset() cleared, so that Dynamo
    # compiles with the wrapper in place of Module.__call__
    import torch._dynamo
    from torch._dynamo.utils import counters
    model = Net()
    x = torch.randn(4, 64)
    with rs.track(model=model, out=tmp_path / "t.rstrace"):
        torch.compile(lambda m, t: m(t).sum(), backend="eager")(model, x)  # Dynamo's side installed
        torch._dynamo.reset()
        counters.clear()
        seen = []

        def backend(gm, example_inputs):
            seen.append(_module_calls.installed())
            return gm.forward

        # When a function that calls the model is compiled and run three times
        step = torch.compile(lambda m, t: m(t).sum() * 2, backend=backend)
        values = [step(model, x) for _ in range(3)]
    # Then Dynamo compiled it with the wrapper in place, once, with no graph break and no
    # recompilation, and it computed what eager does
    assert seen == [True]
    assert counters["frames"]["ok"] == 1 and not counters["recompiles"] and not counters["graph_break"]
    torch.testing.assert_close(values[-1], model(x).sum() * 2)


class Many(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, *xs: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.lin(sum(xs) * scale)


class Deep(torch.nn.Module):
    """Nested module calls with ten positional arguments and a keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Many()
        self.proj = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.inner(*[x] * 10, scale=0.5)).sum()


def _deep_run(path, *, tracked: bool = True):
    torch.manual_seed(0)
    model = Deep()
    x = torch.randn(32, 64)
    losses = []
    ctx = rs.track(model=model, out=path, keep_steps="all") if tracked else None
    if ctx is not None:
        ctx.__enter__()
    try:
        for _ in range(2):
            loss = model(x)
            loss.backward()
            losses.append(loss.detach().clone())
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    return model, losses


def _blocks(path):
    peak = rs.load(path).to_dict()["peak"]
    return (sorted((b["bytes"], b["category"], b["label"], b["module"], b["phase_allocated"], b["site"])
                   for b in peak["top_blocks"]), peak["by_label"])


def test_nested_calls_made_in_c_name_every_block_as_the_python_path_does(tmp_path, monkeypatch):
    # Given a model whose forward nests module calls (positional arguments beyond any fixed
    # count, a keyword argument), trained untracked for the truth
    _, expected = _deep_run(None, tracked=False)
    # When it is trained tracked with the nested calls done in C (the native session's
    # module_call_function), and again with Instrumentation.module_call in Python
    _, in_c = _deep_run(tmp_path / "c.rstrace")
    monkeypatch.delattr(rs._C.Session, "module_call_function")
    _, in_python = _deep_run(tmp_path / "py.rstrace")
    # Then the losses are bitwise those of the untracked run, and both traces name every block
    # of the peak alike (bytes, category, label, module, phase and site)
    assert all(torch.equal(a, b) for a, b in zip(in_c, expected)) and len(in_c) == 2
    assert all(torch.equal(a, b) for a, b in zip(in_python, expected))
    c_blocks, py_blocks = _blocks(tmp_path / "c.rstrace"), _blocks(tmp_path / "py.rstrace")
    assert c_blocks == py_blocks
    assert {"inner", "proj.0", "proj.1"} & {b[3] for b in c_blocks[0]}


def test_an_internal_error_in_a_nested_call_warns_once_and_the_call_returns_its_output(tmp_path):
    # Given a session whose table of module labels holds a malformed entry for a child module
    # (an internal error on the nested call's C path)
    torch.manual_seed(0)
    model = Deep()
    x = torch.randn(32, 64)
    expected = model(x)
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with rs.track(model=model, out=tmp_path / "t.rstrace") as session:
            session._instr._module_labels[id(model.inner)] = "not a label tuple"
            # When the model runs forward
            out = model(x)
            again = model(x)
    # Then the module's output is what it computes untracked, one warning says recording
    # stopped and why, and Module.__call__ is torch's again after the session
    assert torch.equal(out, expected) and torch.equal(again, expected)
    warned = [w for w in caught if "ridgescope stopped recording" in str(w.message)]
    assert len(warned) == 1 and "TypeError" in str(warned[0].message)
    assert session.error.startswith("TypeError")
    assert not _module_calls.installed()


def test_a_session_after_one_that_stopped_inside_a_module_starts_outside_every_module(tmp_path):
    # Given a session that stopped recording inside a module call (an internal error in a nested
    # call: the calls around it never closed theirs)
    torch.manual_seed(0)
    model = Deep()
    x = torch.randn(32, 64)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rs.track(model=model, out=tmp_path / "failed.rstrace") as session:
            session._instr._module_labels[id(model.inner)] = "not a label tuple"
            model(x)
    assert session.error
    # When a new session on the same thread allocates outside every module, then trains a step
    path = tmp_path / "t.rstrace"
    with rs.track(model=model, out=path, keep_steps="all"):
        outside = torch.empty(10_000)
        model(x).backward()
    # Then the block made outside is in no module, and the step's blocks are in the modules
    # that made them (nothing nests in the first session's calls)
    peak = rs.load(path).to_dict()["peak"]
    blocks = {b["address"]: b for b in peak["top_blocks"]}
    assert blocks[outside.untyped_storage().data_ptr()]["module"] == ""
    assert {b["module"] for b in peak["top_blocks"]} <= {"", "Deep", "inner", "inner.lin", "proj", "proj.0", "proj.1"}
