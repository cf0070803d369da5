"""Specification of torch memory snapshots (issue 3, CPU part; docs/snapshot.md).

Export: a tracked CPU training run written as a ``torch.cuda.memory._snapshot()`` pickle loads
in PyTorch's own ``torch.cuda._memory_viz`` with every allocation's category visible, uses only
the opcodes the memory_viz web page's unpickler understands, and reads back into the same
report. Import: hostile or broken pickles are refused without running anything, and a snapshot
in the layout PyTorch writes becomes a report with inferred categories and phases."""
from __future__ import annotations

import base64
import json
import pickle
import pickletools
import re
import resource
import runpy
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.cuda import _memory_viz

import ridgescope as rs
from conftest import make_gpt, train
import models
from inprocess_cli import ridgescope

# Opcodes the unpickler of torch/utils/viz/MemoryViz.js (pytorch.org/memory_viz) handles: every
# `case` of its `unpickle` switch. Anything else throws "UNKNOWN OPCODE" in the browser.
MEMORY_VIZ_JS_OPCODES = {
    "PROTO", "APPEND", "APPENDS", "LIST", "TUPLE", "NEWFALSE", "NEWTRUE", "NONE", "BINGET",
    "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1", "LONG_BINGET",
    "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "SETITEMS", "SETITEM", "DICT",
    "SHORT_BINUNICODE", "BINUNICODE", "STOP", "EMPTY_TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "BINFLOAT",
}




