"""Training-step overhead of ridgescope against an untracked run and torch.profiler.

The same CPU training step (TinyGPT from examples/models.py, AdamW, cross-entropy) runs in
these variants:

  untracked         plain PyTorch
  untracked_control plain PyTorch again: its ratio over ``untracked`` is what the benchmark
                    reads when nothing differs (the machine's noise; with ``--models separate``
                    also the two models' memory placement), the floor under which no other
                    ratio can be told from 1
  tracked           inside ``rs.track(model=..., optimizer=...)`` writing a trace to a temp file
                    (activations tagged by the saved-tensor hook in the session's first two
                    steps, which are warm-up here, and read from what it said afterwards, and
                    each allocation's site: the defaults)
  tracked_bounded   the same with ``keep_steps=20``: the flight recorder's bounded trace, the
                    default of ``ridgescope run`` and the integrations (docs/long-runs.md)
  tracked_bounded_idle_writer
                    the same with ``RIDGESCOPE_WRITER=idle``: the trace writer thread at the
                    idle scheduling class instead of the normal one (recorder.h), not a default
  tracked_bounded_every_step
                    ``tracked_bounded`` with ``activations="every_step"``: the saved-tensor hook
                    in every step (the default before 2026-12-07)
  tracked_bounded_lifetime
                    ``tracked_bounded`` with ``activations=False`` (no saved-tensor hook): with
                    ``tracked`` and ``tracked_lifetime`` it separates the hook's cost from the
                    bounded recording's
  tracked_nosites   the same with ``stacks=None``: no allocation site (docs/sites.md)
  tracked_python    the same with ``stacks="python"``: the whole Python stack of every allocation
  tracked_lifetime  the default with ``activations=False``: no saved-tensor hook, activations
                    inferred from lifetimes and labelled by the module that made them
  profiler   inside ``torch.profiler.profile(activities=[CPU], profile_memory=True,
             record_shapes=True, with_stack=True)``

and, when asked for with ``--variants`` (compiling takes a minute or more on 2 cores), the
same step on the model compiled with ``torch.compile(model)`` (Inductor's C++ backend):

  compiled                   untracked
  compiled_tracked           inside ``rs.track``, as tracked
  compiled_tracked_lifetime  inside ``rs.track(..., activations=False)``

Their ratios are against ``compiled`` (``compiled_tracked_over_compiled``). Each compiled
variant compiles its model before the first round (untimed).

By default (``--models shared``) the variants train one and the same model and optimizer (one
for the eager variants, one for the compiled ones) on the same fixed batches, so that a ratio
compares the same step with and without tracking, the parameters, gradients and optimizer
state in the same blocks; ``--models separate`` gives each variant its own model and optimizer
built from the same seed, and the control then also reads how much two identical models differ
by where their memory lies (up to a few per cent on 2 cores). The variants run interleaved: every round runs a block of steps of each variant
in turn (the order rotates each round), so that machine noise falls on all of them alike. A
round's block is ``--warmup`` untimed steps then ``--steps`` timed steps, all inside one
tracking session (tracked) or one profiler context (profiler); the session or profiler starts
before and stops after the block, so step times are steady-state and exclude start, stop and
post-processing, which are measured apart:

  session_costs.start_ms    ``session.start()`` of a session on the benchmark model (median)
  session_costs.stop_ms     ``session.stop()`` of that session right after (median; and max)
  session_costs.report_ms   ``session.report()`` on a round's trace (median), with its events
  profiler_costs.exit_ms    leaving the profiler context (its post-processing, median)

Tracking and the profiler install process-wide hooks, so a round's session (or profiler) is
closed before the next variant runs; a new one is opened each round and nothing leaks between
rounds. Prints ONE JSON object on stdout (schema_version 2); ``--out FILE`` writes a copy.

``--clock wall`` (default) times steps with ``time.perf_counter``; ``--clock cpu`` with
``time.process_time`` (the CPU time of every thread of the process, ridgescope's trace writer
included); ``--clock thread`` with ``time.thread_time`` (the training thread's CPU time only).
The CPU clocks are disturbed less by other processes on a shared machine; use them with
``--threads 1`` so that all of a step's compute is on the timed thread.

    python benchmarks/bench_training_step.py                    # default: about 40 s on 2 cores
    python benchmarks/bench_training_step.py --layers 6 --batch 16 --out out/bench.json
    python benchmarks/bench_training_step.py --variants untracked,tracked,compiled,compiled_tracked
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _emit import emit_json  # noqa: E402
from models import TinyGPT, gpt_batch, gpt_loss  # noqa: E402

import ridgescope as rs  # noqa: E402

VARIANTS = ("untracked", "untracked_control", "tracked", "tracked_bounded",
            "tracked_bounded_idle_writer", "tracked_bounded_every_step", "tracked_bounded_lifetime", "tracked_nosites", "tracked_python",
            "tracked_lifetime",
            "profiler", "compiled", "compiled_tracked", "compiled_tracked_lifetime")
DEFAULT_VARIANTS = ("untracked", "untracked_control", "tracked", "tracked_bounded", "tracked_nosites",
                    "tracked_python", "tracked_lifetime", "profiler")
TRACKED = {"tracked": {"keep_steps": "all"}, "tracked_bounded": {"keep_steps": 20},
           "tracked_bounded_idle_writer": {"keep_steps": 20},
           "tracked_bounded_every_step": {"keep_steps": 20, "activations": "every_step"},
           "tracked_bounded_lifetime": {"keep_steps": 20, "activations": False},
           "tracked_nosites": {"stacks": None}, "tracked_python": {"stacks": "python"},
           "tracked_lifetime": {"activations": False},
           "compiled_tracked": {}, "compiled_tracked_lifetime": {"activations": False}}
# The environment a variant's session starts in (read when the session starts).
SESSION_ENV = {"tracked_bounded_idle_writer": {"RIDGESCOPE_WRITER": "idle"}}
TARGETS = {"tracked_over_untracked": 1.05, "tracked_bounded_over_untracked": 1.05,
           "tracked_python_over_untracked": 1.15,
           "compiled_tracked_over_compiled": 1.05}
TARGET_TRACKED_OVER_UNTRACKED = 1.05
N_BATCHES = 4  # distinct fixed batches, cycled
# --malloc fixed: glibc never trims its heap and every allocation below 100 MB comes from it
# (mallopt(3): M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_TOP_PAD; setting one also stops glibc from
# moving the thresholds as the process runs).
FIXED_MALLOC = {"MALLOC_TRIM_THRESHOLD_": "1000000000", "MALLOC_MMAP_THRESHOLD_": "100000000",
                "MALLOC_TOP_PAD_": "67108864"}


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (q in [0, 100]) of a non-empty list."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


class Trainer:
    """One model + optimizer + fixed batches; ``step()`` is one training step."""

    def __init__(self, args: argparse.Namespace, compiled: bool = False) -> None:
        torch.manual_seed(args.seed)
        self.model = TinyGPT(vocab=args.vocab, d_model=args.d_model, n_heads=args.heads,
                             layers=args.layers, seq_len=args.seq_len)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4)
        self.batches = [gpt_batch(args.batch, args.seq_len, vocab=args.vocab, seed=i)
                        for i in range(N_BATCHES)]
        self.n = 0
        self.forward = torch.compile(self.model) if compiled else self.model
        if compiled:
            self.step()  # compiles forward and backward, untimed

    def step(self) -> None:
        x, y = self.batches[self.n % len(self.batches)]
        self.n += 1
        self.optimizer.zero_grad(set_to_none=True)
        loss = gpt_loss(self.forward, x, y)
        loss.backward()
        self.optimizer.step()


CLOCK = time.perf_counter  # --clock cpu: time.process_time; --clock thread: time.thread_time


# Minor page faults of the whole process during each variant's timed steps (getrusage): glibc
# hands large tensors' memory back to the kernel (heap trimming, munmap) and faults it in again,
# and how often depends on where everything else in the heap lies. Per variant: each round's
# faults a timed step, in round order.
FAULTS: dict[str, list[float]] = {}


def timed_steps(step: Callable[[], None], warmup: int, steps: int, variant: str) -> list[float]:
    for _ in range(warmup):
        step()
    out = []
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        t0 = CLOCK()
        step()
        out.append(CLOCK() - t0)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start
    FAULTS.setdefault(variant, []).append(faults / steps)
    return out


def make_profiler() -> torch.profiler.profile:
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  profile_memory=True, record_shapes=True, with_stack=True)


def run_round(variant: str, trainer: Trainer, args: argparse.Namespace, tmp: Path,
              rnd: int, acc: dict[str, Any]) -> list[float]:
    if variant in ("untracked", "untracked_control", "compiled"):
        return timed_steps(trainer.step, args.warmup, args.steps, variant)

    if variant in TRACKED:
        path = tmp / f"{variant}-round{rnd}.rstrace"
        with mock.patch.dict(os.environ, SESSION_ENV.get(variant, {})), \
                rs.track(model=trainer.model, optimizer=trainer.optimizer, out=path,
                         **TRACKED[variant]) as session:
            for _ in range(args.warmup):
                trainer.step()
            before = session.stats()
            times = timed_steps(trainer.step, 0, args.steps, variant)
            after = session.stats()
        if session.error:
            acc["errors"].append(f"{variant}: {session.error}")
        acc["variant_events"].setdefault(variant, []).append((after["events"] - before["events"]) / args.steps)
        if variant != "tracked":
            path.unlink(missing_ok=True)
            return times
        acc["timed_events"] += after["events"] - before["events"]
        acc["timed_steps"] += args.steps
        acc["dropped_events"] += after.get("dropped_events", 0)
        acc["buffer_bytes_peak"] = max(acc["buffer_bytes_peak"], after.get("buffer_bytes_peak", 0))
        acc["trace_bytes"] += path.stat().st_size
        acc["trace_steps"] += args.warmup + args.steps
        acc["sessions"].append(session)
        return times

    if variant == "profiler":
        prof = make_profiler()
        prof.__enter__()
        try:
            times = timed_steps(trainer.step, args.warmup, args.steps, variant)
        finally:
            t0 = time.perf_counter()
            prof.__exit__(None, None, None)
            acc["exit_s"].append(time.perf_counter() - t0)
        del prof
        return times

    raise ValueError(variant)


def median_ci95(xs: list[float], resamples: int = 2000) -> list[float]:
    """A 95 % bootstrap interval of the median of ``xs`` (seeded: the same rounds give the same
    interval). On a shared machine it says whether a per-round median above or below a target
    could be the rounds' noise."""
    if len(xs) < 2:
        return [round(xs[0], 4)] * 2 if xs else []
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(resamples))
    return [round(meds[int(0.025 * resamples)], 4), round(meds[int(0.975 * resamples) - 1], 4)]


