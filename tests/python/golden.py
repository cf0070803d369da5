"""The golden report: a fixed trace and what ridgescope makes of it, committed under tests/data,
so that every change to what users read shows up as a diff in review.

    .venv/bin/python tests/python/golden.py --update    # rewrite tests/data/golden_run.*
    .venv/bin/python tests/python/golden.py             # check (what test_golden_report.py does)

The trace (tests/data/golden_run.rstrace) is written event by event through ``_C.TraceWriter``
from the script below, with no torch op and no clock: the same bytes on every machine. It
describes three training steps of a three-layer MLP with AdamW on one CUDA device of 64 MiB:
the parameters, the cuBLAS workspace, the activations (tagged weakly, per module), the
gradients, the optimizer state created in the first step, temporaries in every phase, the
caching allocator's segments (a small first-fit allocator below places the blocks), and a
fourth step whose forward fails with an out-of-memory error. The texts are its
``Report.summary()`` (tests/data/golden_run.txt) and its report JSON
(tests/data/golden_run.json, with the trace's path written as ``golden_run.rstrace``).
"""
from __future__ import annotations

import argparse
import difflib
import json
import sys
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"
TRACE, TEXT, JSON = (DATA / f"golden_run.{ext}" for ext in ("rstrace", "txt", "json"))

KiB, MiB = 1 << 10, 1 << 20
CAPACITY = 64 * MiB
SMALL_SEGMENT, LARGE_SEGMENT = 2 * MiB, 20 * MiB  # torch's kSmallBuffer, kLargeBuffer
BASE = 0x7F0000000000

# name, bytes (float32): a 512 -> 1024 -> 1024 -> 10 MLP
PARAMETERS = [("fc1.weight", 512 * 1024 * 4), ("fc1.bias", 1024 * 4),
              ("fc2.weight", 1024 * 1024 * 4), ("fc2.bias", 1024 * 4),
              ("head.weight", 10 * 1024 * 4), ("head.bias", 10 * 4)]
BATCH = 256
ACTIVATIONS = [("fc1", BATCH * 1024 * 4), ("relu", BATCH * 1024 * 4), ("fc2", BATCH * 1024 * 4),
               ("head", BATCH * 10 * 4)]
WORKSPACE = 2 * 4096 * KiB + 8 * 16 * KiB  # cuBLAS's default (before Hopper)


