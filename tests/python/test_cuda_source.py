"""Specification of the CUDA caching-allocator source on a machine WITHOUT a GPU (docs/gpu.md).

What can be checked here: the source is compiled in and linked whenever torch has CUDA, a session
reports plainly why CUDA blocks are not tracked, and a CPU run never starts it. The translation of
trace entries is specified in tests/cpp/core/allocator/test_cuda_trace.cpp; the figures against a real GPU
are checked by benchmarks/gpu_check.sh."""
from __future__ import annotations

import json

import pytest
import torch

import ridgescope as rs
from ridgescope import _C
from ridgescope._errors import RidgescopeError

NO_GPU = not torch.cuda.is_available()


def test_the_cuda_source_is_compiled_in_when_torch_has_cuda():
    # Given torch built with CUDA (2.14.1+cu130 in CI), ridgescope's build found libc10_cuda and
    # the CUDA runtime headers, so the trace tracker is in the module and linked.
    if torch.version.cuda is None:
        pytest.skip("torch without CUDA: the CUDA source is left out by design")
    assert _C._cuda_source_compiled() is True


@pytest.mark.skipif(not NO_GPU, reason="specifies the behaviour without a visible GPU")
def test_without_a_gpu_the_native_session_says_why_cuda_is_not_tracked(tmp_path):
    # Given a native session, when the CUDA source is started on a machine without a GPU,
    path = tmp_path / "run.rstrace"
    native = _C.Session(str(path), 0)
    reason = native.start_cuda()
    native.sample_allocator()  # must not touch CUDA
    native.stop()
    # then it returns the reason, records it as metadata, and records no CUDA event.
    assert reason == "no CUDA device is visible"
    assert _C._cuda_allocator_backend() == ""
    report = rs.load(path).to_dict()
    meta = json.loads(report["metadata"]["cuda_source"])
    assert meta["tracking"] is False
    assert meta["reason"] == reason
    assert meta["compiled"] is _C._cuda_source_compiled()
    cuda_events = [e for e in _C.read_events(str(path)) if e.get("device", "").startswith("cuda")]
    assert cuda_events == []


@pytest.mark.skipif(not NO_GPU, reason="specifies the behaviour without a visible GPU")
def test_asking_for_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    model = torch.nn.Linear(4, 4)
    with pytest.raises(RidgescopeError, match="no CUDA device"):
        with rs.track(model=model, out=tmp_path / "run.rstrace", cuda=True):
            pass
    assert rs.active_session() is None  # nothing half-installed


def test_a_cpu_run_never_starts_the_cuda_source(tmp_path):
    # Given a CPU model and the default cuda=None, when a step is tracked,
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    was_initialized = torch.cuda.is_initialized()
    with rs.track(model=model, optimizer=opt, out=tmp_path / "run.rstrace") as session:
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
    # then CUDA was not initialised by ridgescope and no cuda_source metadata exists.
    assert session.cuda_status is None
    assert torch.cuda.is_initialized() == was_initialized
    report = session.report().to_dict()
    assert "cuda_source" not in report["metadata"]
    assert report["consistency"]["mismatches"] == 0
