"""Specification: the trace writer thread runs at the normal scheduling class, or, when
$RIDGESCOPE_WRITER says ``idle``, at the idle class (recorder.h: it takes only CPU time the
training threads leave)."""
from __future__ import annotations

import os

import pytest
import torch

import ridgescope as rs
from ridgescope import RidgescopeError
from conftest import make_mlp, mlp_batch, mlp_loss, train

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getscheduler") or not os.path.isdir("/proc/self/task"),
                                reason="scheduling classes are read from Linux's /proc/self/task")


def threads() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def policies_of_session_threads(trace_path) -> tuple[list[int], int]:
    """The scheduling policies of the threads a session started, read while it runs, and the
    number of steps its trace holds."""
    model = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = threads()
    with rs.track(model=model, optimizer=opt, out=trace_path) as session:
        train(model, opt, lambda i: mlp_batch(16, i), mlp_loss, steps=3)
        policies = []
        for tid in threads() - before:
            try:
                policies.append(os.sched_getscheduler(tid))
            except OSError:  # ended meanwhile
                pass
    return policies, len(session.report().steps)


def test_by_default_the_writer_runs_at_the_normal_class(trace_path, monkeypatch):
    """Given no $RIDGESCOPE_WRITER, when a session trains 3 steps, then no thread it started is
    at SCHED_IDLE, and the trace holds all 3 steps."""
    monkeypatch.delenv("RIDGESCOPE_WRITER", raising=False)
    policies, steps = policies_of_session_threads(trace_path)
    assert os.SCHED_IDLE not in policies
    assert os.SCHED_OTHER in policies
    assert steps == 3


def test_ridgescope_writer_idle_puts_the_writer_at_the_idle_class(trace_path, monkeypatch):
    """Given RIDGESCOPE_WRITER=idle, then exactly one thread the session started (the writer)
    is at SCHED_IDLE, and the trace still holds all 3 steps."""
    monkeypatch.setenv("RIDGESCOPE_WRITER", "idle")
    policies, steps = policies_of_session_threads(trace_path)
    assert policies.count(os.SCHED_IDLE) == 1
    assert steps == 3


def test_a_bad_ridgescope_writer_is_refused_by_name(trace_path, monkeypatch):
    """Given RIDGESCOPE_WRITER=fast, then starting a session fails with an error naming the
    variable and the values it takes."""
    monkeypatch.setenv("RIDGESCOPE_WRITER", "fast")
    with pytest.raises(RidgescopeError, match=r"RIDGESCOPE_WRITER must be 'idle' or 'normal', got 'fast'"):
        with rs.track(out=trace_path):
            pass