def _round(n: int) -> int:
    """The caching allocator's block size for a request (512-byte multiples; 2 MiB above
    10 MiB are left to the segment)."""
    return max(512, -(-n // 512) * 512)


class _Allocator:
    """First fit over the segments of two pools (small: blocks up to 1 MiB in 2 MiB segments;
    large: 20 MiB segments, or the block rounded to 2 MiB when larger), as the caching allocator
    would place them; writes segment_alloc events as it grows."""

    def __init__(self, emit) -> None:
        self.emit = emit
        self.segments: list[list] = []  # [address, size, small, {address: size}]
        self.next_address = BASE

    def malloc(self, size: int) -> int:
        small = size <= MiB
        for seg in self.segments:
            if seg[2] != small:
                continue
            cursor = seg[0]
            for addr in sorted(seg[3]):
                if addr - cursor >= size:
                    break
                cursor = addr + seg[3][addr]
            if seg[0] + seg[1] - cursor >= size:
                seg[3][cursor] = size
                return cursor
        seg_size = SMALL_SEGMENT if small else max(LARGE_SEGMENT, -(-size // (2 * MiB)) * 2 * MiB)
        seg = [self.next_address, seg_size, small, {self.next_address: size}]
        self.next_address += seg_size
        self.segments.append(seg)
        self.emit("segment_alloc", addr=seg[0], bytes=seg_size)
        return seg[0]

    def free(self, addr: int) -> None:
        for seg in self.segments:
            if addr in seg[3]:
                del seg[3][addr]
                return
        raise KeyError(hex(addr))


def write_trace(path: Path) -> None:
    """Writes the golden run's trace to ``path``."""
    from ridgescope import _C

    w = _C.TraceWriter(str(path))
    clock = [0]
    events = [0]

    def emit(kind: str, **kw) -> None:
        clock[0] += 1000
        events[0] += 1
        w.event(kind, clock[0], cuda=True, **kw)

    alloc = _Allocator(emit)
    live: dict[str, int] = {}  # key -> address
    live_bytes = [0]

    def new(key: str, requested: int, category: str, label: str, weak: bool = False) -> None:
        block = _round(requested)
        addr = alloc.malloc(block)
        live[key] = addr
        live_bytes[0] += block
        emit("alloc", addr=addr, bytes=block, requested_bytes=requested)
        emit("tag", addr=addr, category=category, string_id=w.intern(label), weak=weak)

    def free(key: str) -> None:
        addr = live.pop(key)
        block = next(seg[3][addr] for seg in alloc.segments if addr in seg[3])
        alloc.free(addr)
        live_bytes[0] -= block
        emit("free", addr=addr, bytes=block)

    phases = {name: w.intern(name) for name in ("zero_grad", "forward", "backward", "optimizer_step")}
    run = {
        "ridgescope_version": "golden", "torch_version": "golden", "python_version": "golden",
        "argv": ["tests/python/golden.py"], "device_capacity_bytes": CAPACITY,
        "model": {"class": "MLP", "parameters": sum(b for _, b in PARAMETERS) // 4,
                  "parameter_tensors": len(PARAMETERS),
                  "trainable_parameters": sum(b for _, b in PARAMETERS) // 4,
                  "trainable_parameter_tensors": len(PARAMETERS),
                  "parameter_bytes": sum(_round(b) for _, b in PARAMETERS),
                  "trainable_parameter_bytes": sum(_round(b) for _, b in PARAMETERS),
                  "dtypes": {"float32": len(PARAMETERS)}, "devices": ["cuda:0"], "buffers": 0,
                  "buffer_bytes": 0},
        "optimizer": {"type": "AdamW", "states_per_parameter": 3,
                      "state_keys": ["step", "exp_avg", "exp_avg_sq"],
                      "hyperparameters": {"lr": 0.001, "weight_decay": 0.01},
                      "param_groups": 1},
    }
    w.metadata("run", json.dumps(run, sort_keys=True))
    live_name = w.intern("allocator_live_bytes")
    for name, nbytes in PARAMETERS:
        new(f"param {name}", nbytes, "parameter", name)
    emit("sample", string_id=live_name, value=live_bytes[0])  # the allocator's own count
    for step in range(4):
        emit("phase_begin", string_id=phases["zero_grad"])
        for name, _ in PARAMETERS:
            if f"grad {name}" in live:
                free(f"grad {name}")
        emit("phase_end", string_id=phases["zero_grad"])
        emit("phase_begin", string_id=phases["forward"])
        new(f"input {step}", BATCH * 512 * 4, "input", "batch")
        if step == 0:
            new("workspace", WORKSPACE, "workspace", "cuBLAS workspace (main thread)")
        if step == 3:  # a batch 64 times larger does not fit
            emit("oom", bytes=4 * BATCH * 1024 * 4 * 16, value=CAPACITY - 40 * MiB)
            emit("phase_end", string_id=phases["forward"])
            break
        for module, nbytes in ACTIVATIONS:
            new(f"act {module}", nbytes, "activation", f"activation of {module}", weak=True)
            new(f"tmp {module}", nbytes // 2, "temporary", f"temporary in {module}")
            free(f"tmp {module}")
        emit("phase_end", string_id=phases["forward"])
        emit("phase_begin", string_id=phases["backward"])
        for (module, _), (name_w, bytes_w), (name_b, bytes_b) in zip(
                reversed(ACTIVATIONS[::2] + ACTIVATIONS[3:]), reversed(PARAMETERS[0::2]),
                reversed(PARAMETERS[1::2])):
            new("grad input", BATCH * 1024 * 4, "temporary", f"gradient flowing into {module}")
            new(f"grad {name_w}", bytes_w, "gradient", f"grad of {name_w}")
            new(f"grad {name_b}", bytes_b, "gradient", f"grad of {name_b}")
            free("grad input")
        for module, _ in ACTIVATIONS:
            free(f"act {module}")
        free(f"input {step}")
        emit("phase_end", string_id=phases["backward"])
        emit("phase_begin", string_id=phases["optimizer_step"])
        for name, nbytes in PARAMETERS:
            if step == 0:
                new(f"step {name}", 4, "optimizer_state", f"step of {name}")
                new(f"exp_avg {name}", nbytes, "optimizer_state", f"exp_avg of {name}")
                new(f"exp_avg_sq {name}", nbytes, "optimizer_state", f"exp_avg_sq of {name}")
        new("update", max(b for _, b in PARAMETERS), "temporary", "optimizer update")
        free("update")
        emit("phase_end", string_id=phases["optimizer_step"])
        emit("step", value=step)  # step `step` (from 0) completed
        emit("sample", string_id=live_name, value=live_bytes[0])
    w.metadata("session", json.dumps({"events": events[0], "dropped_events": 0, "bytes_written": 0,
                                      "chunks_written": 0, "buffer_bytes_peak": 0}))
    w.close()
    if w.failed:
        raise RuntimeError(f"could not write {path}: {w.error}")


def render(trace: Path) -> tuple[str, str]:
    """The text report and the report JSON of ``trace`` (its path written as its file name)."""
    import ridgescope as rs

    data = rs.load(trace).to_dict()
    data["trace"]["path"] = trace.name
    return rs.Report(data).summary(), json.dumps(data, indent=1, sort_keys=True) + "\n"


def expected() -> dict[Path, bytes]:
    """What the three files should hold, from the generator and the current ridgescope."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / TRACE.name
        write_trace(trace)
        text, data = render(trace)
        return {TRACE: trace.read_bytes(), TEXT: text.encode(), JSON: data.encode()}


def differences() -> list[str]:
    """A unified diff (or a note, for the binary trace) per file that differs."""
    out = []
    for path, want in expected().items():
        have = path.read_bytes() if path.exists() else b""
        if have == want:
            continue
        if path.suffix == ".rstrace":
            out.append(f"{path.name}: the generator writes {len(want)} bytes, the committed file "
                       f"has {len(have)} (different bytes)")
        else:
            out.append("".join(difflib.unified_diff(
                have.decode().splitlines(True), want.decode().splitlines(True),
                f"{path.name} (committed)", f"{path.name} (now)")))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="rewrite the files in tests/data")
    args = parser.parse_args(argv)
    if args.update:
        DATA.mkdir(parents=True, exist_ok=True)
        for path, content in expected().items():
            path.write_bytes(content)
            print(f"wrote {path.relative_to(DATA.parent.parent)} ({len(content)} bytes)")
        return 0
    diffs = differences()
    print("\n".join(diffs) if diffs else "the golden files are up to date")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
