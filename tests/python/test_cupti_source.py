"""Specification of the CUPTI source on a machine WITHOUT a GPU (docs/gpu.md, "Memory outside
PyTorch"). What can be checked here: it is compiled in wherever the nvidia-cuda-cupti wheel torch
depends on is installed, a session says plainly why the layer is not itemised (and records it
for the report), and a CPU run never starts it. The translation of CUPTI's calls is specified in
tests/cpp/core/trace/test_external_alloc.cpp, the device ledger in tests/cpp/core/analysis/test_device_ledger.cpp;
the figures against a real GPU are checked by benchmarks/gpu_check_outside.py."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import ridgescope as rs
from ridgescope import _C

NO_GPU = not torch.cuda.is_available()


def cupti_headers_installed() -> bool:
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(any(Path(root).glob("*/include/cupti.h")) for root in spec.submodule_search_locations)


def test_the_cupti_source_is_compiled_in_where_the_cupti_wheel_is_installed():
    # Given torch with CUDA and the nvidia-cuda-cupti wheel it depends on (cu130 in CI), the build
    # found CUPTI's headers, so the source is in the module (CUPTI itself is loaded at run time).
    if torch.version.cuda is None or not cupti_headers_installed():
        pytest.skip("no CUPTI headers: the source is a stub by design")
    assert _C._cupti_source_compiled() is True


@pytest.mark.skipif(not NO_GPU, reason="specifies the behaviour without a visible GPU")
def test_without_a_driver_cupti_refuses_and_the_reason_is_recorded(tmp_path):
    # Given a native session on a machine without a GPU, when the CUPTI source is started,
    path = tmp_path / "run.rstrace"
    native = _C.Session(str(path), 0)
    reason = native.start_cupti()
    native.phase_begin(native.intern("forward"))
    native.phase_end(native.intern("forward"))
    native.stop()
    # then it says why the layer is not itemised, once, and writes it for the report;
    assert reason.endswith("memory outside PyTorch is not itemised")
    meta = json.loads(rs.load(path).to_dict()["metadata"]["cupti_source"])
    assert meta == {"available": False, "reason": reason}
    # and no external allocation is in the trace.
    assert not [e for e in _C.read_events(str(path)) if e["kind"].startswith("external")]


def test_a_cpu_run_never_starts_the_cupti_source(tmp_path):
    with rs.track(model=torch.nn.Linear(4, 4), out=tmp_path / "run.rstrace") as session:
        with rs.phase("p"):
            torch.ones(4)
    assert session.cupti_status is None
    d = session.report().to_dict()
    assert "cupti_source" not in d["metadata"]
    assert d["device_ledger"] is None  # the report is of the CPU
