"""Specification of the optional dependencies: importing ridgescope (its package, its
integrations package, the pytest plugin) and using a report (text, JSON, HTML, the notebook
display) imports no framework; the frameworks come with the extras
``ridgescope[transformers]``, ``[lightning]`` and ``[tensorboard]`` (pyproject.toml)."""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
FRAMEWORKS = ["transformers", "accelerate", "lightning", "pytorch_lightning", "tensorboard",
              "torch.utils.tensorboard", "tensorboardX", "IPython", "xdist"]

PROGRAM = """
import json, sys
import pytest_ridgescope
plugin_alone = sorted(m for m in ("torch", "ridgescope") if m in sys.modules)
import torch
import ridgescope as rs
import ridgescope.integrations
with rs.track(out=sys.argv[1]) as session:
    model = torch.nn.Linear(8, 8)
    model(torch.randn(4, 8)).sum().backward()
report = session.report()
report.summary(); report.to_json(); report.to_html(); report._repr_html_()
print(json.dumps({"plugin_alone": plugin_alone,
                  "frameworks": sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)}))
"""


def test_importing_and_reporting_imports_no_framework(tmp_path):
    """Given a fresh interpreter, when it imports the pytest plugin, then ridgescope and its
    integrations package, and tracks and renders a report, then no framework was imported, and
    the plugin alone imported neither ridgescope nor torch."""
    out = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path / "run.rstrace"),
                          json.dumps(FRAMEWORKS)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"plugin_alone": [], "frameworks": []}


def test_the_extras_name_the_frameworks():
    """Given pyproject.toml, then each extra names its framework (and `watch` the terminal UI
    library of ridgescope watch's view), and torch stays the only required dependency."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {k: [r.split(">")[0].split("=")[0] for r in v]
              for k, v in project["optional-dependencies"].items()}
    assert extras == {"transformers": ["transformers", "accelerate"], "lightning": ["lightning"],
                      "tensorboard": ["tensorboard"], "watch": ["rich"]}
    assert [d.split(">")[0] for d in project["dependencies"]] == ["torch"]
    assert project["entry-points"]["pytest11"] == {"ridgescope": "pytest_ridgescope"}
