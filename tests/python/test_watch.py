"""Specification of ``ridgescope watch`` (python/ridgescope/cli/watch.py, docs/long-runs.md): a
live view of a running job from its growing trace, drawn in a terminal (a pseudo-terminal
here), plain lines elsewhere, whose numbers are the final report's."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import ridgescope as rs

from inprocess_cli import ridgescope

pexpect = pytest.importorskip("pexpect")

SLOW = """
import time
import torch
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(60):
    x = torch.randn(128 if step == 23 else 16, 32)
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    time.sleep(0.03)
"""


def start_run(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    (tmp_path / "slow.py").write_text(SLOW)
    out = tmp_path / "slow.rstrace"
    proc = subprocess.Popen([sys.executable, "-m", "ridgescope", "run", "--keep-steps", "5", "-o", str(out), "slow.py"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return proc, out


def test_watch_draws_a_growing_trace_in_a_terminal_and_ends_with_the_reports_numbers(tmp_path: Path) -> None:
    """Given a job writing its trace, when `ridgescope watch` follows it in a terminal, then it
    draws the live view (step, phase, live bytes by category, the per-step peaks) while the job
    runs, stops by itself when the session ends, and its final numbers (steps, the highest step
    peak and its step) are those of the report of the finished trace."""
    proc, out = start_run(tmp_path)
    child = pexpect.spawn(sys.executable, ["-m", "ridgescope", "watch", "--interval", "0.2", str(out)],
                          cwd=str(tmp_path), dimensions=(50, 160), encoding="utf-8", timeout=240)
    child.expect("per-step peaks")           # the view of a job that has completed steps
    child.expect("parameter")                # live bytes by category
    child.expect(r"slow\.rstrace: ended: (\d+) step\(s\), highest step peak .* \((\d+) bytes\) in step (\d+)")
    steps, peak, step = (int(x) for x in child.match.groups())
    child.expect(pexpect.EOF)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    g = rs.load(out).to_dict()["at_a_glance"]
    complete = sum(1 for row in g["rows"] if row[g["columns"].index("flags")] & 1)
    assert (steps, peak, step) == (complete, g["max_peak_bytes"], g["max_peak_step"]) == (60, g["max_peak_bytes"], 23)


def test_watch_off_a_terminal_prints_a_line_per_step(tmp_path: Path) -> None:
    """Given a finished trace of the same loop (tracked in this process, bounded to 5 steps as
    `ridgescope run --keep-steps 5` bounds it) and no terminal, then `watch --once` prints one
    line per step and the same final line."""
    import torch
    out = tmp_path / "slow.rstrace"
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with rs.track(model=model, optimizer=opt, out=out, keep_steps=5):
        for step in range(60):
            x = torch.randn(128 if step == 23 else 16, 32)
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    done = ridgescope("watch", "--once", str(out))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum(1 for line in lines if re.match(r"slow\.rstrace: step \d+: peak ", line)) == 60
    assert re.search(r"ended: 60 step\(s\), highest step peak .* in step 23", lines[-1])
