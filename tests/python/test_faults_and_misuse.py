"""Specification: internal errors never reach the training loop; misuse and bad input get a
clear error at the call; corrupt traces never crash."""
from __future__ import annotations

import warnings

import pytest
import torch

import ridgescope as rs
from ridgescope import _C
from conftest import make_mlp, mlp_batch, mlp_loss, train


def run_with_fault(inject, trace_path, when_step: int = 1):
    """Four tracked steps of the MLP, ``inject(session)`` called before step ``when_step``."""
    model = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with rs.track(model=model, optimizer=opt, out=trace_path) as session:
            for step in range(4):
                if step == when_step:
                    inject(session)
                losses += train(model, opt, lambda i: mlp_batch(16, step), mlp_loss, steps=1)
    return session, losses, [w for w in caught if "ridgescope" in str(w.message)]


def native_fault(kind: str):
    def inject(session) -> None:
        session.flush()  # what came before the fault is on disk, as after 100 ms
        session._native.inject_fault(kind)
    return inject


def untracked_losses() -> list[float]:
    model = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    expected = []
    for step in range(4):
        expected += train(model, opt, lambda i: mlp_batch(16, step), mlp_loss, steps=1)
    return expected


@pytest.mark.parametrize("kind", ["tag", "write"])
def test_an_internal_error_warns_once_stops_recording_and_training_goes_on(kind, trace_path):
    """Given a fault injected inside the session (a failing tag, a failing trace write),
    then training finishes with the same losses, one warning is issued, the session says why,
    and the trace holds what was recorded before the fault."""
    expected = untracked_losses()
    session, losses, caught = run_with_fault(native_fault(kind), trace_path)
    assert losses == expected
    assert len(caught) == 1
    assert "stopped recording" in str(caught[0].message)
    assert session.error and ("injected" in session.error)
    assert not _C._cpu_allocator_installed()  # the allocator was restored at the fault
    report = rs.load(trace_path).to_dict()
    assert len(report["steps"]) >= 1
    assert report["steps"][0]["complete"]


class _Raises:
    """Stands in for a piece of the session's own work: raises when called or popped."""

    def __call__(self, *args, **kwargs):
        raise RuntimeError("injected in a wrapper")

    pop = __call__


# Where the raise is put, on the session's instrumentation, at step 1: what runs before
# loss.backward() (the loss's tag), after it (the gradients' tags), in the optimizer's step
# pre-hook (its phase table) and in its post-hook (the optimizer state's tags).
_WRAPPER_FAULTS = {"before_backward": "_tag_loss", "after_backward": "tag_gradients",
                   "step_pre_hook": "_step_phases", "step_post_hook": "tag_optimizer_state"}


@pytest.mark.parametrize("where", sorted(_WRAPPER_FAULTS))
def test_an_exception_in_a_phase_wrapper_or_step_hook_warns_once_and_training_goes_on(where, trace_path):
    """Given an exception raised by ridgescope's own Python work around a torch call it wraps
    (before and after loss.backward()) or in the optimizer's step hooks,
    then training finishes with the same losses, one warning is issued, the session names the
    error, and the steps before it are in the trace."""
    expected = untracked_losses()
    session, losses, caught = run_with_fault(
        lambda session: setattr(session._instr, _WRAPPER_FAULTS[where], _Raises()), trace_path)
    assert losses == expected
    assert len(caught) == 1 and "stopped recording" in str(caught[0].message)
    assert session.error == "RuntimeError: injected in a wrapper"
    assert not _C._cpu_allocator_installed()
    assert rs.load(trace_path).to_dict()["steps"][0]["complete"]


def test_nested_sessions_are_refused_at_the_call(tmp_path):
    with rs.track(out=tmp_path / "a.rstrace"):
        with pytest.raises(rs.RidgescopeError, match="already tracking"):
            with rs.track(out=tmp_path / "b.rstrace"):
                pass
    with rs.track(out=tmp_path / "c.rstrace"):  # the first one ended cleanly
        pass


def test_a_model_that_is_not_a_module_is_refused(tmp_path):
    with pytest.raises(TypeError, match="torch.nn.Module"):
        rs.track(model=lambda x: x, out=tmp_path / "a.rstrace")
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        rs.track(optimizer=[1, 2], out=tmp_path / "a.rstrace")


def test_an_unwritable_output_path_is_refused_at_the_call(tmp_path):
    with pytest.raises(rs.RidgescopeError, match="does not exist"):
        with rs.track(out=tmp_path / "missing-dir" / "run.rstrace"):
            pass
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    target = ro / "run.rstrace"
    try:
        if not target.parent.stat().st_mode & 0o200 and __import__("os").geteuid() == 0:
            target = tmp_path / "is-a-dir"
            target.mkdir()
        with pytest.raises(rs.RidgescopeError, match="cannot write"):
            with rs.track(out=target):
                pass
    finally:
        ro.chmod(0o700)
    assert rs.active_session() is None


def test_phase_outside_a_session_is_a_no_op():
    with rs.phase("checkpoint"):
        x = torch.ones(3)
    assert x.sum().item() == 3
    with pytest.raises(TypeError):
        with rs.phase(""):
            pass


