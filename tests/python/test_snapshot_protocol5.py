"""Specification of reading pickle protocol 5, what Python 3.14's pickle.dump writes by default
(so torch's _dump_snapshot() there): the snapshots of ../shared/snapshots re-pickled with
protocol 5 give the same reports as the files torch wrote; protocol 5's out-of-band buffers are
refused by name; ridgescope's own export stays protocol 4 (memory_viz reads nothing newer)."""
from __future__ import annotations

import pickle
import pickletools

import pytest

import ridgescope as rs
from test_snapshot_corpus import CORPUS, FILES, PlainData


def same_report_fields(report: dict) -> dict:
    """The report less what names the file it was read from (its path, size and protocol)."""
    d = dict(report)
    d["trace"] = {k: v for k, v in d["trace"].items() if k not in ("path", "file_bytes")}
    d["snapshot"] = {k: v for k, v in d["snapshot"].items() if k != "protocol"}
    return d


@pytest.mark.skipif(not FILES, reason=f"the real-GPU snapshots are not here ({CORPUS} is absent)")
@pytest.mark.parametrize("name", FILES)
def test_a_corpus_snapshot_repickled_with_protocol_5_gives_the_same_report(name, tmp_path):
    with open(CORPUS / name, "rb") as f:
        snap = PlainData(f).load()
    p5 = tmp_path / "p5.pickle"
    p5.write_bytes(pickle.dumps(snap, protocol=5))
    assert pickletools.genops(p5.read_bytes()).__next__()[1] == 5  # PROTO 5
    original = rs.load(CORPUS / name).to_dict()
    again = rs.load(p5).to_dict()
    assert again["snapshot"]["protocol"] == 5
    assert same_report_fields(again) == same_report_fields(original)


def test_a_protocol_5_snapshot_with_bytes_and_sets_where_nothing_reads_them_loads(tmp_path):
    """Given a protocol-5 pickle of a small snapshot whose extra keys hold bytes, a bytearray, a
    set and a frozenset (plain data a snapshot does not need), when it is read, then the report
    is the one of the same snapshot without them."""
    snap = {"segments": [{"device": 0, "address": 0x1000, "total_size": 2 << 20, "allocated_size": 512,
                          "active_size": 512, "requested_size": 500, "stream": 0, "segment_type": "small",
                          "blocks": [{"address": 0x1000, "size": 512, "requested_size": 500,
                                      "state": "active_allocated", "frames": []},
                                     {"address": 0x1200, "size": (2 << 20) - 512, "requested_size": 0,
                                      "state": "inactive", "frames": []}]}],
            "device_traces": [[]]}
    plain, extra = tmp_path / "plain.pickle", tmp_path / "extra.pickle"
    plain.write_bytes(pickle.dumps(snap, protocol=5))
    extra.write_bytes(pickle.dumps({**snap, "blob": b"\x00\x01", "buf": bytearray(b"xy"), "tags": {"a", "b"},
                                    "frozen": frozenset({1})}, protocol=5))
    ops = {op.name for op, _, _ in pickletools.genops(extra.read_bytes())}
    assert {"SHORT_BINBYTES", "BYTEARRAY8", "EMPTY_SET", "ADDITEMS", "FROZENSET", "FRAME"} <= ops
    a, b = rs.load(plain).to_dict(), rs.load(extra).to_dict()
    assert b["totals"]["final_live_bytes"] == a["totals"]["final_live_bytes"] == 512
    assert same_report_fields(a) == same_report_fields(b)


@pytest.mark.parametrize("data,opcode", [
    (bytes([0x80, 5, 0x95, 7, 0, 0, 0, 0, 0, 0, 0]) + b"]\x94(\x97\x98e.", "NEXT_BUFFER"),
    (b"\x80\x05]\x98.", "READONLY_BUFFER"),
])
def test_an_out_of_band_buffer_is_refused_by_name(tmp_path, data, opcode):
    path = tmp_path / "buffer.pickle"
    path.write_bytes(data)
    with pytest.raises(rs.TraceFormatError,
                       match=f"refused: opcode {opcode} is one of pickle protocol 5's out-of-band buffers"):
        rs.load(path)


def test_pythons_own_out_of_band_pickle_is_refused_at_its_first_buffer(tmp_path):
    """pickle.dumps(..., protocol=5, buffer_callback=...) moves a PickleBuffer's data out of the
    file: the snapshot would be incomplete, and the reader says which opcode it met."""
    kept = []
    data = pickle.dumps({"segments": [], "device_traces": [[]], "blob": pickle.PickleBuffer(b"abc")},
                        protocol=5, buffer_callback=lambda b: kept.append(b) or False)
    assert kept  # out of band: the bytes are not in `data`
    path = tmp_path / "oob.pickle"
    path.write_bytes(data)
    with pytest.raises(rs.TraceFormatError, match="refused: opcode NEXT_BUFFER"):
        rs.load(path)
