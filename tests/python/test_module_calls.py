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