def make_trace(path):
    model = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with rs.track(model=model, optimizer=opt, out=path):
        train(model, opt, lambda i: mlp_batch(16, i), mlp_loss, steps=3)
    return path.read_bytes()


def chunk_spans(data: bytes) -> list[tuple[int, int]]:
    """(offset of the chunk header, payload bytes) of every chunk, read from the chunk headers
    (docs/trace_format.md, "Chunks"): a 16-byte file header, then chunks of a 16-byte header
    (magic, payload length, records, CRC) and the payload."""
    import struct
    spans, offset = [], 16
    while offset < len(data):
        magic, length, _records, _crc = struct.unpack_from("<IIII", data, offset)
        assert magic == 0x4B4E4843
        spans.append((offset, length))
        offset += 16 + length
    assert offset == len(data)  # the writer writes whole chunks only
    return spans


def test_a_truncated_trace_gives_its_readable_prefix_with_a_warning(trace_path):
    """Given a trace whose file ends inside a chunk (the process stopped mid-write), then the
    report covers the whole chunks before it and warns with the torn chunk's byte offset.
    The cut is placed inside a chunk found from the headers: where the writer's chunks end
    depends on timing (its 100 ms flush, the time deltas' varint sizes), and a cut that
    happened to fall on a chunk boundary would leave a whole, untruncated trace."""
    data = make_trace(trace_path)
    torn_at, length = next((o, n) for o, n in chunk_spans(data) if o + 16 + n > len(data) * 2 // 3)
    trace_path.write_bytes(data[: torn_at + 16 + length // 2])
    r = rs.load(trace_path).to_dict()
    assert r["trace"]["truncated"]
    assert r["trace"]["truncated_at"] == torn_at
    assert any(w["kind"] == "truncated_trace" and f"byte offset {torn_at} " in w["message"]
               for w in r["warnings"])


def test_a_corrupt_byte_is_reported_with_its_offset(trace_path):
    data = bytearray(make_trace(trace_path))
    data[40] ^= 0xFF
    trace_path.write_bytes(bytes(data))
    r = rs.load(trace_path).to_dict()
    assert r["trace"]["truncated"] and "byte offset" in r["trace"]["problem"]


@pytest.mark.parametrize("content,message", [
    (b"", "not a ridgescope trace"),
    (b"hello world, not a trace", "not a ridgescope trace"),
    (b"\x80\x04\x95" + b"\x00" * 20, "pickle"),
    (b"RIDGESCP\x07\x00\x00\x00\x00\x00\x00\x00", "version 7"),
    (b"RIDGESCP\x01\x00", "truncated inside its file header"),
])
def test_files_that_are_not_traces_get_a_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.rstrace"
    path.write_bytes(content)
    with pytest.raises(rs.TraceFormatError, match=message):
        rs.load(path)


def test_random_garbage_after_a_valid_header_never_crashes(tmp_path):
    import random
    rng = random.Random(1234)
    path = tmp_path / "fuzz.rstrace"
    real = make_trace(tmp_path / "real.rstrace")
    for i in range(200):
        data = bytearray(real)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(16, len(data))] = rng.randrange(256)
        if i % 3 == 0:
            data = data[: rng.randrange(16, len(data))]
        path.write_bytes(bytes(data))
        r = rs.load(path).to_dict()  # a report of the readable prefix, never a crash
        assert r["schema_version"] == 1


KILLED_SCRIPT = r"""
import sys, time, torch
sys.path.insert(0, {examples!r})
import ridgescope as rs
from models import MLP
torch.manual_seed(0)
model = MLP(d_in=128, hidden=256, d_out=10)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with rs.track(model=model, optimizer=opt, out={path!r}):
    step = 0
    while True:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.randn(16, 128)), torch.randint(0, 10, (16,))).backward()
        opt.step()
        step += 1
        if step == 5:
            print("five steps", flush=True)
        time.sleep(0.01)
"""


def test_a_killed_process_leaves_a_readable_trace(trace_path):
    """Given a training process killed with SIGKILL mid-run (no chance to close anything),
    then its trace opens and reports the steps recorded up to the last background flush."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    def complete_steps_on_disk() -> int:
        return sum(s["complete"] for s in rs.load(trace_path).to_dict()["steps"])

    examples = str(Path(__file__).resolve().parents[2] / "examples")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SCRIPT.format(examples=examples, path=str(trace_path))],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "five steps"
        # While it keeps training, the background writer (100 ms flush) puts the five steps on
        # disk without any close. Wait for that rather than for a fixed time, which a loaded
        # machine can outlast; the deadline only bounds a writer that never flushes.
        deadline = time.monotonic() + 120
        while complete_steps_on_disk() < 5:
            assert proc.poll() is None, "the training process ended before it was killed"
            assert time.monotonic() < deadline, "five steps never reached the file of a running process"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    r = rs.load(trace_path).to_dict()
    complete = [s for s in r["steps"] if s["complete"]]
    assert len(complete) >= 5
    for s in complete:
        assert [p["phase"] for p in s["phases"]] == ["zero_grad", "forward", "backward", "optimizer_step"]
    assert r["consistency"]["mismatches"] == 0
