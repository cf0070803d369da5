"""The Python package's imports run one way: no module, and no subpackage, imports (even
lazily, inside a function) something that imports it back.

The graph is read from the source with ``ast`` (every ``import`` and ``from ... import``,
wherever it stands), at two grains: modules, and subpackages (``cli``, ``distributed``,
``_estimate``, ``_reporters``, ``integrations`` each one node; a module of the package's top
level is its own node). Importing ``P.x`` from outside ``P`` also runs ``P/__init__.py``: that
counts as an import of ``P``. ``ridgescope/__init__.py`` is the facade that imports the public
names: it may import anything, and nothing may import it back.

Then each module is imported alone, in a fresh interpreter (forked after ``import torch``, the
slow part), so that a module that only works when another was imported first fails here."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = "ridgescope"
ROOT = Path(__file__).resolve().parents[2] / "python" / PACKAGE
NATIVE = ("ridgescope._C",)  # the compiled module: imports nothing of the package


def _modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its __init__)."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        elif parts[-1] == "__main__":
            continue  # runs as a program, never imported
        out[".".join(parts)] = path
    return out


def _known(modules: dict[str, Path]) -> set[str]:
    return set(modules) | set(NATIVE)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, with the packages that importing them runs."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    known = _known(modules)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[:len(up) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            for a in node.names:  # `from P import x`: the module P.x when there is one, else P
                targets.append(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
        for t in targets:
            if t != PACKAGE and not t.startswith(PACKAGE + "."):
                continue
            while t not in known:  # an attribute path: its module
                t = t.rpartition(".")[0]
            found.add(t)
            # importing P.x from outside P runs P/__init__.py first (the root package excepted:
            # every module is inside it)
            parts = t.split(".")
            for i in range(2, len(parts)):
                outer = ".".join(parts[:i])
                if not (name == outer or name.startswith(outer + ".")):
                    found.add(outer)
    found.discard(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    graph.update({name: set() for name in NATIVE})
    return graph


def _unit(name: str) -> str:
    """A subpackage for its modules; a top-level module for itself."""
    parts = name.split(".")
    return ".".join(parts[:2])


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _explain(graph: dict[str, set[str]], cycle: list[str]) -> str:
    members = set(cycle)
    return "; ".join(f"{a} -> {', '.join(sorted(graph[a] & members))}" for a in cycle)


def test_the_graph_is_read():
    """The walk finds the imports it must (a check that the checker can see an edge)."""
    g = _graph()
    assert g["ridgescope._C"] == set()  # the native module: no source, no imports
    assert "ridgescope._C" in g["ridgescope._format"]  # `from . import _C`
    assert "ridgescope._report" in g[PACKAGE]
    assert "ridgescope._errors" in g["ridgescope._report"]
    assert "ridgescope._reporters._text" in g["ridgescope._report"]  # a lazy import counts
    # importing distributed._section from outside distributed runs distributed/__init__.py too
    assert {"ridgescope.distributed._section", "ridgescope.distributed"} <= g["ridgescope._report"]
    assert "ridgescope.cli" not in g["ridgescope.cli._ranks"]  # a sibling import runs no __init__
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_in_a_circle():
    g = _graph()
    cycles = _cycles(g)
    assert not cycles, "import cycles: " + " | ".join(_explain(g, c) for c in cycles)


def test_no_subpackage_imports_in_a_circle():
    g = _graph()
    units: dict[str, set[str]] = {}
    for a, targets in g.items():
        units.setdefault(_unit(a), set()).update(_unit(b) for b in targets if _unit(b) != _unit(a))
    cycles = _cycles(units)
    assert not cycles, "import cycles between subpackages: " + " | ".join(_explain(units, c) for c in cycles)


def test_nothing_imports_the_facade():
    """``ridgescope/__init__.py`` imports the public names; a module importing it back would
    import the whole package in a circle."""
    g = _graph()
    assert [a for a, targets in g.items() if PACKAGE in targets] == []


_CHILD = r"""
import importlib, os, sys
import torch  # noqa: F401  (once, before the forks: the slow part)


def alone(name):
    # Imports `name` first thing in a forked child: (ok, its message, or the package's modules
    # loaded after it)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(name)
            loaded = " ".join(m for m in sys.modules if m == "ridgescope" or m.startswith("ridgescope."))
            os.write(w, loaded.encode())
            code = 0
        except BaseException as exc:
            os.write(w, f"{name}: {type(exc).__name__}: {exc}".encode()[:2000])
            code = 1
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        message = f.read().decode()
    _, status = os.waitpid(pid, 0)
    return status == 0, message or f"{name}: exit status {status}"


# Importing any module of the package runs the package's __init__ first, so a module that
# __init__ itself imports is imported exactly as it is in the package's own child: only the
# others need a child of their own.
ok, message = alone("ridgescope")
failed = [] if ok else [message]
facade = set(message.split()) if ok else set()
for name in sys.argv[1:]:
    if name not in facade:
        ok, message = alone(name)
        failed += [] if ok else [message]
print("\n".join(failed))
sys.exit(1 if failed else 0)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_each_module_imports_alone():
    """Every module imports on its own, first thing in a fresh interpreter. The integrations'
    modules import their framework (transformers, lightning) and are imported where it is."""
    import importlib.util
    names = [n for n in _modules() if n != PACKAGE]
    frameworks = {"ridgescope.integrations.transformers": "transformers",
                  "ridgescope.integrations.lightning": "lightning"}
    names = [n for n in names if n not in frameworks or importlib.util.find_spec(frameworks[n])]
    out = subprocess.run([sys.executable, "-c", _CHILD, *names], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
