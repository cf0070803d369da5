"""Specification of the CUDA caching allocator model from Python (issue 7): the binding, the
replay of a tracked run, the `ridgescope whatif` command, and agreement with torch's own
parser of PYTORCH_CUDA_ALLOC_CONF (checked in a subprocess against libc10, no GPU needed)."""
from __future__ import annotations

import json
import pickle

import pytest
import torch

import ridgescope as rs
from ridgescope import _C
from ridgescope._allocator_model import (AllocatorModel, actions_from_snapshot,
                                         compare_with_snapshot, parse_alloc_conf, replay_actions,
                                         round_size, simulate)
from ridgescope.cli import main as cli_main
from conftest import make_mlp, mlp_batch, mlp_loss, train
from fork_server import call

MiB = 1 << 20


def _round512(n: int) -> int:
    """torch's round_size without roundup_power2_divisions, written out for the test."""
    if n == 0:
        return 0
    return max(512, (n + 511) // 512 * 512)


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    """A tracked CPU run: an MLP trained with AdamW for 2 steps."""
    path = tmp_path_factory.mktemp("alloc") / "mlp.rstrace"
    model = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with rs.track(model=model, optimizer=opt, out=path):
        train(model, opt, lambda i: mlp_batch(16, i), mlp_loss, 2, 1, True)
    return path


def test_model_rounds_splits_and_reuses_like_torch():
    """Given default settings, when 1 B, 11 MiB and 5 MiB are requested, then the blocks are
    512 B (2 MiB small segment), 12 MiB (the 1 MiB remainder of a 12 MiB segment is not split)
    and 5 MiB (20 MiB segment), and a freed block is reused without a new segment."""
    m = AllocatorModel()
    a = m.malloc(1, 1)
    assert (a["block_bytes"], a["segment_bytes"], a["small_pool"]) == (512, 2 * MiB, True)
    b = m.malloc(2, 11 * MiB)
    assert (b["block_bytes"], b["segment_bytes"], b["small_pool"]) == (12 * MiB, 12 * MiB, False)
    c = m.malloc(3, 5 * MiB)
    assert (c["block_bytes"], c["segment_bytes"]) == (5 * MiB, 20 * MiB)
    assert m.allocated_bytes == 512 + 12 * MiB + 5 * MiB
    assert m.reserved_bytes == 34 * MiB
    assert m.free(3) and not m.free(3)
    d = m.malloc(4, 6 * MiB)
    assert d["address"] == c["address"] and not d["segment_created"]
    segs = m.segments()
    assert [s["total_size"] for s in segs] == [2 * MiB, 12 * MiB, 20 * MiB]
    assert {"address", "total_size", "allocated_size", "segment_type", "blocks"} <= set(segs[0])
    stats = m.stats()
    assert stats["peak_reserved_bytes"] == 34 * MiB
    assert stats["segment_count"] == 3


def test_capacity_release_and_retry_then_oom():
    """Given 64 MiB and a cached 40 MiB segment, 50 MiB succeeds after releasing it; 20 MiB
    more is out of memory."""
    m = AllocatorModel(capacity="64MiB")
    m.malloc(1, 40 * MiB)
    m.free(1)
    r = m.malloc(2, 50 * MiB)
    assert r["ok"] and r["released_bytes"] == 40 * MiB
    o = m.malloc(3, 20 * MiB)
    assert o["status"] == "out_of_memory" and not o["ok"]
    assert m.stats()["oom_count"] == 1


def test_expandable_segments_and_empty_cache():
    m = AllocatorModel("expandable_segments:True")
    m.record_segment_events()
    m.malloc(1, 5 * MiB)
    m.malloc(2, 30 * MiB)
    assert m.reserved_bytes == 40 * MiB and m.segment_count == 1
    m.free(1)
    m.free(2)
    assert m.empty_cache() == 40 * MiB
    assert m.reserved_bytes == 0
    assert [e["action"] for e in m.segment_events()] == ["segment_map", "segment_map",
                                                         "segment_unmap"]


def test_recorded_addresses_and_releases():
    m = AllocatorModel()
    m.hint_next_segment_address(0x400000000)
    r = m.malloc(1, 30 * MiB)
    assert r["address"] == 0x400000000
    assert m.release_cached_segment(0x400000000) == 0  # still in use
    m.free(1)
    assert m.release_cached_segment(0x400000000) == 30 * MiB
    assert m.reserved_bytes == 0


def test_bad_settings_raise_ridgescope_error():
    for bad, part in [("max_split_size_mb:10", ">= 20"), ("foo:1", "unknown option"),
                      ("expandable_segments:yes", "True or False")]:
        with pytest.raises(rs.RidgescopeError, match=part):
            AllocatorModel(bad)
    with pytest.raises(rs.RidgescopeError, match="capacity"):
        AllocatorModel(capacity="lots")
    assert parse_alloc_conf("roundup_power2_divisions:4, expandable_segments:True")["alloc_conf"] \
        == "expandable_segments:True,roundup_power2_divisions:4"
    assert round_size(1200 * MiB, "roundup_power2_divisions:4") == 1280 * MiB


def test_replay_of_a_cpu_run_allocates_exactly_the_rounded_blocks(cpu_trace):
    """Given a tracked CPU run, when its alloc/free sequence replays through the model, then
    the recorded peak is the run's peak of live bytes and the model's allocated bytes are, at
    every event, the sum of the rounded sizes of the live blocks (checked through the peak and
    the end state, recomputed here from the events)."""
    events = _C.read_events(str(cpu_trace))
    live: dict[int, int] = {}
    rounded_live = recorded_live = rounded_peak = recorded_peak = 0
    n_alloc = 0
    for e in events:
        if e.get("device") != "cpu":
            continue
        if e["kind"] == "alloc":
            n_alloc += 1
            live[e["addr"]] = e["bytes"]
            rounded_live += _round512(e["bytes"])
            recorded_live += e["bytes"]
        elif e["kind"] == "free" and e["addr"] in live:
            n = live.pop(e["addr"])
            rounded_live -= _round512(n)
            recorded_live -= n
        rounded_peak = max(rounded_peak, rounded_live)
        recorded_peak = max(recorded_peak, recorded_live)
    assert n_alloc > 100

    r = simulate(cpu_trace, device="cpu", timeline_points=0)
    assert r["allocs"] == n_alloc
    assert r["recorded_peak_bytes"] == recorded_peak
    assert r["recorded_peak_bytes"] == rs.load(cpu_trace).to_dict()["peak"]["bytes"]
    assert r["peak_allocated_bytes"] == rounded_peak
    assert r["final"]["allocated_bytes"] == rounded_live
    assert max(p["allocated_bytes"] for p in r["timeline"]) == rounded_peak
    assert len(r["timeline"]) == r["actions"]
    assert r["peak_reserved_bytes"] >= r["peak_allocated_bytes"]


def test_replay_timeline_is_bounded_and_keeps_the_peak(cpu_trace):
    full = simulate(cpu_trace, device="cpu", timeline_points=0)
    small = simulate(cpu_trace, device="cpu", timeline_points=16)
    assert len(small["timeline"]) <= 16
    assert max(p["reserved_bytes"] for p in small["timeline"]) == full["peak_reserved_bytes"]
    assert max(p["allocated_bytes"] for p in small["timeline"]) == full["peak_allocated_bytes"]


def test_simulate_refuses_bad_input(tmp_path):
    with pytest.raises(rs.TraceFormatError):
        simulate(tmp_path / "missing.rstrace")
    junk = tmp_path / "junk.rstrace"
    junk.write_bytes(b"not a trace at all")
    with pytest.raises(rs.TraceFormatError):
        simulate(junk)
    with pytest.raises(rs.RidgescopeError):
        simulate(junk, device="gpu")


def test_snapshot_actions_replay_and_empty_cache_detection():
    """A snapshot's device trace, without segment addresses: an empty_cache between two
    requests becomes an empty_cache action; a release followed by segment_alloc is read as a
    retry. With them, the model's segments and releases follow the recorded addresses."""
    A, B, C = 0x100000000, 0x200000000, 0x300000000
    trace = [
        {"action": "segment_alloc", "addr": A, "size": 20 * MiB},
        {"action": "alloc", "addr": A, "size": 4 * MiB, "stream": 0},
        {"action": "free_requested", "addr": A, "size": 4 * MiB},
        {"action": "free_completed", "addr": A, "size": 4 * MiB},
        {"action": "segment_free", "addr": A, "size": 20 * MiB},   # empty_cache
        {"action": "segment_alloc", "addr": B, "size": 2 * MiB},
        {"action": "alloc", "addr": B, "size": 1000, "stream": 0},
    ]
    actions = actions_from_snapshot({"device_traces": [trace]}, segment_addresses=False)
    assert [a[0] for a in actions] == ["alloc", "free", "alloc"]  # followed by segment_alloc
    trace2 = trace[:5] + [{"action": "alloc", "addr": C, "size": 1000, "stream": 0}]
    actions2 = actions_from_snapshot({"device_traces": [trace2]}, segment_addresses=False)
    assert [a[0] for a in actions2] == ["alloc", "free", "empty_cache", "alloc"]
    r = replay_actions(actions2)
    assert [e["action"] for e in r["segment_events"]] == ["segment_alloc", "segment_free",
                                                          "segment_alloc"]
    assert [e["reserved_after"] for e in r["segment_events"]] == [20 * MiB, 0, 2 * MiB]
    # With the recorded segment addresses, the model's segments sit where torch put them.
    # ... and torch's release, whatever its cause, is replayed where it happened.
    hinted = actions_from_snapshot({"device_traces": [trace]})
    assert [a[0] for a in hinted] == ["segment_alloc", "alloc", "free", "segment_free",
                                      "segment_alloc", "alloc"]
    r = replay_actions(hinted)
    assert [(e["action"], e["address"], e["bytes"]) for e in r["segment_events"]] == [
        ("segment_alloc", A, 20 * MiB), ("segment_free", A, 20 * MiB),
        ("segment_alloc", B, 2 * MiB)]
    with pytest.raises(rs.TraceFormatError):
        actions_from_snapshot({"segments": []})


def _snapshot(second_segment_bytes: int) -> dict:
    """A torch snapshot of a short run under default settings, written out by hand from torch's
    rules: 4 MiB and 6 MiB share a 20 MiB segment, 11 MiB gets a 12 MiB segment, then
    empty_cache() releases the wholly free 20 MiB segment."""
    A, B = 0x100000000, 0x200000000
    trace = [
        {"action": "segment_alloc", "addr": A, "size": 20 * MiB, "stream": 0},
        {"action": "alloc", "addr": A, "size": 4 * MiB, "stream": 0},
        {"action": "alloc", "addr": A + 4 * MiB, "size": 6 * MiB, "stream": 0},
        {"action": "free_requested", "addr": A, "size": 4 * MiB, "stream": 0},
        {"action": "free_completed", "addr": A, "size": 4 * MiB, "stream": 0},
        {"action": "segment_alloc", "addr": B, "size": second_segment_bytes, "stream": 0},
        {"action": "alloc", "addr": B, "size": 11 * MiB, "stream": 0},
        {"action": "free_completed", "addr": A + 4 * MiB, "size": 6 * MiB, "stream": 0},
        {"action": "segment_free", "addr": A, "size": 20 * MiB, "stream": 0},
        {"action": "free_completed", "addr": B, "size": 11 * MiB, "stream": 0},
    ]
    segments = [{"device": 0, "address": B, "total_size": second_segment_bytes,
                 "segment_type": "large", "blocks": []}]
    return {"segments": segments, "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}


def test_compare_with_snapshot_reproduces_every_segment_event():
    """Given a snapshot whose segments follow torch's rules, the model reproduces reserved bytes
    at every segment event and the segment count; given one that does not, the first
    disagreeing event is named."""
    c = compare_with_snapshot(_snapshot(12 * MiB))
    assert c["exact"] and c["first_mismatch"] is None
    assert (c["recorded_segment_events"], c["model_segment_events"]) == (3, 3)
    assert c["model_peak_reserved_bytes"] == c["recorded_peak_reserved_bytes"] == 32 * MiB
    assert c["model_reserved_bytes"] == c["recorded_reserved_bytes"] == 12 * MiB
    assert c["model_segment_count"] == c["recorded_segment_count"] == 1
    wrong = compare_with_snapshot(_snapshot(14 * MiB))
    assert not wrong["exact"] and wrong["matching_prefix"] == 1
    assert wrong["first_mismatch"] == {"index": 1, "recorded": ("segment_alloc", 14 * MiB, 34 * MiB),
                                       "model": ("segment_alloc", 12 * MiB, 32 * MiB)}


def test_whatif_cli_compares_settings(cpu_trace, capsys):
    rc = cli_main(["whatif", str(cpu_trace), "--device", "cpu",
                   "--alloc-conf", "expandable_segments:True", "--format", "json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    base = simulate(cpu_trace, device="cpu")
    exp = simulate(cpu_trace, "expandable_segments:True", device="cpu")
    assert out["baseline"]["peak_reserved_bytes"] == base["peak_reserved_bytes"]
    assert out["whatif"][0]["peak_reserved_bytes"] == exp["peak_reserved_bytes"]
    assert out["whatif"][0]["peak_allocated_bytes"] == base["peak_allocated_bytes"]
    rc = cli_main(["whatif", str(cpu_trace), "--device", "cpu", "--alloc-conf",
                   "expandable_segments:True", "--capacity", "1GiB"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "peak reserved" in text and "expandable_segments:True" in text
    assert "failed requests" in text
    assert cli_main(["whatif", str(cpu_trace), "--alloc-conf", "bogus:1"]) == 1
    assert "unknown option 'bogus'" in capsys.readouterr().err


def test_whatif_cli_reads_a_torch_snapshot_with_its_recorded_settings(tmp_path, capsys):
    """Given a snapshot PyTorch wrote (here by hand, by torch's rules) under
    max_split_size_mb:64, when `ridgescope whatif` gets the pickle, then the baseline is the
    snapshot's own settings and its replay reserves what was recorded; the what-if with
    expandable_segments is replayed from the same requests."""
    snap = _snapshot(12 * MiB)
    snap["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64",
                                  "max_split_size": 64 * MiB, "expandable_segments": False,
                                  "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}}
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    rc = cli_main(["whatif", str(path), "--alloc-conf", "expandable_segments:True",
                   "--format", "json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["file"] == str(path)
    assert out["recorded_alloc_conf"] == "max_split_size_mb:64"
    assert out["baseline"]["alloc_conf"] == "max_split_size_mb:64"
    assert out["baseline"]["peak_reserved_bytes"] == 32 * MiB  # as recorded: 20 + 12 MiB
    # Peak: the 6 MiB block and the 11 MiB request's block, which is the whole 12 MiB segment
    # (a remainder of 1 MiB is not split off): 18 MiB, not 17.
    assert out["baseline"]["peak_allocated_bytes"] == 18 * MiB
    # Expandable segments split every block: 6 + 11 MiB. They map 20 MiB pages: the 11 MiB
    # request does not fit the 10 MiB free tail after the 6 MiB block, which grows by one page,
    # so this small run reserves more with them (40 MiB), not less.
    assert out["whatif"][0]["peak_allocated_bytes"] == 17 * MiB
    assert out["whatif"][0]["peak_reserved_bytes"] == 40 * MiB
    # An explicit baseline wins over the recorded one.
    rc = cli_main(["whatif", str(path), "--alloc-conf", "expandable_segments:True",
                   "--baseline-conf", "", "--format", "json"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["baseline"]["alloc_conf"] == ""
    # Not a snapshot: the error names the problem; a hostile pickle runs nothing.
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps({"device_traces": "nope"}, protocol=4))
    assert cli_main(["whatif", str(bad), "--alloc-conf", "expandable_segments:True"]) == 1
    assert "'device_traces' must be a list" in capsys.readouterr().err


def torch_oracle(confs: list[str]) -> dict:
    """What torch's own parser (libc10's AcceleratorAllocatorConfig) makes of each setting: its
    roundup_power2_divisions table for 1 MiB .. 32 GiB, or its error. Run in a process of its own
    (forked from the fork server, tests/python/fork_server.py): each setting changes that
    process's allocator configuration."""
    import ctypes
    import pathlib
    lib = ctypes.CDLL(str(pathlib.Path(torch.__file__).parent / "lib" / "libc10.so"))
    f = lib._ZN3c1016CachingAllocator26AcceleratorAllocatorConfig24roundup_power2_divisionsEm
    f.restype, f.argtypes = ctypes.c_size_t, [ctypes.c_size_t]
    out: dict = {}
    for conf in confs:
        try:
            torch._C._accelerator_setAllocatorSettings(conf)
            out[conf] = [f(1 << (20 + i)) for i in range(16)]
        except Exception as exc:
            out[conf] = "error: " + str(exc).splitlines()[0]
    return out


def test_settings_parse_like_torch_2_14():
    """The roundup_power2_divisions table our parser builds equals the one torch's own parser
    (libc10's AcceleratorAllocatorConfig) builds, and both refuse the same malformed strings."""
    good = ["roundup_power2_divisions:4", "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
            "roundup_power2_divisions:[64:8,>:2]", "roundup_power2_divisions:[1:2,16:4,>:1]",
            "roundup_power2_divisions:[>:16]", "roundup_power2_divisions:[>:2,64:8]",
            "per_process_memory_fraction:0.5,large_segment_size_mb:64",
            "release_lock_on_cudamalloc:True,pinned_num_register_threads:8", "max_split_size_mb:200,roundup_power2_divisions:2"]
    bad = ["max_split_size_mb:10", "foo:1", "expandable_segments:yes", "roundup_power2_divisions:3",
           "garbage_collection_threshold:1.5", "large_segment_size_mb:8",
           "per_process_memory_fraction:1.5", "max_non_split_rounding_mb:10",
           "expandable_segments:True,,max_split_size_mb:30", "roundup_power2_divisions:[256:3]",
           "roundup_power2_divisions:[300:2]"]
    torch_says = call(torch_oracle, good + bad)
    for conf in good:
        assert parse_alloc_conf(conf)["roundup_power2_divisions"] == torch_says[conf], conf
    for conf in bad:
        assert str(torch_says[conf]).startswith("error:"), conf
        with pytest.raises(rs.RidgescopeError):
            parse_alloc_conf(conf)
