"""Specification of the host's three layers (docs/forensics.md, "Host memory: the three layers"):
when tracking starts, at the end of every phase (the first 32, then under a time budget that
never skips a new high of torch's live CPU bytes) and when it stops, the process's
resident set (/proc/self/status) = PyTorch's live CPU
blocks (their resident pages, mincore) + the C allocator's slack (glibc's mallinfo2) + everything
else, itemised (files and libraries, shared memory, other heap users, a named remainder).

The truth comes from outside ridgescope: numpy and bytearray objects of known sizes, torch's own
storage sizes, and the kernel's figures read by the test itself."""
from __future__ import annotations

import ctypes
import mmap
import struct
import sys

import numpy as np
import pytest
import torch

import ridgescope as rs
from ridgescope import _C

from fork_server import call

MiB = 1 << 20
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and mincore are Linux's")


def status_bytes(key: str) -> int:
    """A line of this process's /proc/self/status (VmRSS, RssFile, ...), read here and not by
    ridgescope."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/self/status")


def resident_set() -> int:
    """VmRSS of this process."""
    return status_bytes("VmRSS")


def end_of(rows: list[dict], phase: str) -> dict:
    """The reading at the end of a phase (each phase is read at its end)."""
    mine = [r for r in rows if r["phase"] == phase]
    assert len(mine) == 1, f"{phase}: {len(mine)} readings"
    return mine[0]


def three_phases(folder: str) -> dict:
    """Given a script that holds a 64 MiB numpy array and a 16 MiB bytearray outside torch, and
    a 32 MiB torch tensor, each made in a phase of its own: its host readings, the resident set
    the kernel gave right after each phase, and the bytes of what it made."""
    rss_after: dict[str, int] = {}
    with rs.track(out=f"{folder}/run.rstrace") as session:
        with rs.phase("before"):
            warm = torch.ones(1024)
        rss_after["before"] = resident_set()
        with rs.phase("outside"):
            array = np.ones(64 * MiB // 8)      # float64: 64 MiB, every page written
            blob = bytearray(16 * MiB)          # zero-filled by CPython: every page written
        rss_after["outside"] = resident_set()
        with rs.phase("inside"):
            tensor = torch.ones(8 * MiB)        # float32: 32 MiB
        rss_after["inside"] = resident_set()
    del warm
    return {"host_memory": session.report().to_dict()["host_memory"], "rss_after": rss_after,
            "held": array.nbytes + len(blob), "tensor_bytes": tensor.untyped_storage().nbytes()}


@linux
def test_memory_outside_pytorch_is_in_the_outside_layer_and_the_layers_sum_to_the_resident_set(tmp_path):
    # Given the three phases run in a process of their own (forked from the fork server,
    # tests/python/fork_server.py, with no thread but its main one: in a pytest worker a thread
    # another test left running can allocate outside PyTorch during a phase; seen once, 8 MiB),
    run = call(three_phases, str(tmp_path))
    rss_after, held, h = run["rss_after"], run["held"], run["host_memory"]
    rows = h["rows"]
    before, outside, inside = (end_of(rows, p) for p in ("before", "outside", "inside"))

    # then the numpy array and the bytearray are in the outside-PyTorch layer (within 2 MiB),
    assert abs((outside["outside_bytes"] - before["outside_bytes"]) - held) <= 2 * MiB
    # itemised as other heap users (glibc's bytes in use beyond torch's blocks),
    assert abs((outside["outside"]["other_heap_bytes"] - before["outside"]["other_heap_bytes"]) - held) <= 2 * MiB
    # and not in PyTorch's layer,
    assert abs(outside["pytorch_bytes"] - before["pytorch_bytes"]) <= 1 * MiB
    # while the tensor is PyTorch's, to the byte of its storage, and not outside.
    assert inside["pytorch_bytes"] - outside["pytorch_bytes"] == run["tensor_bytes"]
    assert inside["torch_live_bytes"] - outside["torch_live_bytes"] == run["tensor_bytes"]
    assert abs(inside["outside_bytes"] - outside["outside_bytes"]) <= 2 * MiB

    # At every reading the three layers sum to the resident set, and everything else to its items;
    for r in rows:
        assert r["pytorch_bytes"] + r["allocator_slack_bytes"] + r["outside_bytes"] == r["resident_bytes"]
        o = r["outside"]
        assert (o["files_bytes"] + o["shared_memory_bytes"] + o["other_heap_bytes"] + o["remainder_bytes"]
                == r["outside_bytes"])
        assert r["residency_measured"] and r["split_known"] and r["malloc_known"]
        assert not r["malloc_misses_torch"]
    # and that resident set is the one the kernel gives the test right after each phase (1 %).
    for phase, rss in rss_after.items():
        assert abs(end_of(rows, phase)["resident_bytes"] - rss) <= rss / 100, phase
    assert h["samples"] == len(rows) == 5  # when tracking starts, at each phase's end, when it stops
    assert rows[0]["phase"] == rows[-1]["phase"] == "idle"


@linux
def test_file_pages_mapped_in_a_phase_are_in_the_files_layer_of_its_reading(tmp_path):
    # Given a phase that maps a 24 MiB file and reads every page of it (file-backed resident
    # pages: the part of the resident set the source reads from /proc/self/status again when
    # statm's shared pages moved), between phases that map nothing,
    path = tmp_path / "pages.bin"
    path.write_bytes(b"\1" * (24 * MiB))
    files_after: dict[str, int] = {}
    with rs.track(out=tmp_path / "run.rstrace") as session:
        with rs.phase("before"):
            warm = torch.ones(1024)
        files_after["before"] = status_bytes("RssFile")
        with rs.phase("mapped"):
            with open(path, "rb") as f:
                view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            touched = sum(view[i] for i in range(0, len(view), mmap.PAGESIZE))
        files_after["mapped"] = status_bytes("RssFile")
        with rs.phase("after"):
            warm2 = torch.ones(1024)
        files_after["after"] = status_bytes("RssFile")
    rows = session.report().to_dict()["host_memory"]["rows"]
    assert touched == len(view) // mmap.PAGESIZE
    # then each reading's files layer is the kernel's RssFile right after its phase (1 MiB: the
    # test's own reads of /proc), and the mapped phase's grew by the 24 MiB file.
    for phase, rss_file in files_after.items():
        assert abs(end_of(rows, phase)["outside"]["files_bytes"] - rss_file) <= 1 * MiB, phase
    grown = end_of(rows, "mapped")["outside"]["files_bytes"] - end_of(rows, "before")["outside"]["files_bytes"]
    assert abs(grown - 24 * MiB) <= 1 * MiB
    view.close()
    del warm, warm2


def resident_bytes(addr: int, nbytes: int) -> int | None:
    """The kernel's resident (or swapped) bytes of the pages [addr, addr + nbytes) touches, read
    page by page from /proc/self/pagemap (bit 63: present, bit 62: swapped; readable without
    privilege); None when the file cannot be read."""
    page = mmap.PAGESIZE
    first, last = addr // page, (addr + nbytes - 1) // page
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(first * 8)
            data = f.read((last - first + 1) * 8)
    except OSError:
        return None
    return page * sum(1 for (entry,) in struct.iter_unpack("<Q", data) if entry >> 62 & 3)


@linux
def test_live_bytes_never_written_are_not_resident(tmp_path):
    # Given a 256 MiB tensor allocated and never written (torch.empty: glibc maps it by itself
    # and the kernel backs no page until it is written),
    with rs.track(out=tmp_path / "run.rstrace") as session:
        with rs.phase("empty"):
            t = torch.empty(64 * MiB)  # float32: 256 MiB
        kernel = resident_bytes(t.data_ptr(), t.untyped_storage().nbytes())
    if kernel is None:
        pytest.skip("/proc/self/pagemap cannot be read here")
    rows = session.report().to_dict()["host_memory"]["rows"]
    begin, end = rows[0], end_of(rows, "empty")  # when tracking started, at the phase's end
    nbytes = t.untyped_storage().nbytes()
    # then its bytes are live but not resident, but for what the kernel backs: ridgescope's
    # PyTorch layer grew by what the kernel says is resident of the block's pages (one page: the
    # page that holds malloc's header and the block's first bytes); the rest is "untouched".
    # (The kernel's figure is read page by page: a mapping of its own may have been merged with
    # a neighbouring anonymous one, whose smaps line then covers both.)
    assert end["torch_live_bytes"] - begin["torch_live_bytes"] == nbytes
    grew = end["pytorch_bytes"] - begin["pytorch_bytes"]
    assert abs(grew - kernel) <= mmap.PAGESIZE
    assert end["untouched_bytes"] - begin["untouched_bytes"] == nbytes - grew
    assert grew <= 2 * mmap.PAGESIZE


@linux
def test_resident_part_counts_each_blocks_own_bytes_of_its_resident_pages():
    page = mmap.PAGESIZE
    buf = mmap.mmap(-1, 16 * page)  # anonymous: no page is resident until written
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    try:
        for p in (1, 2, 9):
            buf[p * page] = 1
        # a block over the whole mapping holds three resident pages;
        assert _C._resident_part([(addr, 16 * page)]) == 3 * page
        # two blocks sharing page 1 each count only their own bytes of it;
        assert _C._resident_part([(addr + page, page // 2), (addr + page + page // 2, page // 2)]) == page
        # a block in never-written pages has none.
        assert _C._resident_part([(addr + 3 * page, 5 * page)]) == 0
    finally:
        del addr
        buf.close()


def test_host_memory_can_be_switched_off(tmp_path):
    with rs.track(out=tmp_path / "run.rstrace", host_memory=False) as session:
        with rs.phase("p"):
            torch.ones(16)
    assert session.report().to_dict()["host_memory"] is None


@linux
def test_the_text_report_shows_the_three_layers(tmp_path):
    with rs.track(out=tmp_path / "run.rstrace") as session:
        with rs.phase("p"):
            x = torch.ones(1 << 16)
    text = session.report().summary()
    assert "Host memory at its highest" in text
    assert "= PyTorch's live CPU blocks" in text
    assert "+ the C allocator's slack" in text
    assert "+ everything else" in text and "remainder" in text
    del x


def tiny_phases(folder, phases: int, spike_at: int | None = None) -> dict:
    """Given a heap with many free chunks (mallinfo2 walks each one, so that its own budget binds
    at once) and a session of `phases` phases a few microseconds long, far more readings than
    their time budget can pay for (each costs at least the 1-2 us of a /proc/self/statm read, a
    phase little more); in
    phase `spike_at` (named "spike") a 16 MiB tensor made and freed: a new high of torch's live
    CPU bytes. Returns the report's host_memory and its summary text."""
    held = [bytearray(700) for _ in range(80000)]
    del held[::2]  # 40,000 free chunks between live ones: mallinfo2 ~140 us, most of a reading
    with rs.track(out=f"{folder}/run.rstrace") as session:
        for i in range(phases):
            with rs.phase("spike" if i == spike_at else "tiny"):
                if i == spike_at:
                    spike = torch.ones(4 * MiB)  # float32: 16 MiB
                    del spike
    del held
    report = session.report()
    return {"host_memory": report.to_dict()["host_memory"], "summary": report.summary()}


