"""A long run under the flight recorder (docs/long-runs.md): 100,000 steps of a small model with
``keep_steps=20``, and what it costs.

Two parts, one JSON object on stdout (``--out FILE`` writes a copy):

  long_run   one session of ``--steps`` steps (default 100,000) of a 3-layer MLP with AdamW on
             the CPU, inside ``rs.track(..., keep_steps=--keep-steps)``; one larger batch at
             step ``--peak-step`` (the highest peak, far from the end). Measured: the trace's
             size (sampled every 1,000 steps, and at the end), the process's resident set size
             (VmRSS) at step 1,000 and at the end, the step time; then ``ridgescope report
             --format json`` on the trace in a fresh process: its wall time and the JSON's size,
             and whether the peak step was kept.
  control    the same schedule of steps untracked (``--no-control`` skips it): the RSS growth
             that is the workload's own. The peak step comes before step 1,000 by default: the
             first step of a new batch shape grows the heap of torch itself by a few MB
             (3.6 MB measured untracked with the peak at step 3,000), which is no growth of the
             recorder's.
  overhead   the same step, untracked, tracked with every step kept (``keep_steps="all"``) and
             bounded (``keep_steps=20``), interleaved: ``--rounds`` rounds of ``--round-steps``
             steps each, the order rotating, each tracked round its own session (long enough
             for a bounded one to rewrite its file). Ratios: the median over rounds of the
             round's median step time against the same round's untracked one, and bounded
             against full; the CPU time of the threads other than the training thread (the
             recorder's writer) per step.

Targets (issue 25): trace <= 50 MB, RSS growth <= 5 MB from step 1,000 to the end, report <= 10
s, JSON <= 25 MB, bounded step time no worse than full recording.

    python benchmarks/bench_long_run.py --threads 1              # the targets: about 5 minutes on 2 cores
    python benchmarks/bench_long_run.py --steps 5000 --rounds 3  # a quick look
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

import ridgescope as rs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _emit import emit_json  # noqa: E402

TARGETS = {"trace_mb": 50, "rss_growth_mb": 5, "report_s": 10, "json_mb": 25, "bounded_over_full": 1.0}


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Trainer:
    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                         torch.nn.ReLU(), torch.nn.Linear(256, 10))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.small = (torch.randn(32, 64), torch.randint(0, 10, (32,)))
        self.large = (torch.randn(512, 64), torch.randint(0, 10, (512,)))

    def step(self, large: bool = False) -> None:
        x, y = self.large if large else self.small
        self.optimizer.zero_grad()
        torch.nn.functional.cross_entropy(self.model(x), y).backward()
        self.optimizer.step()


def control(args: argparse.Namespace) -> dict[str, Any]:
    trainer = Trainer()
    rss_at: dict[str, int] = {}
    for step in range(args.steps):
        trainer.step(large=step == args.peak_step)
        if step + 1 == 1000:
            rss_at["1000"] = rss_bytes()
    rss_at["end"] = rss_bytes()
    return {"steps": args.steps, "rss_bytes_at_1000": rss_at.get("1000"), "rss_bytes_at_end": rss_at["end"],
            "rss_growth_bytes": rss_at["end"] - rss_at.get("1000", rss_at["end"])}


def long_run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    trainer = Trainer()
    trace = args.keep_trace or tmp / "long.rstrace"
    sizes: list[int] = []
    rss_at: dict[str, int] = {}
    t0 = time.perf_counter()
    with rs.track(model=trainer.model, optimizer=trainer.optimizer, out=trace, keep_steps=args.keep_steps) as s:
        for step in range(args.steps):
            trainer.step(large=step == args.peak_step)
            if (step + 1) % 1000 == 0:
                sizes.append(trace.stat().st_size)
                if step + 1 == 1000:
                    rss_at["1000"] = rss_bytes()
        rss_at["end"] = rss_bytes()
        stats = s.stats()
    wall = time.perf_counter() - t0
    final = trace.stat().st_size
    report_json = tmp / "long.json"
    t1 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ridgescope", "report", "--format", "json", "-o", str(report_json),
                           str(trace)], capture_output=True, text=True)
    report_s = time.perf_counter() - t1
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    report = json.loads(report_json.read_text())
    g = report["at_a_glance"]
    return {
        "steps": args.steps, "keep_steps": args.keep_steps, "peak_step": args.peak_step,
        "wall_s": round(wall, 1), "step_ms_mean": round(wall * 1e3 / args.steps, 4),
        "trace_bytes_final": final, "trace_bytes_max_sampled": max(sizes + [final]),
        "trace_bytes_written": stats.get("bytes_written"),
        "events": stats.get("events"), "dropped_events": stats.get("dropped_events"),
        "rss_bytes_at_1000": rss_at.get("1000"), "rss_bytes_at_end": rss_at["end"],
        "rss_growth_bytes": rss_at["end"] - rss_at.get("1000", rss_at["end"]),
        "report_s": round(report_s, 2), "report_json_bytes": report_json.stat().st_size,
        "report_json_bytes_per_step": round(report_json.stat().st_size / max(1, g["steps"]), 1),
        "summarised_steps": g["steps"], "kept_windows": g["windows"],
        "report_peak_step": report["peak"]["step"],
        "peak_step_kept": any(w["first_step"] <= args.peak_step <= w["last_step"] for w in g["windows"]),
    }


def other_threads_cpu_s() -> float:
    """CPU time (user + system, seconds) of this process's threads other than the calling one:
    the recorder's writer thread, and torch's intra-op threads where there are several."""
    me = str(threading.get_native_id())
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        total += int(fields[11]) + int(fields[12])
    return total / tick


def overhead(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    variants = {"untracked": None, "full": "all", "bounded": args.keep_steps}
    trainers = {v: Trainer() for v in variants}
    medians: dict[str, list[float]] = {v: [] for v in variants}
    means: dict[str, list[float]] = {v: [] for v in variants}
    other_cpu: dict[str, float] = {v: 0.0 for v in variants}
    rewrote = {v: 0 for v in variants}  # rounds whose trace was rewritten (bounded: dropped steps)
    names = list(variants)
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    for rnd in range(args.rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for v in order:
            t = trainers[v]
            times = []
            session = None
            cpu0 = other_threads_cpu_s()
            if variants[v] is not None:
                session = rs.track(model=t.model, optimizer=t.optimizer, out=tmp / f"{v}{rnd}.rstrace",
                                   keep_steps=variants[v])
                session.start()
            for _ in range(args.warmup):
                t.step()
            for _ in range(args.round_steps):
                a = clock()
                t.step()
                times.append(clock() - a)
            other_cpu[v] += other_threads_cpu_s() - cpu0  # before stop ends the writer thread
            if session is not None:
                st = session.stats()
                rewrote[v] += st["bytes_written"] > st["file_bytes"]
                session.stop()
                (tmp / f"{v}{rnd}.rstrace").unlink(missing_ok=True)
            medians[v].append(statistics.median(times))
            means[v].append(statistics.fmean(times))
    med = {v: statistics.median(m) for v, m in medians.items()}

    def paired(a: str, b: str, per_round: dict[str, list[float]]) -> float:
        """The median over rounds of a's step time over b's in the same round (rounds are
        minutes apart on a shared machine; within one they are seconds apart)."""
        return round(statistics.median(x / y for x, y in zip(per_round[a], per_round[b])), 4)

    steps = args.rounds * (args.round_steps + args.warmup)
    return {
        "rounds": args.rounds, "round_steps": args.round_steps, "clock": args.clock,
        "median_step_ms": {v: round(m * 1e3, 4) for v, m in med.items()},
        "round_medians_ms": {v: [round(x * 1e3, 4) for x in m] for v, m in medians.items()},
        "round_means_ms": {v: [round(x * 1e3, 4) for x in m] for v, m in means.items()},
        "rounds_rewritten": {v: rewrote[v] for v in ("full", "bounded")},
        "other_threads_cpu_ms_per_step": {v: round(c * 1e3 / steps, 4) for v, c in other_cpu.items()},
        "full_over_untracked": paired("full", "untracked", medians),
        "bounded_over_untracked": paired("bounded", "untracked", medians),
        "bounded_over_full": paired("bounded", "full", medians),
        "bounded_over_full_of_means": paired("bounded", "full", means),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--keep-steps", type=int, default=20)
    ap.add_argument("--peak-step", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds of the overhead part (0: skip)")
    ap.add_argument("--round-steps", type=int, default=2500,
                    help="timed steps per round: a bounded session of 2,500 steps rewrites its file once")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: as is)")
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="how the overhead part times a step: wall time, or the training thread's CPU "
                         "time (with --threads 1: what a busy machine's other jobs do not change)")
    ap.add_argument("--keep-trace", type=Path, default=None, metavar="PATH",
                    help="write the long run's trace to PATH and keep it (default: a temporary file)")
    ap.add_argument("--no-control", action="store_true", help="skip the untracked run of the same steps")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.clock == "thread" and args.threads != 1:
        ap.error("--clock thread needs --threads 1 (kernels on other threads are not timed)")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="rs-long-") as d:
        tmp = Path(d)
        over = overhead(args, tmp) if args.rounds > 0 else None
        run = long_run(args, tmp)
        ctrl = None if args.no_control else control(args)
    out = {
        "benchmark": "long_run", "date": time.strftime("%Y-%m-%d"), "torch_version": torch.__version__,
        "ridgescope_version": rs.__version__, "python_version": platform.python_version(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg(), "long_run": run, "overhead": over, "control": ctrl,
        "targets": TARGETS,
        "meets_targets": {
            "trace_mb": run["trace_bytes_max_sampled"] <= TARGETS["trace_mb"] * 1e6,
            "rss_growth_mb": run["rss_growth_bytes"] <= TARGETS["rss_growth_mb"] * 1e6,
            "report_s": run["report_s"] <= TARGETS["report_s"],
            "json_mb": run["report_json_bytes"] <= TARGETS["json_mb"] * 1e6,
            "bounded_over_full": None if over is None else over["bounded_over_full"] <= TARGETS["bounded_over_full"] * 1.02,
            "peak_step_kept": run["peak_step_kept"],
        },
    }
    emit_json(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
