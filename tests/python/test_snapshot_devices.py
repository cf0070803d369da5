"""Specification of reading a snapshot device by device (csrc/core/snapshot/snapshot_devices.cpp;
docs/snapshot.md, "Devices"): which devices a snapshot holds memory for (its segments and the
device_traces lists that replay something may disagree), the per-device summary, the report
of the device asked for or of the one whose live bytes peaked highest, and the end state the
segments give."""
from __future__ import annotations

import json
import pickle
import time

import pytest

import ridgescope as rs
from ridgescope import _C
from snapshot_builder import FORWARD, USER, SnapshotBuilder, merge


def two_devices() -> dict:
    """cuda:0 peaks at 4096 + 8192 bytes, cuda:1 at 4096 + 40960."""
    a = SnapshotBuilder(device=0, traces=2)
    a.pre(4096)
    a.begin("forward")
    a.free(a.alloc(8192, FORWARD), FORWARD)
    a.end("forward")
    b = SnapshotBuilder(device=1, traces=2)
    b.pre(4096)
    b.begin("forward")
    b.alloc(40960, FORWARD)
    b.end("forward")
    return merge(a.build(), b.build())


def test_without_a_device_the_report_is_about_the_highest_peak_and_lists_every_device(tmp_path):
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(two_devices()))
    report = rs.load(path)
    r = report.to_dict()
    assert r["device"] == "cuda:1" and r["snapshot"]["device_choice"] == "highest_peak"
    rows = r["snapshot"]["devices"]
    assert [(x["device"], x["peak_bytes"], x["end_live_bytes"], x["segments"]) for x in rows] == [
        ("cuda:0", 4096 + 8192, 4096, 1), ("cuda:1", 4096 + 40960, 4096 + 40960, 1)]
    assert rows[1]["end_reserved_bytes"] == 2 * 1024 * 1024
    assert rows[1]["peak_by_category"]["activation"] == 40960
    text = report.summary()
    assert "Devices in this snapshot (each replayed on its own):" in text
    assert "This report is about cuda:1, the device whose live bytes peaked highest" in text
    assert text.index("cuda:0  peak") < text.index("cuda:1  peak") < text.index("Peak:")


