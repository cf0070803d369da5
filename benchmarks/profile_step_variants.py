"""Where a tracked step's time goes, by thread and by function, against an untracked step in the
same process (docs/performance.md, "The default after the mallinfo budget").

Separate processes cannot be compared on a shared 2-vCPU machine: their untracked steps alone
differ by a third from one minute to the next. This runs the variants of
bench_tracking_pieces.py's TinyGPT step in alternating blocks inside ONE process under
``perf record -k mono`` (a software clock event: no hardware counters needed), writes each
block's CLOCK_MONOTONIC window, and attributes every sample to the variant whose window holds
it. The result is ms a step (samples / frequency / steps) per thread and per shared object or
symbol, for each variant: the differences between variants are what tracking costs, the same
noise falling on all of them. Threads that live for one block only (each session's recorder
writer) are summed as one row, "session threads".

    python benchmarks/profile_step_variants.py --threads 2 --blocks 12 \\
        --variants untracked,default,nosites --by symbol --top 25 --out out/profile.json

Variants: untracked; default (``rs.track(..., keep_steps=20)``: the flight recorder, sites
and the saved-tensor hook on); nosites (``stacks=None``); lifetime (``activations=False``);
nohost (``host_memory=False``); bare (the native session alone: the CPU allocator source, no
hooks or sites). Needs ``perf`` on PATH. Prints ONE JSON object (schema_version 1).
"""
from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from _emit import emit_json  # noqa: E402

SESSION_THREADS = "session threads"
VARIANTS = ("untracked", "default", "nosites", "lifetime", "nohost", "bare")


def child(threads: int, blocks: int, variants: list[str], windows_path: str, models: str) -> None:
    """The profiled process: alternating blocks of 3 untimed and 20 windowed steps a variant;
    ``models`` "shared": one model and optimizer for all of them, "separate": one each."""
    import torch
    torch.set_num_threads(threads)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_tracking_pieces as pieces
    import ridgescope as rs
    tmp = Path(tempfile.mkdtemp())

    def context(v: str, t: Any) -> Any:
        if v == "untracked":
            return contextlib.nullcontext()
        if v == "bare":
            return pieces.bare_session(tmp)
        kw: dict[str, Any] = {"keep_steps": 20}
        kw.update({"nosites": {"stacks": None}, "lifetime": {"activations": False},
                   "nohost": {"host_memory": False}}.get(v, {}))
        return rs.track(model=t.model, optimizer=t.optimizer, out=tmp / f"{v}.rstrace", **kw)

    shared = pieces.Trainer(8) if models == "shared" else None
    trainers = {v: shared or pieces.Trainer(8) for v in variants}
    for v in variants:
        with context(v, trainers[v]):
            for _ in range(3):
                trainers[v].step()
    windows = []
    for b in range(blocks):
        for v in (variants if b % 2 == 0 else variants[::-1]):
            t = trainers[v]
            with context(v, t):
                for _ in range(3):
                    t.step()
                start = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
                for _ in range(20):
                    t.step()
                windows.append((v, start, time.clock_gettime_ns(time.CLOCK_MONOTONIC), 20))
    Path(windows_path).write_text(json.dumps(windows))


def aggregate(perf_data: str, windows: list[list[Any]], by: str, frequency: int, top: int) -> dict[str, Any]:
    windows = sorted(windows, key=lambda w: w[1])
    starts = [w[1] for w in windows]
    steps: collections.Counter[str] = collections.Counter()
    for v, _, _, n in windows:
        steps[v] += n
    counts: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(collections.Counter)
    out = subprocess.run(["perf", "script", "-i", perf_data, "-F", "tid,time,ip,sym,dso", "--ns"],
                         capture_output=True, text=True, check=True).stdout
    samples = []
    blocks_of: dict[str, set[int]] = collections.defaultdict(set)  # tid -> the windows it ran in
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 4:
            continue
        try:
            t = int(round(float(parts[1].rstrip(":")) * 1e9))
        except ValueError:
            continue
        i = bisect.bisect_right(starts, t) - 1
        if i < 0 or t > windows[i][2]:
            continue
        sym, _, dso = parts[3].rpartition(" (")
        dso = dso.rstrip(")").split("/")[-1]
        samples.append((parts[0], windows[i][0], dso if by == "dso" else f"{dso} {sym.strip()}"))
        blocks_of[parts[0]].add(i)
    # A thread seen in one window only lives for one session (the recorder's writer, a session's
    # own helpers): each session has its own, so they are summed as one row, "session threads".
    for tid, v, key in samples:
        counts[(tid if len(blocks_of[tid]) > 1 else SESSION_THREADS, v)][key] += 1
    threads: dict[str, Any] = {}
    variants = sorted(steps)
    for tid in sorted({tid for tid, _ in counts}):
        keys: collections.Counter[str] = collections.Counter()
        for v in variants:
            keys.update(counts[(tid, v)])
        per = {v: sum(counts[(tid, v)].values()) / frequency / steps[v] * 1e3 for v in variants}
        if max(per.values()) < 0.05:
            continue  # a thread idle in every window (a stopped session's writer)
        rows = []
        for k in keys:
            ms = {v: round(counts[(tid, v)][k] / frequency / steps[v] * 1e3, 3) for v in variants}
            rows.append({"name": k, "ms_per_step": ms, "spread_ms": round(max(ms.values()) - min(ms.values()), 3)})
        rows.sort(key=lambda r: -r["spread_ms"])
        threads[tid] = {"ms_per_step": {v: round(x, 3) for v, x in per.items()}, "top": rows[:top]}
    return {"steps": dict(steps), "threads": threads}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=10, help="alternating blocks per variant")
    ap.add_argument("--variants", default="untracked,default")
    ap.add_argument("--by", choices=("dso", "symbol"), default="dso")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--frequency", type=int, default=4000, help="perf samples a second")
    ap.add_argument("--models", choices=("shared", "separate"), default="shared",
                    help="shared: every variant trains the same model and optimizer (as "
                         "bench_training_step.py); separate: each its own, built from the same seed")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if args.child:
        child(args.threads, args.blocks, variants, args.child, args.models)
        return 0
    if shutil.which("perf") is None:
        print("profile_step_variants.py needs `perf` on PATH (Debian: linux-perf)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d:
        data, windows = os.path.join(d, "perf.data"), os.path.join(d, "windows.json")
        subprocess.run(["perf", "record", "-q", "-k", "mono", "-F", str(args.frequency), "-o", data, "--",
                        sys.executable, __file__, "--child", windows, "--threads", str(args.threads),
                        "--blocks", str(args.blocks), "--variants", args.variants,
                        "--models", args.models],
                       check=True, stdout=subprocess.DEVNULL)
        result = aggregate(data, json.loads(Path(windows).read_text()), args.by, args.frequency, args.top)
    out = {"schema_version": 1, "benchmark": "profile_step_variants", "date": time.strftime("%Y-%m-%d"),
           "torch_threads": args.threads, "blocks": args.blocks, "by": args.by,
           "models": args.models, **result}
    emit_json(out, args.out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
