"""The saved-tensor hook pair that tags activations, and its absence during backward.

torch keeps the default saved-tensor hooks in a per-thread stack, and that stack is part of the
thread-local state the autograd engine copies around every node it runs in backward: three copies
per node, each taking the GIL to count references to the hook pair (at::ThreadLocalState; on
TinyGPT, 2 torch threads, 0.18 ms of a 10.5 ms backward: docs/performance.md). A plain backward
saves nothing for a later backward, so the pair is taken off the stack while it runs and put
back when it returns (``suspend``/``restore``). A backward that builds a graph
(``create_graph=True``: double backward, gradient penalties) keeps it, and a module run inside
backward with no hooks on the stack (a reentrant checkpoint's recomputation, the ``recompute``
phase) gets it back for that call (``push_for_recompute``/``pop_after_recompute``), so every
tensor saved for a backward is tagged as before. A non-reentrant checkpoint recomputes under
torch's own pair, which is on top then: ours was never called there. Saved tensors keep their
own unpack hook: taking the pair off the stack never changes how they are unpacked.

Only the top of the stack is ever touched: when the script pushed hooks of its own above ours
(torch's checkpointing, offloading to the CPU), nothing is suspended.

How many steps the pair runs in (``hook_steps``): by default the first ``HOOK_STEPS`` steps of a
session only. Each later step repeats their allocations, and the analysis labels an activation
that lifetimes find with the saver the hook named for the same allocation of those steps
(csrc/core/flight/block_lifetimes.h; docs/categories.md, "Savers learned from the hook's first
steps"): the same categories and labels for a fraction of the hook's cost, which torch pays per
saved tensor. When the model's forward gets inputs of a shape or dtype not seen before (a
last partial batch, a new sequence length), the allocations of that step are new: the hook comes
back for that step and marks it (NEW_SHAPES_MARK), at most MAX_NEW_SHAPE_STEPS times.
``activations="every_step"`` keeps it on for the whole session.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch

_autograd = torch._C._autograd
# Which hook pair is on top (torch 2.6+); without it nothing is ever suspended.
_top = getattr(_autograd, "_top_saved_tensors_default_hooks", None)

# The steps of a session the saved-tensor hook runs in by default; a bounded trace keeps their
# events (FlightOptions::keep_first_steps) so that its analysis learns their savers.
HOOK_STEPS = 2
EVERY_STEP = "every_step"
# The mark a step gets when the model's inputs take a shape the hook's steps did not see and the
# hook comes back for it (rs.mark's record: a bounded trace keeps the step and its neighbours).
NEW_SHAPES_MARK = "saved-tensor hook: new input shapes"
# How many times the hook comes back for new shapes in a session: a run whose shapes keep changing
# (unpacked sequences of every length) would otherwise run it, and mark, nearly every step.
# Past it, activations of unseen shapes keep the lifetime rule's label.
MAX_NEW_SHAPE_STEPS = 8


def hook_steps(activations: bool | str) -> int | None:
    """How many steps the hook runs in for ``rs.track(activations=...)``: ``True`` (the default)
    the first HOOK_STEPS, ``"every_step"`` all of them (None), ``False`` none (0). ValueError
    for anything else."""
    if activations is True:
        return HOOK_STEPS
    if activations is False:
        return 0
    if activations == EVERY_STEP:
        return None
    raise ValueError(f"activations must be True, False or {EVERY_STEP!r}, got {activations!r}")


class SavedTensorHooks:
    """Pushes ``pack``/``unpack`` on the current thread's stack of default hooks (``install``)
    and pops them (``remove``); in between, ``suspend``/``restore`` around a backward."""

    def __init__(self, pack: Callable[[Any], Any], unpack: Callable[[Any], Any]) -> None:
        self._pack = pack
        self._unpack = unpack
        self._local = threading.local()

    def install(self) -> None:
        _autograd._push_saved_tensors_default_hooks(self._pack, self._unpack)

    def remove(self) -> None:
        """Pops the pair; not when it is suspended on this thread or another pair is on top
        (the script's own hooks are never popped)."""
        if getattr(self._local, "suspended", False):
            self._local.suspended = False
            return
        if _top is None or self._on_top():
            _autograd._pop_saved_tensors_default_hooks()

    def _on_top(self) -> bool:
        if _top is None:
            return False
        top = _top(True)
        return top is not None and top[0] is self._pack and top[1] is self._unpack

    def suspend(self, args: tuple, kwargs: dict, create_graph_at: int) -> None:
        """Before a backward called with ``args``/``kwargs`` (``create_graph`` its parameter at
        index ``create_graph_at``): takes the pair off this thread's stack when it is on top and
        the backward builds no graph (``restore`` puts it back)."""
        if not builds_graph(args, kwargs, create_graph_at) and self._on_top():
            _autograd._pop_saved_tensors_default_hooks()
            self._local.suspended = True

    def restore(self) -> None:
        if getattr(self._local, "suspended", False):
            self._local.suspended = False
            _autograd._push_saved_tensors_default_hooks(self._pack, self._unpack)

    def push_for_recompute(self) -> None:
        """A module runs inside backward: its saved tensors are tagged as in forward. Only where
        no hooks are on the stack: a non-reentrant checkpoint's recomputation runs under torch's
        own hook pair, which must keep seeing every tensor it saves."""
        pushed = False
        if _top is not None and _top(True) is None:
            _autograd._push_saved_tensors_default_hooks(self._pack, self._unpack)
            pushed = True
        stack = getattr(self._local, "recompute", None)
        if stack is None:
            stack = self._local.recompute = []
        stack.append(pushed)

    def pop_after_recompute(self) -> None:
        stack = getattr(self._local, "recompute", None)
        if stack and stack.pop() and self._on_top():
            _autograd._pop_saved_tensors_default_hooks()


def stack_is_empty() -> bool:
    """Whether this thread has no default saved-tensor hooks on torch's stack now (False where
    torch cannot say): the only time the pair may be pushed mid-session without hiding the
    script's own (offloading, checkpointing)."""
    return _top is not None and _top(True) is None


def builds_graph(args: tuple, kwargs: dict, position: int) -> bool:
    """Whether a call of ``torch.autograd.backward`` (``create_graph`` is its 4th parameter) or
    ``torch.autograd.grad`` (its 5th) asks for a graph of the backward."""
    if "create_graph" in kwargs:
        return bool(kwargs["create_graph"])
    return len(args) > position and bool(args[position])
