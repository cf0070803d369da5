"""A module's costly run (a training job, a world of ranks), done once per pytest session even
when pytest-xdist's work stealing splits the module's tests between both workers.

A module-scoped fixture runs once per worker that runs one of the module's tests; with
``--dist worksteal`` that is often both, so a 15-second job ran twice (measured: the inference
truth three times, the DDP worlds and the flight runs twice). ``once`` runs ``make(folder)`` in
a folder both workers share (the parent of their base temporary folders, which pytest-xdist
names ``popen-gw0``, ``popen-gw1``), under a file lock: the first worker runs it and keeps its
result (pickled) beside the files; the other waits on the lock and reads the same result and files.

A ``make`` that fails leaves no result: the next caller (the other worker, or the next test of
the same worker) clears the folder and runs it again, so the failure is reported where it
happened and never read back as a result."""
from __future__ import annotations

import fcntl
import pickle
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this session shares: the session's base temporary folder
    (its parent, under pytest-xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if base.name.startswith("popen-gw") else base


def once(tmp_path_factory: pytest.TempPathFactory, name: str,
         make: Callable[[Path], Any]) -> tuple[Path, Any]:
    """Returns ``(folder, result)`` of ``make(folder)``, run once in this session. ``result`` is
    pickled for the callers that did not run it (this session's own data, in its own folder), so
    every caller sees the same value, types and all."""
    root = shared_root(tmp_path_factory)
    folder = root / f"once-{name}"
    done = root / f"once-{name}.pickle"
    with open(root / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return folder, pickle.loads(done.read_bytes())
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        result = make(folder)
        partial = done.with_suffix(".partial")
        partial.write_bytes(pickle.dumps(result))
        partial.replace(done)
        return folder, result
