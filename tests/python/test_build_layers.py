"""Specification of the layer rule of the C++ sources (cmake/RidgescopeLayers.cmake,
../shared/design.md §1) and of the one-build-tree promise (scripts/test.sh).

* Each core folder is a layer (util <- trace <- {allocator, analysis} <- snapshot; pickle <-
  snapshot); csrc/torch sees the core's public headers and util's named internal interface.
* A wrong-way include fails the configure (and every build) with a message naming the file, the
  header and the rule; a wrong-way include of a private header also fails to compile, because
  the layer's compile command has no include directory for it.
* In one build tree every core and torch-layer source is compiled once, and that tree holds the
  Python module, libridgescope and the core tests.
"""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "py"


def check_layers(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["cmake", f"-DRIDGESCOPE_ROOT={tree}", "-P", str(tree / "cmake" / "RidgescopeLayers.cmake")],
        capture_output=True, text=True)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the sources the rule reads, to break on purpose."""
    for part in ("csrc", "include", "cmake"):
        shutil.copytree(ROOT / part, tmp_path / part)
    return tmp_path


def inject(tree: Path, file: str, include: str) -> None:
    path = tree / file
    path.write_text(f"#include {include}\n" + path.read_text())


def test_the_sources_as_committed_keep_the_rule():
    result = check_layers(ROOT)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("file, include, message", [
    ("csrc/core/trace/recorder.cpp", '"ridgescope/snapshot.h"',
     "csrc/core/trace/recorder.cpp (layer trace) includes <ridgescope/snapshot.h> (layer snapshot), which trace may not see"),
    ("csrc/core/trace/recorder.cpp", '"snapshot_frames.h"',
     'csrc/core/trace/recorder.cpp (layer trace) includes "snapshot_frames.h", a private header of snapshot, which trace may not see'),
    ("csrc/core/analysis/ledger.cpp", '"tracking_session.h"',
     'csrc/core/analysis/ledger.cpp (layer analysis) includes "tracking_session.h", a private header of torch, which analysis may not see'),
    ("csrc/core/util/json_writer.cpp", "<torch/torch.h>",
     "csrc/core/util/json_writer.cpp (layer util) includes <torch/torch.h>: the core includes neither torch, CUDA nor Python"),
    ("csrc/core/pickle/pickle_reader.cpp", "<Python.h>",
     "csrc/core/pickle/pickle_reader.cpp (layer pickle) includes <Python.h>: the core includes neither torch, CUDA nor Python"),
    ("csrc/torch/site_capture.cpp", '"record_codec.h"',
     'csrc/torch/site_capture.cpp (layer torch) includes "record_codec.h", a private header of trace, which torch may not see'),
    ("csrc/torch/site_capture.cpp", '"../core/util/json_writer.h"',
     'csrc/torch/site_capture.cpp includes "../core/util/json_writer.h" by a relative path'),
    ("include/ridgescope/event.h", '"ridgescope/report.h"',
     "include/ridgescope/event.h (layer trace) includes <ridgescope/report.h> (layer analysis), which trace may not see"),
])
def test_a_wrong_way_include_fails_the_check_and_names_the_rule(tree, file, include, message):
    # given the sources with one include that points up the layers
    inject(tree, file, include)
    # when the rule is checked (as the configure and every build do)
    result = check_layers(tree)
    # then it fails, and says which file, which header and which layer
    assert result.returncode != 0
    assert message in " ".join(result.stderr.split())


def test_a_header_of_no_layer_is_refused(tree):
    (tree / "include" / "ridgescope" / "orphan.h").write_text("#pragma once\n")
    result = check_layers(tree)
    assert result.returncode != 0
    assert "include/ridgescope/orphan.h: not assigned to a layer" in result.stderr


def test_a_wrong_way_include_fails_the_configure(tree):
    # the same check runs when CMake configures the project: nothing is compiled
    for part in ("CMakeLists.txt",):
        shutil.copy(ROOT / part, tree / part)
    shutil.copytree(ROOT / "tests" / "cpp", tree / "tests" / "cpp")
    (tree / "python" / "ridgescope").mkdir(parents=True)
    shutil.copy(ROOT / "python" / "ridgescope" / "_version.py", tree / "python" / "ridgescope")
    inject(tree, "csrc/core/trace/recorder.cpp", '"ridgescope/snapshot.h"')
    result = subprocess.run(["cmake", "-S", str(tree), "-B", str(tree / "build"), "-DRIDGESCOPE_BUILD_TORCH=OFF"],
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "includes that break the layer rule" in result.stderr


def compile_commands() -> list[dict]:
    path = BUILD / "compile_commands.json"
    if not path.is_file():
        pytest.skip(f"{path} is absent: bash scripts/test.sh builds it")
    return json.loads(path.read_text())


def command_of(source: Path) -> dict:
    for entry in compile_commands():
        if Path(entry["file"]).resolve() == source.resolve():
            return entry
    raise AssertionError(f"{source} is not compiled in {BUILD}")


@pytest.mark.parametrize("include, compiles", [('"byte_codec.h"', True), ('"snapshot_frames.h"', False),
                                               ('"peak_sites.h"', False), ('"cpu_allocator_source.h"', False)])
def test_the_compiler_sees_only_the_private_headers_below_a_layer(tmp_path, include, compiles):
    # given the compile command the build uses for a trace-layer source
    entry = command_of(ROOT / "csrc/core/trace/recorder.cpp")
    probe = tmp_path / "probe.cpp"
    probe.write_text(f"#include {include}\nint ridgescope_probe;\n")
    args = shlex.split(entry["command"])
    # the compiler (through its launcher), the flags and include directories; the probe instead of the source
    out = args.index("-o")
    del args[out:out + 2]
    source = args.index("-c")
    args[source + 1] = str(probe)
    args = [a for a in args if a not in ("-MD",)]
    args = [a for i, a in enumerate(args) if not (a in ("-MT", "-MF") or (i and args[i - 1] in ("-MT", "-MF")))]
    result = subprocess.run([*args, "-o", str(tmp_path / "probe.o")], cwd=entry["directory"],
                            capture_output=True, text=True)
    # then a header of its own layer or below compiles, one of a layer above is not found
    assert (result.returncode == 0) == compiles, result.stderr
    if not compiles:
        assert "No such file or directory" in result.stderr


def test_one_tree_compiles_each_core_and_torch_source_once_for_every_product():
    entries = compile_commands()
    sources = sorted([*ROOT.glob("csrc/core/*/*.cpp"), *ROOT.glob("csrc/torch/*.cpp")])
    assert sources
    counts = {s: sum(Path(e["file"]).resolve() == s.resolve() for e in entries) for s in sources}
    assert {s.relative_to(ROOT).as_posix(): n for s, n in counts.items() if n != 1} == {}
    # and that tree holds the module, the C++ package and the core tests
    ninja = (BUILD / "build.ninja").read_text()
    for product in ("csrc/_C.cpython-", "csrc/cpp_package/libridgescope.so", "tests/cpp/ridgescope_core_tests"):
        assert f"build {product}" in ninja, product