@linux
def test_phase_ends_are_read_under_a_time_budget_that_never_skips_a_new_high(tmp_path):
    h = call(tiny_phases, str(tmp_path), 5000, 4000)
    host = h["host_memory"]
    # then every phase end is read or counted as skipped, with the reading when tracking starts
    # always there (the report lists the first 1,000 readings),
    assert host["samples"] + host["readings_skipped"] == 5002
    assert host["readings_skipped"] > 0
    assert host["rows"][0]["phase"] == "idle" and host["samples"] >= 3
    assert len(host["rows"]) == min(host["samples"], 1000)
    # the phase that reached a new high of torch's live CPU bytes is read though the budget is
    # spent, and it is the reading shown for the report's peak,
    assert host["at_peak"]["phase"] == "spike"
    # and the text report says how many phase ends were read, and why not all.
    assert host["phase_end_readings"] == host["samples"] - 2  # all but tracking's start and stop
    assert f"Read at {host['phase_end_readings']:,} of 5,000 phase ends" in h["summary"]
    assert h["host_memory"]["reading_share"] == 0.001
    assert "under 0.10% of the run's time" in h["summary"]


@linux
def test_glibc_counters_are_read_under_a_time_budget_and_carried_between(tmp_path):
    # Given such a session of 600 phases (mallinfo2's budget binds within the first 32 phase ends,
    # all read; at most 602 readings, so the report lists them all, the one at the stop last),
    h = call(tiny_phases, str(tmp_path), 600)
    rows = h["host_memory"]["rows"]
    assert h["host_memory"]["rows_dropped"] == 0
    times = {r["time_ns"] for r in rows}
    own = [r for r in rows if r["malloc_time_ns"] == r["time_ns"]]
    carried = [r for r in rows if r["malloc_time_ns"] != r["time_ns"]]
    # then the readings when tracking starts and stops read glibc's counters themselves,
    assert rows[0] in own and rows[-1] in own
    # some readings carry them from an earlier reading of the session, named by its time,
    assert carried
    assert all(r["malloc_known"] and r["malloc_time_ns"] in times and r["malloc_time_ns"] < r["time_ns"]
               for r in carried)
    # and a carried row keeps that reading's bytes in use exactly: its other heap users are
    # those bytes less torch's live blocks now.
    by_time = {r["time_ns"]: r for r in rows}
    for r in carried:
        source = by_time[r["malloc_time_ns"]]
        assert not r["malloc_misses_torch"]
        assert (r["outside"]["other_heap_bytes"] + r["torch_live_bytes"]
                == source["outside"]["other_heap_bytes"] + source["torch_live_bytes"])