def per_round_summary(rr: list[float]) -> dict[str, Any]:
    return {"min": round(min(rr), 4), "median": round(statistics.median(rr), 4), "max": round(max(rr), 4),
            "ci95": median_ci95(rr)}


def position_ratios(times: list[float], base: list[float], args: argparse.Namespace
                    ) -> dict[str, float]:
    """The ratio of medians over each third of a round's timed steps, named by the steps'
    position in the round's session (its first step is 0): whether the cost moves as a session
    goes on (docs/performance.md). ``times`` and ``base`` hold the rounds' steps one after the
    other, ``args.steps`` a round."""
    n, out = args.steps, {}
    bounds = sorted({0, n // 3, 2 * n // 3, n})
    for lo, hi in zip(bounds, bounds[1:]):
        def third(xs: list[float]) -> float:
            return statistics.median(x for i, x in enumerate(xs) if lo <= i % n < hi)
        out[f"steps {args.warmup + lo}-{args.warmup + hi - 1}"] = round(third(times) / third(base), 4)
    return out


def fault_free_ratio(times: list[float], base: list[float], faults: list[float],
                     base_faults: list[float], args: argparse.Namespace) -> dict[str, Any]:
    """The ratio of medians over the rounds in which neither variant faulted (under one minor
    page fault a timed step, both): the step's own cost without glibc's heap trimming, which
    comes and goes with the process's heap history and falls on any variant
    (docs/performance.md). ``faults`` and ``base_faults`` hold each round's faults a step."""
    n = args.steps
    clean = [r for r, (a, b) in enumerate(zip(faults, base_faults)) if a < 1 and b < 1]
    if not clean:
        return {"rounds": 0, "ratio": None}

    def pick(xs: list[float]) -> list[float]:
        return [x for r in clean for x in xs[r * n:(r + 1) * n]]
    return {"rounds": len(clean),
            "ratio": round(statistics.median(pick(times)) / statistics.median(pick(base)), 4)}


def session_costs(args: argparse.Namespace, tmp: Path, sessions: list[Any]) -> dict[str, Any]:
    """Start+stop of an empty session on the benchmark model, and the analysis of the traces."""
    trainer = Trainer(args)
    trainer.step()  # optimizer state exists, as in a session started mid-training
    start_s, stop_s = [], []
    for i in range(args.session_repeats):
        path = tmp / f"empty{i}.rstrace"
        session = rs.track(model=trainer.model, optimizer=trainer.optimizer, out=path)
        t0 = time.perf_counter()
        session.start()
        t1 = time.perf_counter()
        session.stop()
        t2 = time.perf_counter()
        start_s.append(t1 - t0)
        stop_s.append(t2 - t1)
        path.unlink(missing_ok=True)

    report_s = []
    consistency: dict[str, Any] = {"traces": 0, "samples": 0, "mismatches": 0,
                                   "truncated": 0, "skipped_records": 0}
    events = []
    for session in sessions:
        t0 = time.perf_counter()
        report = session.report()  # the session is stopped: this is the trace analysis alone
        report_s.append(time.perf_counter() - t0)
        d = report.to_dict()
        events.append(d["trace"]["events"])
        c = d["consistency"]
        consistency["traces"] += 1
        consistency["samples"] += c["samples"]
        consistency["mismatches"] += c["mismatches"]
        consistency["truncated"] += int(bool(d["trace"]["truncated"]))
        consistency["skipped_records"] += d["trace"]["skipped_records"]
    return {
        "start_ms": ms(statistics.median(start_s)),
        "stop_ms": ms(statistics.median(stop_s)),
        "stop_max_ms": ms(max(stop_s)),
        "start_stop_repeats": len(start_s),
        "start_stop_note": "an empty session on the benchmark model (optimizer state present), "
                           "started and stopped at once",
        "report_ms": ms(statistics.median(report_s)) if report_s else None,
        "report_trace_events": int(statistics.median(events)) if events else None,
        "report_trace_steps": args.warmup + args.steps,
        "report_ms_per_1k_events": (round(statistics.median(report_s) * 1e6 /
                                          statistics.median(events), 4) if events else None),
        "consistency": consistency,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per variant per round")
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    ap.add_argument("--warmup", type=int, default=3,
                    help="untimed steps per variant per round, inside its session/profiler")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads (default: leave as is)")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help="comma-separated subset of " + ",".join(VARIANTS))
    ap.add_argument("--session-repeats", type=int, default=10,
                    help="repeats of the session start+stop measurement")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clock", choices=("wall", "cpu", "thread"), default="wall",
                    help="wall: time.perf_counter; cpu: time.process_time (all threads' CPU time); "
                         "thread: time.thread_time (the training thread's)")
    ap.add_argument("--models", choices=("shared", "separate"), default="shared",
                    help="shared: every variant trains the same model and optimizer; separate: "
                         "each its own, built from the same seed")
    ap.add_argument("--malloc", choices=("default", "fixed"), default="default",
                    help="default: glibc's own heap thresholds; fixed: the process restarts with "
                         "trimming off and one mmap threshold for every variant alike "
                         f"({' '.join(f'{k}={v}' for k, v in FIXED_MALLOC.items())}), so "
                         "that no variant's steps fault its heap in again (a diagnostic)")
    ap.add_argument("--out", default=None, help="also write the JSON to this file")
    args = ap.parse_args(argv)
    if args.malloc == "fixed" and any(os.environ.get(k) != v for k, v in FIXED_MALLOC.items()):
        # glibc reads these once, at the process's first allocation: only a new process has them
        os.environ.update(FIXED_MALLOC)
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__)]
                 + (sys.argv[1:] if argv is None else list(argv)))
    variants = [v for v in args.variants.split(",") if v]
    if not variants or any(v not in VARIANTS for v in variants):
        ap.error(f"--variants: choose from {', '.join(VARIANTS)}")
    if args.steps < 1 or args.rounds < 1 or args.warmup < 0:
        ap.error("--steps and --rounds must be >= 1, --warmup >= 0")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.clock == "thread" and args.threads != 1:
        ap.error("--clock thread needs --threads 1 (kernels on other threads are not timed)")
    global CLOCK
    CLOCK = {"wall": time.perf_counter, "cpu": time.process_time, "thread": time.thread_time}[args.clock]

    trainers: dict[str, Trainer] = {}
    for v in variants:
        compiled = v.startswith("compiled")
        same = [t for u, t in trainers.items() if u.startswith("compiled") == compiled]
        # --models shared: one eager and one compiled trainer for all the variants
        trainers[v] = same[0] if same and args.models == "shared" else Trainer(args, compiled=compiled)
    times: dict[str, list[float]] = {v: [] for v in variants}
    round_medians: dict[str, list[float]] = {v: [] for v in variants}
    acc: dict[str, Any] = {"timed_events": 0, "timed_steps": 0, "dropped_events": 0,
                           "buffer_bytes_peak": 0, "trace_bytes": 0, "trace_steps": 0,
                           "errors": [], "sessions": [], "exit_s": [], "variant_events": {}}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rs-bench-") as tmpdir:
        tmp = Path(tmpdir)
        for rnd in range(args.rounds):
            k = rnd % len(variants)
            for v in variants[k:] + variants[:k]:  # rotate the order each round
                gc.collect()
                t = run_round(v, trainers[v], args, tmp, rnd, acc)
                times[v].extend(t)
                round_medians[v].append(statistics.median(t))
        costs = session_costs(args, tmp, acc["sessions"]) if "tracked" in variants else None
    wall = time.perf_counter() - t_start

    results = {v: {"median_ms": ms(statistics.median(times[v])),
                   "p90_ms": ms(percentile(times[v], 90)),
                   "min_ms": ms(min(times[v])),
                   "mean_ms": ms(statistics.fmean(times[v])),
                   "steps": len(times[v]),
                   # every round times the same number of steps
                   "minor_faults_per_step": round(statistics.fmean(FAULTS.get(v, [0])), 1),
                   "minor_faults_per_step_by_round": [round(f, 1) for f in FAULTS.get(v, [])],
                   "round_medians_ms": [ms(x) for x in round_medians[v]]}
               for v in variants}
    ratios: dict[str, Any] = {}
    per_round: dict[str, Any] = {}
    by_position: dict[str, Any] = {}
    fault_free: dict[str, Any] = {}
    if "untracked" in variants:
        base = statistics.median(times["untracked"])
        for v in variants:
            if v == "untracked":
                continue
            ratios[f"{v}_over_untracked"] = round(statistics.median(times[v]) / base, 4)
            rr = [a / b for a, b in zip(round_medians[v], round_medians["untracked"])]
            per_round[f"{v}_over_untracked"] = per_round_summary(rr)
            by_position[f"{v}_over_untracked"] = position_ratios(times[v], times["untracked"],
                                                                 args)
            fault_free[f"{v}_over_untracked"] = fault_free_ratio(
                times[v], times["untracked"], FAULTS.get(v, []), FAULTS.get("untracked", []), args)
    if "compiled" in variants:  # a compiled step against the same compiled step untracked
        base = statistics.median(times["compiled"])
        for v in ("compiled_tracked", "compiled_tracked_lifetime"):
            if v not in variants:
                continue
            ratios[f"{v}_over_compiled"] = round(statistics.median(times[v]) / base, 4)
            rr = [a / b for a, b in zip(round_medians[v], round_medians["compiled"])]
            per_round[f"{v}_over_compiled"] = per_round_summary(rr)
    out: dict[str, Any] = {
        "schema_version": 2,
        "benchmark": "training_step",
        "date": time.strftime("%Y-%m-%d"),
        "torch_version": torch.__version__,
        "ridgescope_version": rs.__version__,
        "python_version": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "clock": args.clock,
        "config": {"model": "TinyGPT", "optimizer": "AdamW", "batch": args.batch,
                   "seq_len": args.seq_len, "layers": args.layers, "d_model": args.d_model,
                   "heads": args.heads, "vocab": args.vocab,
                   "parameters": sum(p.numel() for p in next(iter(trainers.values()))
                                     .model.parameters()),
                   "steps": args.steps, "rounds": args.rounds, "warmup": args.warmup,
                   "variants": variants, "seed": args.seed, "models": args.models,
                   "malloc": args.malloc},
        "results": results,
        "ratios": ratios,
        "per_round_ratios": per_round,
        "ratios_by_position": by_position,
        "ratios_in_rounds_without_faults": fault_free,
        "targets": {f"{k}_max": v for k, v in TARGETS.items()},
        "meets_targets": {k: ratios[k] <= v for k, v in TARGETS.items() if k in ratios},
        "meets_targets_lifetime": (ratios.get("tracked_lifetime_over_untracked") or 99)
        <= TARGET_TRACKED_OVER_UNTRACKED,
        "events_per_step": {v: round(statistics.median(e), 1) for v, e in acc["variant_events"].items()},
        "wall_s": round(wall, 2),
    }
    if "tracked" in variants:
        steps = max(acc["timed_steps"], 1)
        out["tracking"] = {
            "events_per_step": round(acc["timed_events"] / steps, 1),
            "trace_bytes_per_step": round(acc["trace_bytes"] / max(acc["trace_steps"], 1), 1),
            "trace_bytes_note": "trace file size / steps in it (includes the session header, "
                                "metadata and registration of existing storages)",
            "dropped_events": acc["dropped_events"],
            "buffer_bytes_peak": acc["buffer_bytes_peak"],
            "errors": acc["errors"],
        }
        out["session_costs"] = costs
    if "profiler" in variants:
        out["profiler_costs"] = {"exit_ms": ms(statistics.median(acc["exit_s"])),
                                 "exit_note": "leaving the profile context after "
                                              f"{args.warmup + args.steps} steps (median)"}
    emit_json(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
