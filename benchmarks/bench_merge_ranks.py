"""Merging the traces of many ranks (`ridgescope report DIR`, docs/distributed.md): time and
memory, and how they grow with the number of ranks. Prints one JSON object on stdout.

Each configuration writes RANKS synthetic rank traces (benchmarks/synthetic_trace.py: identical
transformer-like steps) of EVENTS records each, with the `distributed` metadata a tracked rank
writes (rank, world size, host, backend); one straggler rank trains a larger model for twice as
many events. The merge runs in a fresh child process per configuration, so its peak resident
memory (`ru_maxrss`) is that configuration's alone. Writing the traces is not timed.

    python benchmarks/bench_merge_ranks.py                      # 64 x 1e5 with a straggler, and
                                                                # 16/64/256/1024 ranks x 1e4
    python benchmarks/bench_merge_ranks.py --config 64x100000 --config 1024x10000
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic_trace as st  # noqa: E402

METADATA = 12
DEFAULT_CONFIGS = ["64x100000", "16x10000", "64x10000", "256x10000", "1024x10000"]


def write_rank(path: Path, rank: int, world: int, events: int, straggler: bool) -> None:
    st.write_trace(path, events * (2 if straggler else 1), layers=8 if straggler else 6,
                   d_model=256, tokens=512)
    meta = {"rank": rank, "world_size": world, "local_rank": rank % 8, "host": f"node{rank // 8}",
            "backend": "nccl", "strategies": []}
    key = 1_000_000  # a string id the synthetic body never uses
    records = [st.record(st.STRING, st.varint(key) + b"distributed"),
               st.record(METADATA, st.varint(key) + json.dumps(meta).encode())]
    with open(path, "ab") as f:
        f.write(st.chunk(records))


def child(directory: str) -> None:
    """Runs in a fresh process: merge, then print the figures."""
    from ridgescope.distributed import merge_traces
    t0 = time.perf_counter()
    merged = merge_traces([directory])
    seconds = time.perf_counter() - t0
    s = merged["ranks"]
    print(json.dumps({
        "merge_s": round(seconds, 3),
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "merged_json_bytes": len(json.dumps(merged)),
        "merged": s["merged"], "highest_rank": s["highest"]["rank"],
        "over_lowest_bytes": s["highest"]["over_lowest_bytes"],
    }))


def baseline_rss() -> int:
    """Resident memory of a child that imports ridgescope and merges nothing."""
    code = ("import resource, ridgescope.distributed; "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    return int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                              text=True).stdout)


def run_config(ranks: int, events: int, workdir: Path) -> dict:
    d = workdir / f"{ranks}x{events}"
    d.mkdir()
    straggler = ranks // 2 + 1 if ranks > 1 else 0
    t0 = time.perf_counter()
    for r in range(ranks):
        write_rank(d / f"run.rank{r}.rstrace", r, ranks, events, r == straggler)
    written = time.perf_counter() - t0
    trace_bytes = sum(p.stat().st_size for p in d.iterdir())
    out = subprocess.run([sys.executable, __file__, "--child", str(d)], check=True,
                         capture_output=True, text=True).stdout
    result = json.loads(out)
    shutil.rmtree(d)
    ok = result["highest_rank"] == straggler and result["merged"] == ranks
    return {"ranks": ranks, "events_per_rank": events, "straggler_rank": straggler,
            "trace_bytes": trace_bytes, "write_s": round(written, 2),
            "merge_s_per_rank": round(result["merge_s"] / ranks, 5),
            "straggler_found": ok, **result}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", action="append", metavar="RANKSxEVENTS",
                    help=f"a configuration (repeatable; default {' '.join(DEFAULT_CONFIGS)})")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    configs = []
    for c in args.config or DEFAULT_CONFIGS:
        try:
            ranks, events = (int(x) for x in c.lower().split("x"))
        except ValueError:
            ap.error(f"--config {c!r}: expected RANKSxEVENTS, e.g. 64x100000")
        configs.append((ranks, events))
    import torch
    results = []
    with tempfile.TemporaryDirectory(prefix="rs-merge-") as tmp:
        for ranks, events in configs:
            print(f"merging {ranks} ranks x {events} events", file=sys.stderr)
            results.append(run_config(ranks, events, Path(tmp)))
    print(json.dumps({
        "benchmark": "merge_ranks",
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "torch": torch.__version__,
        "baseline_rss_bytes": baseline_rss(),
        "results": results,
    }, indent=2))
    return 0 if all(r["straggler_found"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
