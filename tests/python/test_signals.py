"""Specification of what a tracked process does when told to stop (python/ridgescope/_signals.py,
docs/long-runs.md): SIGTERM closes the trace and the process ends as it would have; a script's
own handler still runs and decides the exit code; SIGUSR1 flushes and the run goes on; SIGKILL
leaves the trace readable up to its last flushed chunk."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ridgescope as rs
from ridgescope import _C

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="POSIX signals")

# Trains forever, printing each completed step; `ready` after 30 steps.
LOOP = """
import signal, sys, time
import torch
{handler}
model = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
while True:
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    step += 1
    if step == 30:
        print("ready", flush=True)
    time.sleep(0.002)
"""
OWN_HANDLER = """
def on_term(signum, frame):
    print("the script's handler ran", flush=True)
    sys.exit(3)
signal.signal(signal.SIGTERM, on_term)
"""


def start(tmp_path: Path, handler: str = "") -> tuple[subprocess.Popen, Path]:
    (tmp_path / "loop.py").write_text(LOOP.format(handler=handler))
    out = tmp_path / "loop.rstrace"
    proc = subprocess.Popen([sys.executable, "-m", "ridgescope", "run", "--keep-steps", "5", "-o", str(out), "loop.py"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", proc.stderr.read() if proc.poll() is not None else line
    return proc, out


def summaries(path: Path) -> list[dict]:
    return [s for s in _C.read_summaries(str(path)) if s["complete"]]


def test_sigusr1_flushes_and_the_run_goes_on_then_sigterm_closes_the_trace_and_the_process_dies_of_it(
        tmp_path: Path) -> None:
    """Given a tracked run with no SIGTERM handler of its own: when it gets SIGUSR1, then the
    trace on disk holds every step up to then at once (not only after the next 100 ms flush)
    and the job keeps running; when the scheduler then sends SIGTERM, the process ends killed by
    SIGTERM as it would untracked, and its trace is whole and closed (the session's end record
    is there) with a summary of every step it completed."""
    proc, out = start(tmp_path)
    proc.send_signal(signal.SIGUSR1)
    time.sleep(0.5)
    assert proc.poll() is None  # still training
    assert len(summaries(out)) >= 30
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGTERM
    report = rs.load(out).to_dict()
    assert not report["trace"]["truncated"] and "recorder" in report  # the session's end record
    assert len(summaries(out)) >= 30
    assert report["at_a_glance"]["keep_steps"] == 5 and report["steps"]


def test_the_scripts_own_handler_runs_and_decides_the_exit_code(tmp_path: Path) -> None:
    """Given a script that installed its own SIGTERM handler (sys.exit(3)), then that handler
    runs, the exit code is the script's, and the trace is closed."""
    proc, out = start(tmp_path, OWN_HANDLER)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=60)
    assert "the script's handler ran" in stdout
    assert proc.returncode == 3
    report = rs.load(out).to_dict()
    assert not report["trace"]["truncated"] and "recorder" in report


def test_sigkill_leaves_a_readable_trace_up_to_its_last_flushed_chunk(tmp_path: Path) -> None:
    """Given a running job killed with SIGKILL (nothing can run), then its trace reads up to
    the last chunk the recorder flushed: every step summarised before that, the last steps'
    events, no end record."""
    proc, out = start(tmp_path)
    time.sleep(0.3)  # the writer flushes every 100 ms
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    report = rs.load(out).to_dict()
    assert "recorder" not in report  # never closed
    done = summaries(out)
    assert len(done) >= 30 and [s["step"] for s in done] == list(range(len(done)))
    assert report["steps"] and report["steps"][-1]["step"] >= 29
