"""The library roots (python/ridgescope/_code_roots.py): which directories hold library code,
Inductor's cache among them, in a process where Inductor was never imported."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _fresh(code: str) -> subprocess.CompletedProcess:
    """Runs ``code`` in a new interpreter without TORCHINDUCTOR_CACHE_DIR in its environment
    (torch sets it when Inductor is imported: making an optimizer does)."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["PYTHONPATH"] = str(ROOT / "python")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_tracking_a_model_starts_before_any_optimizer_exists():
    # Given a fresh interpreter with torch and ridgescope alone (Inductor not imported, so
    # TORCHINDUCTOR_CACHE_DIR unset), when a model is tracked and run,
    run = _fresh("import torch, ridgescope as rs\n"
                 "m = torch.nn.Linear(4, 4)\n"
                 "with rs.track(model=m) as s:\n"
                 "    m(torch.ones(2, 4)).sum().backward()\n"
                 "print(s.report().to_dict()['model']['class'])\n")
    # then tracking starts and the report names the model.
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "Linear"


def test_inductors_cache_is_library_code_where_torch_itself_puts_it():
    # Given the library roots computed in an interpreter that never imported Inductor, and then,
    # in the same interpreter, where Inductor's own cache_dir() puts compiled code,
    run = _fresh("import json, os, sys, torch\n"
                 "from ridgescope._code_roots import _code_roots\n"
                 "print(json.dumps(_code_roots()[0]))\n"
                 "print('torch._inductor' in sys.modules, os.environ.get('TORCHINDUCTOR_CACHE_DIR'))\n"
                 "from torch._inductor.runtime.cache_dir_utils import cache_dir\n"
                 "print(cache_dir())\n")
    assert run.returncode == 0, run.stderr
    roots, before, torch_says = run.stdout.splitlines()[-3:]
    library = json.loads(roots)
    # then Inductor was not imported for it (nor its cache folder set), and its cache directory
    # is among the roots.
    assert before == "False None"
    cache = torch_says.rstrip(os.sep) + os.sep
    assert cache in library or os.path.realpath(cache).rstrip(os.sep) + os.sep in library