def test_a_device_asked_for_is_reported_and_the_summary_left_out(tmp_path, capsys):
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(two_devices()))
    r = rs.load(path, device="cuda:0").to_dict()
    assert r["device"] == "cuda:0" and r["snapshot"]["device_choice"] == "asked"
    assert r["peak"]["bytes"] == 4096 + 8192 and r["totals"]["final_live_bytes"] == 4096
    assert rs.Report.from_snapshot(path, device_index=0).peak_bytes == 4096 + 8192
    from ridgescope.cli import main
    for command in (["report"], ["explain"]):
        assert main(command + [str(path), "--device", "cuda:0"]) == 0
        out = capsys.readouterr().out
        assert "cuda:0" in out and "Devices in this snapshot" not in out
    assert main(["diff", str(path), str(path), "--device", "cuda:0", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["peak"]["a"] == 4096 + 8192


@pytest.mark.parametrize("device,message", [
    ("cuda:3", r"records no memory on cuda:3 \(it has cuda:0, cuda:1\)"),
    ("cpu", "a snapshot's device is 'cuda:N', got 'cpu'"),
    ("gpu1", "a snapshot's device is 'cuda:N'"),
])
def test_a_device_the_snapshot_does_not_hold_is_a_clear_error(tmp_path, device, message):
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(two_devices()))
    with pytest.raises(rs.RidgescopeError, match=message):
        rs.load(path, device=device)


def test_segments_on_cuda1_with_a_trace_list_per_gpu_report_cuda1(tmp_path):
    """The shape of a file written on the second GPU: segments on cuda:1 only, device_traces
    with a 'snapshot' marker for cuda:0 and one free for cuda:1."""
    b = SnapshotBuilder(device=1)
    w = b.pre(8192)
    b.free(b.pre(4096), USER)  # a block older than the trace, freed by its one entry
    snap = b.build()
    snap["device_traces"][0] = [{"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 1}]
    snap["device_traces"][1] = snap["device_traces"][1][-1:]  # only free_completed kept
    path = tmp_path / "cuda1.pickle"
    path.write_bytes(pickle.dumps(snap))
    r = rs.load(path).to_dict()
    assert r["device"] == "cuda:1" and [x["device"] for x in r["snapshot"]["devices"]] == ["cuda:1"]
    assert r["totals"]["final_live_bytes"] == 8192 and r["peak"]["bytes"] == 8192 + 4096
    assert w  # the weight, live throughout


def test_a_bare_list_of_segments_reads_as_the_state_at_one_instant(tmp_path):
    b = SnapshotBuilder(device=1)
    b.pre(4096)
    path = tmp_path / "list.pkl"
    path.write_bytes(pickle.dumps(b.build()["segments"]))
    r = rs.load(path).to_dict()
    assert r["device"] == "cuda:1" and r["totals"]["final_live_bytes"] == 4096
    assert r["totals"]["final_reserved_bytes"] == 2 * 1024 * 1024


def test_the_replay_ends_in_the_state_of_the_segments(tmp_path):
    """Scenario: history recording stopped before the snapshot was taken. Given a trace that
    leaves a block allocated which the segments show free, and a block the segments hold at an
    address the trace allocated and freed, then the replay frees the first and allocates the
    second at the end, and says so: live bytes at the end are the segments' allocated_size."""
    b = SnapshotBuilder()
    b.begin("forward")
    gone = b.alloc(4096, FORWARD)
    late = b.alloc(8192, FORWARD)
    b.free(late, FORWARD)
    b.end("forward")
    # the segments when the snapshot was taken: `gone` freed, a block made again at `late`
    del b.blocks[gone]
    b.blocks[late] = {"size": 8192, "requested_size": 8192, "frames": []}
    snap = b.build()
    assert snap["segments"][0]["allocated_size"] == 8192
    path = tmp_path / "stopped.pickle"
    path.write_bytes(pickle.dumps(snap))
    r = rs.load(path).to_dict()
    assert r["totals"]["final_live_bytes"] == 8192
    assert r["peak"]["bytes"] == 4096 + 8192  # the peak is the trace's
    assert any("1 blocks the trace left allocated were freed, 1 blocks it never allocated were allocated"
               in n for n in r["snapshot"]["notes"])


def test_an_empty_snapshot_is_an_empty_report_of_cuda0(tmp_path):
    path = tmp_path / "empty.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[], [], [], []]}))
    r = rs.load(path).to_dict()
    assert r["device"] == "cuda:0" and r["peak"]["bytes"] == 0 and r["totals"]["final_reserved_bytes"] == 0


def test_a_trace_file_takes_a_device_too(trace_path):
    import torch
    with rs.track(out=trace_path):
        x = torch.ones(1000)
    del x
    assert rs.load(trace_path, device="cpu").to_dict()["device"] == "cpu"
    assert rs.load(trace_path, device="cuda:0").to_dict()["peak"]["bytes"] == 0  # nothing there


def test_snapshot_to_trace_replays_the_highest_peak_by_default(tmp_path):
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(two_devices()))
    out = tmp_path / "replayed.rstrace"
    _C.snapshot_to_trace(str(path), str(out))
    devices = {e["device"] for e in _C.read_events(str(out)) if e["kind"] == "alloc"}
    assert devices == {"cuda:1"}
    _C.snapshot_to_trace(str(path), str(out), 0)
    assert {e["device"] for e in _C.read_events(str(out)) if e["kind"] == "alloc"} == {"cuda:0"}


def test_device_lists_sharing_one_huge_list_are_refused_as_a_bomb(tmp_path):
    """Given device_traces that reference one list of 200,000 'snapshot' markers 5,000 times
    (a few hundred KiB of pickle, 10^9 entries to visit), then reading it is refused quickly with
    a clear error, not a hang."""
    marker = {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 0}
    shared = [marker] * 200_000
    snap = {"segments": [], "device_traces": [shared] * 5_000}
    path = tmp_path / "bomb.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    assert path.stat().st_size < 2_000_000
    start = time.monotonic()
    with pytest.raises(rs.TraceFormatError, match="decompression bomb"):
        rs.load(path)
    assert time.monotonic() - start < 60


def test_a_device_past_the_last_cuda_ordinal_is_a_clear_error(tmp_path):
    entry = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 1}
    path = tmp_path / "many.pickle"
    path.write_bytes(pickle.dumps({"segments": [{"device": 40000, "address": 0, "total_size": 2097152,
                                                 "blocks": []}], "device_traces": [[entry]]}))
    with pytest.raises(rs.TraceFormatError, match="names device 40000; CUDA devices are numbered 0 to 32767"):
        rs.load(path)


def test_many_devices_over_many_segments_is_refused_not_replayed_for_minutes(tmp_path):
    """Each device is replayed on its own over every segment: a small file naming thousands of
    devices and thousands of segments (shared through the memo) asks for more work than its size
    can, and is refused."""
    entry = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 1}
    segment = {"device": 0, "address": 0, "total_size": 2097152, "blocks": []}
    path = tmp_path / "devices.pickle"
    path.write_bytes(pickle.dumps({"segments": [segment] * 20_000, "device_traces": [[entry]] * 5_000}))
    with pytest.raises(rs.TraceFormatError, match="5000 devices over 20000 segments is more than"):
        rs.load(path)


def test_the_export_of_a_report_read_for_one_device_is_that_device(tmp_path):
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(two_devices()))
    out = tmp_path / "export.pickle"
    rs.load(path, device="cuda:0").to_snapshot(out)
    assert rs.load(out).peak_bytes == 4096 + 8192  # cuda:0's, not the highest peak