@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tracked CPU run (TinyGPT, AdamW, 3 steps), its report and its snapshot export."""
    root = tmp_path_factory.mktemp("snapshot")
    trace = root / "run.rstrace"
    model = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with rs.track(model=model, optimizer=opt, out=trace) as session:
        train(model, opt, lambda i: models.gpt_batch(8, 32, 256, seed=i), models.gpt_loss, steps=3)
    report = session.report()
    pickle_path = root / "run.pickle"
    stats = report.to_snapshot(pickle_path)
    return {"trace": trace, "report": report.to_dict(), "pickle": pickle_path, "stats": stats,
            "root": root}


def load_own_export(path: Path) -> dict:
    # Our own export, which the tests below prove holds only plain data; PyTorch's tools read
    # snapshots exactly like this (pickle.load).
    with open(path, "rb") as f:
        return pickle.load(f)


# --------------------------------------------------------------------------- (a) memory_viz
def test_the_export_loads_in_torch_memory_viz_and_every_allocation_shows_its_category(run):
    data = load_own_export(run["pickle"])
    # Given the export of a real run, when PyTorch's memory_viz functions read it:
    stats = _memory_viz.segsum(data)
    assert "total_reserved" in stats and "total_allocated" in stats
    text = _memory_viz.trace(data)
    assert "Device 0" in text and "entries" in text
    html = _memory_viz.trace_plot(data)
    segment_html = _memory_viz.segment_plot(data)
    assert "add_local_files" in html and "add_local_files" in segment_html
    # Then the data embedded in trace_plot's page carries a category on every entry.
    encoded = json.loads(re.search(r"const local_files = (\[.*?\])\n", html).group(1))[0]["base64"]
    embedded = pickle.loads(base64.b64decode(encoded))  # torch's own re-pickling of our data
    entries = embedded["device_traces"][0]
    allocs = [e for e in entries if e["action"] == "alloc"]
    assert len(allocs) == run["report"]["totals"]["allocations"]
    assert all(e["category"] in rs.CATEGORIES for e in entries)
    # memory_viz colours by the categories of the entries, "unknown" among them (MemoryViz.js
    # annotate_snapshot); this run has parameters, gradients, activations and optimizer state.
    categories = {e["category"] for e in entries}
    assert {"parameter", "gradient", "activation", "optimizer_state", "unknown"} <= categories
    # And the categories are the report's: bytes live at the end, per category, are the same.
    live = Counter()
    for seg in embedded["segments"]:
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                live[b["category"]] += b["size"]
    final = run["report"]["totals"]["final_by_category"]
    assert {c: live.get(c, 0) for c in rs.CATEGORIES} == final
    # Segments tile: memory_viz's segsum assertion (allocated + free == reserved) held above.
    assert sum(s["total_size"] for s in embedded["segments"]) == run["report"]["totals"]["final_live_bytes"]


def test_the_memory_viz_command_line_reads_the_export(run, tmp_path, monkeypatch, capsys):
    """`python -m torch.cuda._memory_viz trace_plot|stats FILE`: torch's own command line, its
    `__main__` block run in this process (runpy) rather than in a new interpreter."""
    def memory_viz(*args: str) -> str:
        monkeypatch.setattr(sys, "argv", ["_memory_viz.py", *args])
        runpy.run_path(_memory_viz.__file__, run_name="__main__")
        return capsys.readouterr().out

    out = tmp_path / "plot.html"
    memory_viz("trace_plot", str(run["pickle"]), "-o", str(out))
    assert "snapshot.pickle" in out.read_text()
    assert "total_reserved" in memory_viz("stats", str(run["pickle"]))


# --------------------------------------------------------------------------- (b) opcodes
def test_the_export_uses_only_opcodes_the_memory_viz_page_understands(run):
    data = run["pickle"].read_bytes()
    ops = list(pickletools.genops(data))
    names = {op.name for op, _, _ in ops}
    assert names <= MEMORY_VIZ_JS_OPCODES, names - MEMORY_VIZ_JS_OPCODES
    protocols = [arg for op, arg, _ in ops if op.name == "PROTO"]
    assert protocols == [4]
    # No bytes, sets, classes or 8-byte lengths, whatever they are called.
    assert not names & {"BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "EMPTY_SET", "FROZENSET",
                        "GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "BINUNICODE8", "LONG4"}
    assert run["stats"]["bytes"] == len(data)


# --------------------------------------------------------------------------- (c) round trip
def test_export_then_load_gives_the_same_peak_composition_and_phases(run):
    original = run["report"]
    back = rs.load(run["pickle"]).to_dict()
    assert back["snapshot"]["producer"] == "ridgescope"
    assert back["snapshot"]["inferred"]["phases"] is False
    assert back["peak"]["bytes"] == original["peak"]["bytes"]
    assert back["peak"]["by_category"] == original["peak"]["by_category"]
    assert back["peak"]["phase"] == original["peak"]["phase"]
    assert back["peak"]["step"] == original["peak"]["step"]
    assert back["totals"]["final_by_category"] == original["totals"]["final_by_category"]
    assert len(back["steps"]) == len(original["steps"]) == 3
    keys = ("phase", "step", "index", "start_bytes", "peak_bytes", "end_bytes", "allocated_bytes",
            "freed_bytes", "allocations", "start_by_category", "peak_by_category", "end_by_category")
    for s_back, s_orig in zip(back["steps"], original["steps"]):
        assert s_back["peak_bytes"] == s_orig["peak_bytes"]
        assert [{k: p[k] for k in keys} for p in s_back["phases"]] == \
               [{k: p[k] for k in keys} for p in s_orig["phases"]]
    # The model and optimizer sections come back from the carried metadata.
    assert back["optimizer"]["type"] == original["optimizer"]["type"] == "AdamW"


def test_cli_report_writes_a_snapshot_and_reads_one(run, tmp_path):
    target = tmp_path / "cli.pickle"
    out = ridgescope("report", str(run["trace"]), "--format", "snapshot", "-o", str(target))
    assert out.returncode == 0, out.stderr
    assert target.read_bytes() == run["pickle"].read_bytes()  # the same trace, the same bytes
    out = ridgescope("report", str(target))
    assert out.returncode == 0, out.stderr
    assert out.stdout == rs.load(target).summary()
    out = ridgescope("explain", str(target))
    assert out.returncode == 0, out.stderr
    out = ridgescope("report", str(run["trace"]), "--format", "snapshot")
    assert out.returncode != 0 and "-o FILE" in out.stderr


# --------------------------------------------------------------------------- (d) hostile input
class CreatesAFile:
    """Unpickling this with pickle.load would create `path` (open(path, "w"))."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_a_reduce_payload_is_refused_and_never_runs(tmp_path, protocol):
    marker = tmp_path / "payload-ran"
    payload = pickle.dumps({"segments": [], "device_traces": [[CreatesAFile(marker)]]},
                           protocol=protocol)
    # The payload is real: Python's pickle would run it.
    proof = tmp_path / "proof-that-it-runs"
    ran = pickle.loads(pickle.dumps({"segments": [], "device_traces": [[CreatesAFile(proof)]]},
                                    protocol=protocol))
    ran["device_traces"][0][0].close()  # the file object the payload opened
    assert proof.exists()
    path = tmp_path / "evil.pickle"
    path.write_bytes(payload)
    with pytest.raises(rs.TraceFormatError, match=r"refused: the pickle uses (STACK_)?GLOBAL"):
        rs.load(path)
    out = ridgescope("report", str(path))
    assert out.returncode != 0 and "GLOBAL" in out.stderr and "Traceback" not in out.stderr
    out = ridgescope("explain", str(path))
    assert out.returncode != 0 and "GLOBAL" in out.stderr
    assert not marker.exists()


