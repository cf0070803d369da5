"""Replays a trace to the instants a distributed job recorded its strategy's own tensors at
(not a test file; tests/python/test_distributed.py and test_distributed_deepspeed.py use it).

A block's category at an instant is the analysis's: its latest strong tag before the instant
or, when none came yet, its first strong tag (a tag holds from the block's allocation on:
docs/categories.md). The comparison allows one thing: a buffer handed to a gloo collective is
freed when gloo's worker thread releases the collective's work, which can be a phase or two
after the strategy let go of it, so a comm_buffer the strategy no longer holds may still be live
at the instant; it must be freed later in the trace (nothing leaks)."""
from __future__ import annotations

from typing import Any

from ridgescope import _C

CATEGORIES = ("parameter", "optimizer_state", "gradient", "comm_buffer")


def boundaries(trace: str, ends: tuple[str, ...], begins: tuple[str, ...]) -> list[dict[str, Any]]:
    """At each end of a phase in ``ends`` and beginning of one in ``begins``, in order: the live
    blocks of each category as (address, bytes) and those of them freed later in the trace."""
    live: dict[int, dict[str, Any]] = {}
    found: list[tuple[str, int, list[dict[str, Any]]]] = []
    for e in _C.read_events(trace, 10_000_000):
        kind = e["kind"]
        if kind == "alloc":
            live[e["addr"]] = {"addr": e["addr"], "bytes": e["bytes"], "tags": [], "freed": None}
        elif kind == "free" and e["addr"] in live:
            live.pop(e["addr"])["freed"] = e["seq"]
        elif kind == "tag" and not e["weak"] and e["addr"] in live:
            live[e["addr"]]["tags"].append((e["seq"], e["category"]))
        elif (kind == "phase_end" and e["string"] in ends
              or kind == "phase_begin" and e["string"] in begins):
            found.append((e["string"], e["seq"], list(live.values())))
    out = []
    for where, seq, alive in found:
        by: dict[str, set[tuple[int, int]]] = {c: set() for c in CATEGORIES}
        transient: set[tuple[int, int]] = set()
        for b in alive:
            before = [c for s, c in b["tags"] if s < seq]
            category = before[-1] if before else (b["tags"][0][1] if b["tags"] else None)
            if category in by:
                by[category].add((b["addr"], b["bytes"]))
            if b["freed"] is not None:
                transient.add((b["addr"], b["bytes"]))
        out.append({"where": where, "blocks": by, "transient": transient})
    return out


def compare(trace: str, records: list[dict[str, Any]], ends: tuple[str, ...],
            begins: tuple[str, ...] = ()) -> None:
    """Asserts that at every recorded instant the blocks of each category are the job's record
    (``{"where", "step", <category>: [[address, bytes], ...]}``), address and bytes."""
    found = boundaries(trace, ends, begins)
    assert [b["where"] for b in found] == [r["where"] for r in records], trace
    for boundary, record in zip(found, records):
        at = (trace, record.get("step"), record["where"])
        for cat in CATEGORIES:
            truth, tagged = {tuple(b) for b in record[cat]}, boundary["blocks"][cat]
            if cat != "comm_buffer":
                assert tagged == truth, (*at, cat, sorted(tagged ^ truth))
            else:
                assert truth <= tagged, (*at, cat, sorted(truth - tagged))
                assert tagged - truth <= boundary["transient"], (*at, cat, sorted(tagged - truth))


def replaced_buckets(trace: str, label_prefix: str) -> dict[int, int]:
    """Bytes of DDP's first buckets still live at the end of each later backward, by step.

    DDP's reducer rebuilds its buckets in the second forward; gloo's worker thread may release
    the work of a first bucket's last allreduce (and with it the bucket) only after that. The
    first buckets are the blocks live at the end of the first backward whose latest tag label
    starts with ``label_prefix``; a block is the same block from its allocation to its free
    (an address reused later is another block). Asserts that each is freed later in the trace
    (nothing leaks)."""
    live: dict[int, dict[str, Any]] = {}
    first: list[dict[str, Any]] = []
    out: dict[int, int] = {}
    backward = 0
    for e in _C.read_events(trace, 10_000_000):
        kind = e["kind"]
        if kind == "alloc":
            live[e["addr"]] = {"addr": e["addr"], "bytes": e["bytes"], "label": "", "freed": False}
        elif kind == "free" and e["addr"] in live:
            live.pop(e["addr"])["freed"] = True
        elif kind == "tag" and not e["weak"] and e["addr"] in live:
            live[e["addr"]]["label"] = e["string"]
        elif kind == "phase_end" and e["string"] == "backward":
            if backward == 0:
                first = [b for b in live.values() if b["label"].startswith(label_prefix)]
            else:
                out[backward] = sum(b["bytes"] for b in first if live.get(b["addr"]) is b)
            backward += 1
    assert first, (trace, "no block labelled", label_prefix, "at the end of the first backward")
    assert all(b["freed"] for b in first), (trace, "a first DDP bucket is never freed")
    return out
