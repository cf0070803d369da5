"""Specification of allocation stacks read from torch memory snapshots (csrc/core/
snapshot_stacks.cpp; docs/snapshot.md, "By allocation stack"): each entry's frames become the
trace's frames and stacks, so a snapshot's report has the allocation sites at the peak, the
peak by stack (`ridgescope report --group-by stack`) and the flame graph of a live trace.

The truth is the snapshot itself: the frames the builder (or PyTorch, for the corpus) wrote for
each allocation, and the bytes of the blocks live at the peak."""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import ridgescope as rs
from snapshot_builder import FORWARD, USER, SnapshotBuilder
from inprocess_cli import ridgescope

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "snapshots"
TRAINING = ["JasperSolt__EoR_NN__snapshot.pickle",
            "Wedsonlin__assignment2-systems__results__medium_1024_training_memory_snapshot.pickle",
            "HugePandaCoder__octree-nca-groupeq__my_snapshot__e67173f.pickle"]

# What torch records for an allocation made by autograd's engine thread: C++ frames only.
MM_BACKWARD = (("CUDACachingAllocator.cpp", "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)"),
               ("VariableType_0.cpp", "at::Tensor torch::autograd::VariableType::(anonymous namespace)::mm(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&)"),
               ("??", "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
               ("??", "torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
               ("??", "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"))
LIBRARY_ONLY = (("torch/nn/functional.py", "linear"), ("torch/nn/modules/linear.py", "forward"))


def training_snapshot(tmp_path: Path) -> Path:
    """A weight made by the user's code, a forward that saves 40,960 B at model.py (the
    module's frame, line 13 of FORWARD), a temporary made by torch's code only, and a backward
    whose gradient (4,096 B) autograd's engine makes with C++ frames."""
    b = SnapshotBuilder()
    b.alloc(8192, USER)  # the weight: train.py:10 in main
    b.begin("forward")
    act = b.alloc(40960, FORWARD)
    lib = b.alloc(2048, LIBRARY_ONLY)
    b.end("forward")
    b.begin("backward")
    b.alloc(4096, MM_BACKWARD)
    b.free(lib, LIBRARY_ONLY)
    b.free(act, MM_BACKWARD)
    b.end("backward")
    return b.write(tmp_path / "snapshot.pickle")


def site_rows(r: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in r["peak"]["by_site"]:
        out[s["site"]] = out.get(s["site"], 0) + s["bytes"]
    return out


def test_a_snapshots_frames_give_each_block_at_the_peak_its_site(tmp_path):
    """Given a training snapshot whose entries carry frames, when it is loaded, then the peak's
    sites are the innermost frames of the user's code (file:line as recorded), the autograd
    node for what the engine made, and no site for a block made by torch's code alone; every
    site's bytes are the bytes of the blocks allocated there."""
    r = rs.load(training_snapshot(tmp_path)).to_dict()
    assert r["peak"]["bytes"] == 8192 + 40960 + 2048 + 4096  # all four live at backward's gradient
    assert site_rows(r) == {"train.py:10 in main": 8192, "model.py:13 in forward": 40960,
                            "MmBackward0": 4096, "(no site recorded)": 2048}
    frames = {(f["kind"], f["function"]) for f in r["frames"]}
    assert ("autograd", "MmBackward0") in frames  # torch's C++ frame of the node's apply
    assert ("native", "torch::autograd::VariableType::(anonymous)::mm") in frames  # C++ names shortened
    assert ("native", "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc") in frames


def test_the_peak_by_stack_covers_the_peak_and_keeps_the_whole_recorded_stack(tmp_path):
    """Then the stacks at the peak sum to the peak's bytes; the forward's stack holds every
    recorded frame innermost first (torch's frames included) with the user's module frame as
    its site."""
    r = rs.load(training_snapshot(tmp_path)).to_dict()
    stacks = r["peak"]["stacks"]
    assert sum(s["bytes"] for s in stacks) == r["peak"]["bytes"]
    assert sum(s["blocks"] for s in stacks) == 4
    fwd = next(s for s in stacks if s["bytes"] == 40960)
    files = [r["frames"][i]["file"].rsplit("/", 1)[-1] for i in fwd["frames"]]
    assert files == [f.rsplit("/", 1)[-1] for f, _ in FORWARD]
    assert fwd["site"] == 3 and fwd["by_category"]["activation"] == 40960
    lib = next(s for s in stacks if s["bytes"] == 2048)
    assert lib["site"] is None and len(lib["frames"]) == len(LIBRARY_ONLY)


def test_report_group_by_stack_lists_the_stacks_largest_first_with_categories(tmp_path):
    """When `ridgescope report SNAPSHOT --group-by stack` runs, then it prints the stacks largest
    first, each with its bytes, blocks, categories and site; `--group-by site` prints the sites;
    with --format json the option is refused with a message naming it."""
    path = training_snapshot(tmp_path)

    def cli(*args):
        return ridgescope("report", str(path), *args)
    out = cli("--group-by", "stack")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "Live bytes at the peak by allocation stack (4 stacks, largest first):" in text
    listed = [line for line in text.splitlines() if " in 1 block: " in line]
    assert [line.split(".", 1)[1].split(" in ")[0].strip() for line in listed] == \
        ["40.0 KiB", "8.00 KiB", "4.00 KiB", "2.00 KiB"]
    assert "at model.py:13 in forward  <- site" in text
    assert "at MmBackward0  <- site" in text
    out = cli("--group-by", "site")
    assert out.returncode == 0, out.stderr
    assert "Allocation sites at the peak" in out.stdout and "model.py:13 in forward" in out.stdout
    out = cli("--group-by", "stack", "--format", "json")
    assert out.returncode != 0 and "--group-by stack goes with --format text" in out.stderr


def test_a_ridgescope_export_read_back_keeps_its_sites(tmp_path):
    """Given a CPU run tracked with sites and exported as a snapshot, when the export is read
    back, then the sites at the peak and their bytes are the trace's own."""
    import torch

    trace = tmp_path / "run.rstrace"
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with rs.track(model=model, optimizer=opt, out=trace):
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(16, 64)).sum().backward()
            opt.step()
    original = rs.load(trace)
    original.to_snapshot(tmp_path / "export.pickle")
    back = rs.load(tmp_path / "export.pickle").to_dict()
    assert back["peak"]["bytes"] == original.to_dict()["peak"]["bytes"]
    assert site_rows(back) == site_rows(original.to_dict())


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"the real-GPU snapshots are not here ({CORPUS} is "
                                                "absent; they are third-party data kept outside the "
                                                "repository)")
@pytest.mark.parametrize("name", TRAINING)
def test_real_training_snapshots_get_stacks_and_sites_from_their_own_frames(name):
    """Given a training snapshot PyTorch wrote on a GPU, then the stacks at the peak sum to its
    bytes, and every Python site named is a (file, line, function) the snapshot's own frames
    hold, in the user's code: not torch's, not the standard library's, not einops' (an op
    wrapper; other third-party packages are the user's code, as in a live trace: docs/sites.md)."""
    with open(CORPUS / name, "rb") as f:
        raw = pickle.load(f)  # the corpus README: builtin types only
    recorded = set()
    for trace in raw.get("device_traces", []):
        for e in trace:
            for fr in e.get("frames", []):
                recorded.add((fr["filename"], fr["line"], fr["name"]))
    r = rs.load(CORPUS / name).to_dict()
    p = r["peak"]
    assert sum(s["bytes"] for s in p["stacks"]) == p["bytes"]
    python_sites = [r["frames"][s["frame"]] for s in p["by_site"]
                    if s["frame"] is not None and r["frames"][s["frame"]]["kind"] == "python"]
    assert python_sites
    for f in python_sites:
        assert (f["file"], f["line"], f["function"]) in recorded
        assert "/torch/" not in f["file"] and "/einops/" not in f["file"] and not f["library"]
        stdlib = f["file"].split("/lib/python3.")[1:]
        assert not stdlib or "site-packages/" in stdlib[-1], f


def test_diff_compares_the_peak_stack_by_stack(tmp_path):
    """Given two snapshots of the same step where the second also keeps a 12,288 B block made at
    model.py's forward frame under a new caller, when they are diffed, then that stack is the
    largest change (+12,288 B, only in the second) and every stack both peaks share has the same
    bytes; the text lists the changed stack with its site."""
    def snapshot(extra: bool, name: str) -> Path:
        b = SnapshotBuilder()
        b.alloc(8192, USER)
        b.begin("forward")
        act = b.alloc(40960, FORWARD)
        if extra:
            b.alloc(12288, (("model.py", "forward"), ("extra.py", "keep")))
        b.end("forward")
        b.begin("backward")
        b.alloc(4096, MM_BACKWARD)
        b.free(act, MM_BACKWARD)
        b.end("backward")
        return b.write(tmp_path / name)
    a, b = snapshot(False, "a.pickle"), snapshot(True, "b.pickle")
    out = ridgescope("diff", str(a), str(b), "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = __import__("json").loads(out.stdout)["stacks"]
    assert rows[0]["a"] == 0 and rows[0]["b"] == 12288 and rows[0]["change"] == 12288
    assert rows[0]["stack"] == "model.py:10 in forward from extra.py:11 in keep"
    assert rows[0]["by_category"] == {"activation": {"a": 0, "b": 12288}}
    assert all(r["change"] == 0 and r["a"] == r["b"] > 0 for r in rows[1:])
    assert sorted(r["a"] for r in rows[1:]) == [4096, 8192, 40960]
    text = ridgescope("diff", str(a), str(b)).stdout
    assert "Per allocation stack at the peak (largest changes first):" in text
    assert "+12.0 KiB  model.py:10 in forward from extra.py:11 in keep  [activation]" in text