@pytest.mark.parametrize("obj,message", [
    ({"segments": [b"bytes"]}, r"segments\[0\] must be a dict, got bytes"),
    ({"segments": {1, 2}}, "'segments' must be a list, got set"),
    ({"segments": "not a list"}, "'segments' must be a list, got str"),
    ({"device_traces": [[{"action": "alloc", "addr": "0x10", "size": 4}]]},
     r"device_traces\[0\]\[0\]\['addr'\] must be an int, got str"),
    ({"device_traces": [[{"action": "alloc", "addr": 16}]]}, r"device_traces\[0\]\[0\] has no 'size'"),
    ({"device_traces": [[{"addr": 16, "size": 4}]]}, r"device_traces\[0\]\[0\] has no 'action'"),
    ({"device_traces": {"0": []}}, "'device_traces' must be a list, got dict"),
    ({"segments": [{"address": 0, "total_size": 512}]}, r"segments\[0\] has no 'blocks'"),
    ({}, "neither 'segments' nor 'device_traces'"),
    ([1, 2, 3], r"segments\[0\] must be a dict, got int"),
    (42, "holds a int, not a snapshot dict"),
])
def test_wrong_types_and_missing_keys_get_a_clear_error(tmp_path, obj, message):
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps(obj, protocol=4))
    with pytest.raises(rs.TraceFormatError, match=message):
        rs.load(path)


