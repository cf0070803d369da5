"""The version is written once (python/ridgescope/_version.py) and every product reports it:
the package, its installed metadata (pyproject.toml reads the file), the native module (CMake
reads the file at configure time) and the C++ session (the same CMake variable)."""
from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import ridgescope
from ridgescope import _C
from ridgescope._version import __version__

ROOT = Path(__file__).resolve().parents[2]


def test_every_product_reports_the_one_version():
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", __version__)
    assert ridgescope.__version__ == __version__
    assert importlib.metadata.version("ridgescope") == __version__
    assert _C.VERSION == __version__  # a stale build (CMake not re-run) would differ


def test_no_other_source_spells_it():
    """Given the version string, when the build files and every C++ and Python source are
    searched for it, then only _version.py holds it."""
    files = [ROOT / "pyproject.toml", ROOT / "CMakeLists.txt", ROOT / "setup.py"]
    for folder, pattern in (("csrc", "*.[ch]*"), ("include", "*.h"), ("cmake", "*"), ("python", "*.py")):
        files += [p for p in (ROOT / folder).rglob(pattern) if p.is_file()]
    spelled = [str(p.relative_to(ROOT)) for p in files
               if re.search(rf"(?<![0-9.]){re.escape(__version__)}(?![0-9])", p.read_text(errors="replace"))]
    assert spelled == ["python/ridgescope/_version.py"]
