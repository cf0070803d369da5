"""A synthetic `.rstrace` of any number of events, written in pure Python from the format
specification (docs/trace_format.md), fast enough for 10^7 events.

The run it describes looks like training a transformer of ``layers`` layers on one device:
parameters and two Adam moments allocated up front, then identical steps of zero_grad (the
gradients freed), forward (activations saved, tagged weakly, and temporaries), backward (the
gradients allocated and tagged, temporaries, the activations freed) and optimizer_step
(temporaries). Every event is 1 us after the previous one. Because every step reuses the same
addresses and the same time deltas, one step's records are encoded once and repeated; only the
`step` record, which carries the step number, is encoded per step. The trace reads back through
the normal analysis like any recorded trace.

    python benchmarks/synthetic_trace.py OUT.rstrace --events 1000000
"""
from __future__ import annotations

import argparse
import struct
import sys
import zlib
from pathlib import Path

MAGIC = b"RIDGESCP"
VERSION = 1
CHUNK_MAGIC = 0x4B4E4843
ALLOC, FREE, TAG, PHASE_BEGIN, PHASE_END, STEP, STRING = 1, 2, 5, 6, 7, 8, 11
CATEGORY = {"parameter": 1, "gradient": 3, "optimizer_state": 4, "activation": 5}
TAG_WEAK = 1
TICK_NS = 1000
DEVICE = (0, 0)  # CPU: type 0, index + 1 = 0


def varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def zigzag(v: int) -> int:
    return ((v << 1) ^ (v >> 63)) & 0xFFFFFFFFFFFFFFFF


class Encoder:
    """Encodes records; times advance by TICK_NS per timed record."""

    def __init__(self) -> None:
        self.strings: dict[str, int] = {}
        self.pending_strings: list[bytes] = []

    def string(self, text: str) -> int:
        if text not in self.strings:
            sid = len(self.strings) + 1
            self.strings[text] = sid
            self.pending_strings.append(record(STRING, varint(sid) + text.encode()))
        return self.strings[text]

    @staticmethod
    def timed(kind: int, *fields: int) -> bytes:
        return record(kind, varint(zigzag(TICK_NS)) + b"".join(varint(f) for f in fields))

    def alloc(self, addr: int, size: int) -> bytes:
        return self.timed(ALLOC, *DEVICE, addr, size, size, 0, 1)

    def free(self, addr: int, size: int) -> bytes:
        return self.timed(FREE, *DEVICE, addr, size, 0, 1)

    def tag(self, addr: int, category: str, label: str, weak: bool = False) -> bytes:
        return self.timed(TAG, *DEVICE, addr, CATEGORY[category], TAG_WEAK if weak else 0, self.string(label))

    def begin(self, phase: str) -> bytes:
        return self.timed(PHASE_BEGIN, self.string(phase), 1)

    def end(self, phase: str) -> bytes:
        return self.timed(PHASE_END, self.string(phase), 1)


def record(kind: int, payload: bytes) -> bytes:
    return bytes([kind]) + varint(len(payload)) + payload


def chunk(records: list[bytes]) -> bytes:
    payload = b"".join(records)
    return struct.pack("<IIII", CHUNK_MAGIC, len(payload), len(records), zlib.crc32(payload)) + payload


def write_trace(path: str | Path, events: int, layers: int = 24, d_model: int = 1024,
                tokens: int = 2048) -> dict[str, int]:
    """Writes about ``events`` records (at least one whole step) and returns what was written."""
    enc = Encoder()
    param = d_model * d_model * 4 * 12        # bytes of one layer's weights (FP32, 12 d^2)
    act = tokens * d_model * 4                # one saved activation
    tmp = tokens * d_model * 4 * 4            # a temporary (the MLP's 4x width)
    addr = iter(range(0x7F0000000000, 0x7FFFFFFFFFFF, 0x10000000))
    params = [next(addr) for _ in range(layers)]
    moments = [(next(addr), next(addr)) for _ in range(layers)]
    grads = [next(addr) for _ in range(layers)]
    acts = [[next(addr) for _ in range(6)] for _ in range(layers)]
    temp = next(addr)

    prologue: list[bytes] = []
    for i in range(layers):
        prologue += [enc.alloc(params[i], param), enc.tag(params[i], "parameter", f"layers.{i}.weight")]
        for j, m in enumerate(moments[i]):
            key = ("exp_avg", "exp_avg_sq")[j]
            prologue += [enc.alloc(m, param), enc.tag(m, "optimizer_state", f"{key} of layers.{i}.weight")]
    zero_grad = [enc.free(g, param) for g in grads]  # before step 0 there are none to free
    step_records: list[bytes] = [enc.begin("forward")]
    for i in range(layers):
        for a in acts[i]:
            step_records += [enc.alloc(a, act), enc.tag(a, "activation", f"activation saved in layers.{i}", weak=True)]
        for _ in range(4):
            step_records += [enc.alloc(temp, tmp), enc.free(temp, tmp)]
    step_records.append(enc.end("forward"))
    step_records.append(enc.begin("backward"))
    for i in reversed(range(layers)):
        for _ in range(4):
            step_records += [enc.alloc(temp, tmp), enc.free(temp, tmp)]
        step_records += [enc.alloc(grads[i], param), enc.tag(grads[i], "gradient", f"grad of layers.{i}.weight")]
        step_records += [enc.free(a, act) for a in acts[i]]
    step_records.append(enc.end("backward"))
    step_records.append(enc.begin("optimizer_step"))
    for _ in range(layers):
        step_records += [enc.alloc(temp, tmp), enc.free(temp, tmp)]
    step_records.append(enc.end("optimizer_step"))

    first_body = [enc.begin("zero_grad"), enc.end("zero_grad")] + step_records
    step_records = [enc.begin("zero_grad")] + zero_grad + [enc.end("zero_grad")] + step_records
    per_step = len(step_records) + 1  # and the step record
    steps = max(1, (events - len(prologue)) // per_step)
    step_body = b"".join(step_records)
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<II", VERSION, 0))
        head = enc.pending_strings + prologue  # every string is interned by now
        f.write(chunk(head))
        written = len(head)
        f.write(chunk(first_body + [enc.timed(STEP, 0)]))
        written += len(first_body) + 1
        for n in range(1, steps):
            payload = step_body + enc.timed(STEP, n)
            f.write(struct.pack("<IIII", CHUNK_MAGIC, len(payload), len(step_records) + 1, zlib.crc32(payload)))
            f.write(payload)
            written += len(step_records) + 1
    return {"events": written, "steps": steps, "events_per_step": per_step, "layers": layers}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--layers", type=int, default=24)
    args = ap.parse_args(argv)
    info = write_trace(args.out, args.events, args.layers)
    print(info, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