def test_every_truncation_of_a_real_export_is_an_error_never_a_crash(run, tmp_path):
    data = run["pickle"].read_bytes()
    path = tmp_path / "cut.pickle"
    for cut in [1, 2, 3, 10, 100, len(data) // 3, len(data) // 2, len(data) - 2, len(data) - 1]:
        path.write_bytes(data[:cut])
        with pytest.raises(rs.TraceFormatError, match="truncated|claims|ends before STOP"):
            rs.load(path)


def test_a_million_deep_nesting_is_refused_without_recursion(tmp_path):
    path = tmp_path / "deep.pickle"
    path.write_bytes(b"\x80\x04" + b"]" * 10**6 + b"a" * (10**6 - 1) + b".")
    with pytest.raises(rs.TraceFormatError, match="nested deeper than 256 levels"):
        rs.load(path)


def test_a_2_gib_length_field_is_an_error_not_an_allocation(tmp_path):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    path = tmp_path / "huge.pickle"
    path.write_bytes(b"\x80\x04X\x00\x00\x00\x80abc.")
    with pytest.raises(rs.TraceFormatError, match="claims 2147483648 bytes but only 4 remain"):
        rs.load(path)
    path.write_bytes(b"\x80\x04\x95\x00\x00\x00\x80\x00\x00\x00\x00}.")
    with pytest.raises(rs.TraceFormatError, match="FRAME claims"):
        rs.load(path)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 256


# --------------------------------------------------------------------------- (e) PyTorch's own
def torch_frames(*frames: tuple[str, str]) -> list[dict]:
    site = "/usr/lib/python3.11/site-packages/"
    return [{"filename": f if f.startswith("/") or f.startswith("train") else site + f,
             "line": 10 + i, "name": n} for i, (f, n) in enumerate(frames)]


def torch_like_snapshot() -> dict:
    """A snapshot in the exact layout torch.cuda.memory._snapshot() returns (torch 2.14:
    segments with blocks, one trace per device, allocator_settings, external_annotations),
    for one step of a model with a 1000-element fp32 weight trained with Adam."""
    train_frame = ("train.py", "main")
    fwd = torch_frames(("torch/nn/functional.py", "linear"), ("torch/nn/modules/linear.py", "forward"),
                       ("torch/nn/modules/module.py", "_call_impl"), train_frame)
    bwd = torch_frames(("torch/autograd/graph.py", "_engine_run_backward"),
                       ("torch/_tensor.py", "backward"), train_frame)
    init = torch_frames(("torch/nn/modules/linear.py", "reset_parameters"),
                        ("torch/nn/modules/linear.py", "__init__"), train_frame)
    adam_init = torch_frames(("torch/optim/adam.py", "_init_group"), ("torch/optim/adam.py", "step"),
                             ("torch/optim/optimizer.py", "wrapper"), train_frame)
    adam_tmp = torch_frames(("torch/optim/adam.py", "_single_tensor_adam"), ("torch/optim/adam.py", "step"),
                            train_frame)
    base = 0x7F0000000000

    def entry(action, addr, size, t, frames):
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
                "compile_context": "N/A", "user_metadata": "", "pool_id": (0, 0), "frames": frames}

    trace = [
        entry("segment_alloc", base, 2097152, 1_700_000_000_000_000, init),
        entry("alloc", base, 4000, 1_700_000_000_000_010, init),                 # weight
        entry("alloc", base + 4096, 40000, 1_700_000_000_000_100, fwd),          # activation
        entry("alloc", base + 45056, 400, 1_700_000_000_000_110, fwd),           # temporary
        entry("free_requested", base + 45056, 400, 1_700_000_000_000_120, fwd),
        entry("free_completed", base + 45056, 400, 1_700_000_000_000_120, fwd),
        entry("alloc", base + 45056, 4000, 1_700_000_000_000_200, bwd),          # the weight's grad
        entry("free_requested", base + 4096, 40000, 1_700_000_000_000_210, fwd),
        entry("free_completed", base + 4096, 40000, 1_700_000_000_000_210, fwd),
        entry("alloc", base + 4096, 4000, 1_700_000_000_000_300, adam_init),     # exp_avg
        entry("alloc", base + 8192, 4000, 1_700_000_000_000_301, adam_init),     # exp_avg_sq
        entry("alloc", base + 12288, 4000, 1_700_000_000_000_310, adam_tmp),     # a temporary
        entry("free_requested", base + 12288, 4000, 1_700_000_000_000_320, adam_tmp),
        entry("free_completed", base + 12288, 4000, 1_700_000_000_000_320, adam_tmp),
    ]
    live = [(base, 4096, 4000, init), (base + 4096, 4096, 4000, adam_init),
            (base + 8192, 4096, 4000, adam_init), (base + 45056, 4096, 4000, bwd)]
    states = ["active_allocated", "active_allocated", "active_awaiting_free", "active_allocated"]
    blocks, at = [], base
    for (addr, size, requested, frames), state in zip(live, states):
        if addr > at:
            blocks.append({"address": at, "size": addr - at, "requested_size": 0, "state": "inactive",
                           "frames": []})
        blocks.append({"address": addr, "size": size, "requested_size": requested,
                       "state": state, "frames": frames})
        at = addr + size
    blocks.append({"address": at, "size": base + 2097152 - at, "requested_size": 0,
                   "state": "inactive", "frames": []})
    segment = {"device": 0, "address": base, "total_size": 2097152, "allocated_size": 16384,
               "active_size": 16384, "requested_size": 16000, "stream": 0, "segment_type": "large",
               "segment_pool_id": (0, 0), "is_expandable": False, "frames": init, "blocks": blocks}
    return {
        "segments": [segment],
        "device_traces": [trace],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                               "garbage_collection_threshold": 0.0, "expandable_segments": False,
                               "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
                               "pinned_use_cuda_host_register": False,
                               "roundup_power2_divisions": {"1": 0, "2": 0}},
        "external_annotations": [{"name": "## forward ##", "stage": "START", "device": 0,
                                  "time_us": 1_700_000_000_000_090}],
    }


