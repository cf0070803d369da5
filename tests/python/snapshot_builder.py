"""Hand-built torch memory snapshots, in the layout ``torch.cuda.memory._snapshot()`` returns
(torch 2.14: segments with blocks, one trace list per device, allocator_settings,
external_annotations), for the specifications of the snapshot inference and device choice.

The builder keeps the snapshot consistent the way the allocator is: every block lives in a
segment, the segments' blocks tile them (live blocks and inactive gaps), and the end state in
``segments`` is what the trace leaves (unless a test asks otherwise). Block sizes are multiples
of 512 below 1 MiB (small pool), so a block's bytes are exactly its requested size; large blocks
get a segment of their own."""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Iterable, Sequence

SMALL_SEGMENT = 2 * 1024 * 1024
T0 = 1_700_000_000_000_000  # microseconds

Frames = Sequence[tuple[str, str]]  # (file, function), innermost first

USER = (("train.py", "main"),)
FORWARD = (("torch/nn/functional.py", "linear"), ("torch/nn/modules/linear.py", "forward"),
           ("torch/nn/modules/module.py", "_call_impl"), ("model.py", "forward"),
           ("torch/nn/modules/module.py", "_call_impl"), ("train.py", "main"))
BACKWARD = (("torch/autograd/graph.py", "_engine_run_backward"), ("torch/_tensor.py", "backward"),
            ("train.py", "main"))


def frames(fs: Frames) -> list[dict]:
    site = "/usr/lib/python3.11/site-packages/"
    out = []
    for i, (file, name) in enumerate(fs):
        path = file if not file.startswith("torch/") else site + file
        out.append({"filename": path, "line": 10 + i if file.endswith(".py") else 0, "name": name})
    return out


class SnapshotBuilder:
    """Entries are appended in order, 10 µs apart. ``begin``/``end`` mark a phase with a
    record_function annotation (``forward``, ``backward``, ``optimizer_step``, ``zero_grad`` or
    torch.optim's ``Optimizer.step#SGD.step``), which decides the phase exactly."""

    def __init__(self, device: int = 0, traces: int | None = None) -> None:
        self.device = device
        self.traces = traces if traces is not None else device + 1
        self.t = T0
        self.entries: list[dict] = []
        self.annotations: list[dict] = []
        self.segments: list[dict] = [self._segment(0x7F00_0000_0000 + device * 0x1_0000_0000, SMALL_SEGMENT)]
        self.blocks: dict[int, dict] = {}  # addr -> live block (end state)
        self.next_small = self.segments[0]["address"]

    @staticmethod
    def _segment(address: int, size: int) -> dict:
        return {"address": address, "total_size": size, "blocks": []}

    def _place(self, size: int) -> int:
        if size % 512 == 0 and size < 1024 * 1024:
            addr = self.next_small
            self.next_small += size
            if self.next_small > self.segments[0]["address"] + SMALL_SEGMENT:
                raise ValueError("the test's small segment is full")
            return addr
        last = max(s["address"] + s["total_size"] for s in self.segments)
        seg = self._segment(last + 2 * 1024 * 1024, -(-size // (2 * 1024 * 1024)) * 2 * 1024 * 1024)
        self.segments.append(seg)
        return seg["address"]

    def _entry(self, action: str, addr: int, size: int, fs: "Frames | list[dict]", **extra) -> dict:
        listed = fs if isinstance(fs, list) else frames(fs)
        e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": self.t,
             "compile_context": "N/A", "user_metadata": "", "frames": listed, **extra}
        self.t += 10
        self.entries.append(e)
        return e

    def pre(self, size: int, fs: Frames = ()) -> int:
        """A block that existed before the first entry (the segments hold it; no trace entry)."""
        addr = self._place(size)
        self.blocks[addr] = {"size": size, "requested_size": size, "frames": frames(fs)}
        return addr

    def alloc(self, size: int, fs: Frames = USER, **extra) -> int:
        addr = self._place(size)
        listed = frames(fs)  # one list for the entry and the block, as torch shares it
        self._entry("alloc", addr, size, listed, **extra)
        self.blocks[addr] = {"size": size, "requested_size": size, "frames": listed}
        return addr

    def free(self, addr: int, fs: "Frames | None" = USER) -> None:
        """``fs``: the free's own stack (torch's default context="all"); None: the allocation's
        frames list itself, as torch writes a free under context="alloc"."""
        size = self.blocks[addr]["size"]
        if fs is None:
            fs = self.blocks[addr]["frames"]
        self._entry("free_requested", addr, size, fs)
        self._entry("free_completed", addr, size, fs)
        del self.blocks[addr]

    def begin(self, name: str) -> None:
        self.annotations.append({"name": name, "stage": "START", "device": self.device, "time_us": self.t})
        self.t += 10

    def end(self, name: str) -> None:
        self.annotations.append({"name": name, "stage": "END", "device": self.device, "time_us": self.t})
        self.t += 10

    def build(self) -> dict:
        segments = []
        for seg in self.segments:
            lo, hi = seg["address"], seg["address"] + seg["total_size"]
            live = sorted((a, b) for a, b in self.blocks.items() if lo <= a < hi)
            blocks, at = [], lo
            for addr, b in live:
                if addr > at:
                    blocks.append({"address": at, "size": addr - at, "requested_size": 0, "state": "inactive",
                                   "frames": []})
                blocks.append({"address": addr, "size": b["size"], "requested_size": b["requested_size"],
                               "state": "active_allocated", "frames": b["frames"]})
                at = addr + b["size"]
            if at < hi:
                blocks.append({"address": at, "size": hi - at, "requested_size": 0, "state": "inactive",
                               "frames": []})
            allocated = sum(b["size"] for _, b in live)
            segments.append({"device": self.device, "address": lo, "total_size": seg["total_size"],
                             "allocated_size": allocated, "active_size": allocated,
                             "requested_size": allocated, "stream": 0,
                             "segment_type": "small" if seg["total_size"] == SMALL_SEGMENT else "large",
                             "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                             "blocks": blocks})
        traces = [[] for _ in range(self.traces)]
        traces[self.device] = list(self.entries)
        return {"segments": segments, "device_traces": traces,
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                       "expandable_segments": False,
                                       "roundup_power2_divisions": {"1": 0, "2": 0}},
                "external_annotations": list(self.annotations)}

    def write(self, path: Path) -> Path:
        path.write_bytes(pickle.dumps(self.build()))
        return path


def merge(*snapshots: dict) -> dict:
    """One snapshot holding the devices of several (each built with its own ``device``)."""
    n = max(len(s["device_traces"]) for s in snapshots)
    traces: list[list] = [[] for _ in range(n)]
    for s in snapshots:
        for i, t in enumerate(s["device_traces"]):
            traces[i] += t
    return {"segments": [seg for s in snapshots for seg in s["segments"]], "device_traces": traces,
            "allocator_settings": snapshots[0]["allocator_settings"],
            "external_annotations": [a for s in snapshots for a in s["external_annotations"]]}


def decided(report: dict) -> dict[str, dict]:
    """Per rule: its category, how many blocks it decided, their bytes at the peak and at the end."""
    out: dict[str, dict] = {}
    for r in report["snapshot"]["reasons"]:
        cur = out.setdefault(r["rule"], {"category": r["category"], "allocations": 0, "peak_bytes": 0,
                                         "end_bytes": 0, "reasons": []})
        assert cur["category"] == r["category"] or r["rule"] in ("user_rule", "recorded", "repeated_step")
        cur["allocations"] += r["allocations"]
        cur["peak_bytes"] += r["peak_bytes"]
        cur["end_bytes"] += r["end_bytes"]
        cur["reasons"].append(r["reason"])
    return out


def rules_of(report: dict) -> set[str]:
    return set(decided(report))


def chain(*parts: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple(f for p in parts for f in p)