def test_a_snapshot_written_the_way_pytorch_writes_it_gives_a_report_with_inferred_categories(tmp_path):
    path = tmp_path / "torch_snapshot.pickle"
    path.write_bytes(pickle.dumps(torch_like_snapshot()))  # the default protocol, as _dump_snapshot
    report = rs.load(path)
    r = report.to_dict()
    snap = r["snapshot"]
    assert snap["producer"] == "pytorch" and snap["device"] == "cuda:0"
    assert snap["inferred"] == {"categories": True, "phases": True, "block_sizes": True}
    assert snap["categorised_from_frames"] == 3  # the weight and the two Adam moments
    assert r["device"] == "cuda:0"
    # The peak: weight 4096 + activation 40448 (40000 rounded to 512) + grad 4096, in backward.
    assert r["peak"]["bytes"] == 4096 + 40448 + 4096
    assert r["peak"]["phase"] == "backward"
    peak = r["peak"]["by_category"]
    assert peak["parameter"] == 4096 and peak["activation"] == 40448 and peak["gradient"] == 4096
    final = r["totals"]["final_by_category"]
    assert final == {**{c: 0 for c in rs.CATEGORIES}, "parameter": 4096, "gradient": 4096,
                     "optimizer_state": 8192}
    assert r["peak"]["reserved_bytes"] == 2097152
    assert [p["phase"] for p in report.phases()] == ["forward", "backward", "optimizer_step"]
    # Blocks are labelled with where they were made: the user frame that called the module,
    # then the module's forward frame (the frame inside nn.Module._call_impl), and the rule.
    top = r["peak"]["top_blocks"][0]
    assert top["bytes"] == 40448 and top["category"] == "activation" and top["inferred"]
    assert top["module"] == "train.py:13 in main > linear.py:11 in forward"
    assert top["label"] == "activation in train.py:13 in main > linear.py:11 in forward [activation]"
    assert any("inferred" in n for n in snap["notes"])
    out = ridgescope("report", str(path))
    assert out.returncode == 0, out.stderr
    assert out.stdout == report.summary()
    out = ridgescope("explain", str(path))
    assert out.returncode == 0, out.stderr


def test_a_snapshot_without_traces_counts_its_live_blocks_from_time_zero(tmp_path):
    snap = torch_like_snapshot()
    snap["device_traces"] = [[]]
    path = tmp_path / "segments_only.pickle"
    path.write_bytes(pickle.dumps(snap))
    r = rs.load(path).to_dict()
    assert r["snapshot"]["live_at_start_blocks"] == 4
    assert r["peak"]["bytes"] == 4 * 4096 and r["peak"]["reserved_bytes"] == 2097152
    assert r["totals"]["final_by_category"]["optimizer_state"] == 8192  # from the blocks' frames


def test_the_optimizers_record_function_annotations_mark_its_phase_exactly(tmp_path):
    """torch.optim wraps step() in record_function("Optimizer.step#<class>.step"), which
    _record_memory_history records in external_annotations: an allocation with no frames
    inside it (a worker thread's) belongs to optimizer_step, kept, so optimizer state."""
    snap = torch_like_snapshot()
    base = 0x7F0000000000
    t0 = 1_700_000_000_000_000
    snap["external_annotations"] += [
        {"name": "Optimizer.step#Adam.step", "stage": "START", "device": 0, "time_us": t0 + 250},
        {"name": "Optimizer.step#Adam.step", "stage": "END", "device": 0, "time_us": t0 + 330},
        {"name": "some.library#internal", "stage": "START", "device": 0, "time_us": t0 + 255},
    ]
    frameless = {"action": "alloc", "addr": base + 16384, "size": 4000, "stream": 0,
                 "time_us": t0 + 260, "compile_context": "N/A", "user_metadata": "", "frames": []}
    snap["device_traces"][0].insert(9, frameless)  # after backward's last entry, before exp_avg
    path = tmp_path / "annotated.pickle"
    path.write_bytes(pickle.dumps(snap))
    report = rs.load(path)
    r = report.to_dict()
    assert [p["phase"] for p in report.phases()] == ["forward", "backward", "optimizer_step"]
    opt = report.phases("optimizer_step")[0]
    assert opt["start_bytes"] == 4096 + 4096  # the weight and its gradient
    # the frameless block (4000 -> 4096) and the two moments: optimizer state, the first inferred
    # (at the end of the step: the snapshot's segments do not hold the added block, so the
    # replay, which ends in the segments' state, frees it after the last entry)
    assert opt["end_by_category"]["optimizer_state"] == 3 * 4096
    assert r["totals"]["final_by_category"]["optimizer_state"] == 2 * 4096
    assert any("record_function" in n for n in r["snapshot"]["notes"])

