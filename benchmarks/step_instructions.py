"""Instructions a training step executes, with and without tracking, counted by valgrind.

The step of ``bench_training_step.py`` (TinyGPT, AdamW, its default sizes) runs in one process
per variant under ``valgrind --tool=callgrind --instr-atstart=no``: uninstrumented through the
import and ``--warmup`` steps (so the session's first steps, the saved-tensor hook's, are done),
then the process switches callgrind's instrumentation on (``callgrind_control -i on <pid>``),
runs ``--steps`` steps, dumps the counts and switches it off. Instruction counts do not depend
on what else the machine runs, so two variants' difference is exact where a timed benchmark on a
shared machine has a few per cent of noise; they say nothing of cache misses or of time (a
cycle may retire several instructions or wait on memory for hundreds), so use them to tell
whether a change removed work, and the timed benchmark for what the step costs.

Variants (``--variants``, the first is the baseline the others are compared with):

  untracked         plain PyTorch
  tracked_bounded   ``rs.track(..., keep_steps=20)``: the default recording
  tracked           ``keep_steps="all"``
  tracked_nosites   ``keep_steps=20, stacks=None``
  tracked_lifetime  ``keep_steps=20, activations=False``
  tracked_every_step ``keep_steps=20, activations="every_step"``
  tracked_nomodules ``keep_steps=20`` with the module-call session removed after the start (no
                    module contexts, no forward phase: an experiment, not a mode)

Valgrind runs every variant on one thread of the host: ``--jobs`` processes at a time (default
2). MKL picks its AVX2 kernels under valgrind, so the untracked count is not the native one;
the same kernels run in every variant. About 8 minutes a variant on this 2-core machine, most
of it torch's import under valgrind. The writer thread's share of the counted steps depends on
when it woke (it hands over chunks every 100 ms, and a step takes seconds under valgrind); more
``--steps`` average it out. An inline function that torch's libraries and ridgescope's module
each have a copy of (``intrusive_ptr`` releases, pybind11's internals) moves from one object to
the other between variants: such pairs cancel.

Prints ONE JSON object: per variant the instructions a step (``minstr_per_step``) and by shared
object (``kinstr_per_step_by_object``); per non-baseline variant the difference from the
baseline by object and its 25 largest functions (``kinstr_per_step``).

``--cache`` also simulates the caches (callgrind's ``--cache-sim=yes``: a first-level instruction
and data cache and one last level, by default 32 KiB, 32 KiB and 1 MiB, 8-way, 64-byte lines:
this machine's L1 and its core's L2) and adds, per non-baseline variant, the misses a step it
adds by shared object and its 25 functions with the most added instruction-fetch misses
(``cache``: ``I1`` first-level instruction misses, ``IL`` last-level instruction misses, ``D1`` and
``DL`` data read and write misses, thousands a step). An allocator callback runs between the
user's kernels, which evict its code and data: those misses, not the instructions, are most of
what recording costs a step (docs/performance.md, "Where the training thread's time goes:
instruction fetches"). The simulation is of one cache for every thread, the trace writer's
included, and knows no TLB or prefetcher: a measure for comparing builds, not a cycle count.

    python benchmarks/step_instructions.py --variants untracked,tracked_bounded
    python benchmarks/step_instructions.py --variants untracked,tracked_bounded --steps 3 --cache
"""
from __future__ import annotations

import argparse
import collections
import os
import re
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

SESSIONS = {"tracked_bounded": {"keep_steps": 20}, "tracked": {"keep_steps": "all"},
            "tracked_nosites": {"keep_steps": 20, "stacks": None},
            "tracked_lifetime": {"keep_steps": 20, "activations": False},
            "tracked_every_step": {"keep_steps": 20, "activations": "every_step"},
            "tracked_nomodules": {"keep_steps": 20}}
VARIANTS = ("untracked",) + tuple(SESSIONS)


def child(args: argparse.Namespace) -> None:
    """One variant's steps, inside valgrind: instrumentation on around the counted steps only."""
    import torch

    from bench_training_step import Trainer
    import ridgescope as rs

    torch.set_num_threads(args.threads)
    sizes = argparse.Namespace(seed=0, vocab=512, d_model=128, heads=4, layers=3, seq_len=64, batch=8)
    trainer = Trainer(sizes)
    ctx = None
    if args.child != "untracked":
        ctx = rs.track(model=trainer.model, optimizer=trainer.optimizer,
                       out=os.path.join(tempfile.mkdtemp(), "t.rstrace"), **SESSIONS[args.child])
        session = ctx.__enter__()
        if args.child == "tracked_nomodules":
            for handle in session._instr.module_hook_handles:
                handle.remove()
    for _ in range(args.warmup):
        trainer.step()
    pid = str(os.getpid())
    control = ["callgrind_control"]
    subprocess.run(control + ["-i", "on", pid], check=True, stdout=subprocess.DEVNULL)
    for _ in range(args.steps):
        trainer.step()
    subprocess.run(control + ["-d", "steps", pid], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(control + ["-i", "off", pid], check=True, stdout=subprocess.DEVNULL)
    if ctx is not None:
        ctx.__exit__(None, None, None)


# callgrind_annotate's event names, in the order read: instructions, then (with --cache) the
# simulated misses: first-level and last-level instruction fetches, data reads and writes.
EVENTS = ("Ir",)
CACHE_EVENTS = ("Ir", "I1mr", "ILmr", "D1mr", "D1mw", "DLmr", "DLmw")
_COUNT = r"([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?"
_OBJECT = re.compile(r"\[([^\]]*)\]\s*$")


def read_counts(path: Path, events: tuple[str, ...] = EVENTS) -> tuple[list[int], dict[str, list[int]]]:
    """The dump's totals and its functions' own (exclusive) counts of ``events``, by
    'file:function [object]'."""
    out = subprocess.run(["callgrind_annotate", "--threshold=100", "--show=" + ",".join(events), str(path)],
                         capture_output=True, text=True, check=True).stdout
    line_re = re.compile(r"\s*" + _COUNT * len(events) + r"(.*)$")
    total, functions = [0] * len(events), {}
    for line in out.splitlines():
        m = line_re.match(line)
        if m is None:
            continue
        counts = [int(g.replace(",", "")) for g in m.groups()[:-1]]
        name = m.groups()[-1]
        if "PROGRAM TOTALS" in name:
            total = counts
        elif name and not name.startswith("file:function"):
            old = functions.get(name)
            functions[name] = counts if old is None else [a + b for a, b in zip(old, counts)]
    return total, functions


def object_of(function: str) -> str:
    m = _OBJECT.search(function)
    return m.group(1).rsplit("/", 1)[-1] if m else "?"


def short(function: str) -> str:
    """'file:function(args) [object]' -> 'function (object)'."""
    name = _OBJECT.sub("", function).strip().replace("(anonymous namespace)::", "")
    name = name.split(":", 1)[1] if ":" in name and not name.startswith("???") else name.replace("???:", "")
    name = re.sub(r"\(.*", "", name)
    return f"{name} ({object_of(function)})"


def misses(counts: list[int]) -> dict[str, int]:
    """Ir, I1, IL, D1, DL of one CACHE_EVENTS row (data misses: reads and writes)."""
    c = dict(zip(CACHE_EVENTS, counts))
    return {"Ir": c["Ir"], "I1": c["I1mr"], "IL": c["ILmr"], "D1": c["D1mr"] + c["D1mw"], "DL": c["DLmr"] + c["DLmw"]}


def cache_differences(base: tuple[list[int], dict[str, list[int]]], other: tuple[list[int], dict[str, list[int]]],
                      steps: int) -> dict[str, Any]:
    """What ``other`` adds to ``base``, thousands a step: in all, by shared object, and the 25
    functions that add the most instruction-fetch misses (first level)."""
    zero = [0] * len(CACHE_EVENTS)

    def per_step(a: list[int], b: list[int]) -> dict[str, float]:
        ma, mb = misses(a), misses(b)
        return {k: round((mb[k] - ma[k]) / steps / 1e3, 1) for k in ma}

    objects: dict[str, list[list[int]]] = {}
    for side, (_, functions) in enumerate((base, other)):
        for f, c in functions.items():
            row = objects.setdefault(object_of(f), [list(zero), list(zero)])
            row[side] = [x + y for x, y in zip(row[side], c)]
    by_object = {o: per_step(a, b) for o, (a, b) in objects.items()}
    by_object = dict(sorted(((o, d) for o, d in by_object.items() if abs(d["I1"]) + abs(d["D1"]) >= 0.5),
                            key=lambda kv: -(abs(kv[1]["I1"]) + abs(kv[1]["D1"]))))
    names = (set(base[1]) | set(other[1]))
    functions = {f: per_step(base[1].get(f, zero), other[1].get(f, zero)) for f in names if not f.startswith("???:0x")}
    top = sorted(functions.items(), key=lambda kv: -kv[1]["I1"])[:25]
    return {"all": per_step(base[0], other[0]), "by_object": by_object,
            "top_functions_by_instruction_misses": {short(f): d for f, d in top}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variants", default="untracked,tracked_bounded",
                   help=f"comma-separated, the first the baseline; of {','.join(VARIANTS)}")
    p.add_argument("--steps", type=int, default=6, help="counted steps per variant")
    p.add_argument("--warmup", type=int, default=5, help="uncounted steps before them")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in each variant")
    p.add_argument("--jobs", type=int, default=2, help="variants run at a time")
    p.add_argument("--cache", action="store_true", help="also simulate the caches and report the misses")
    p.add_argument("--cache-sizes", default="32768,32768,1048576",
                   help="--cache: the first-level instruction, first-level data and last-level caches, bytes (8-way, 64-byte lines)")
    p.add_argument("--keep", help="folder to keep the callgrind dumps in (default: a temporary one)")
    p.add_argument("--out")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or len(variants) < 2:
        raise SystemExit(f"--variants: at least two of {', '.join(VARIANTS)} (unknown: {', '.join(unknown) or 'none'})")
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: install valgrind (Debian: apt-get install valgrind)")
    if args.steps < 1 or args.warmup < 3:
        raise SystemExit("--steps must be at least 1 and --warmup at least 3 (the hook's steps come first)")
    cache_options: list[str] = []
    if args.cache:
        try:
            i1, d1, ll = (int(x) for x in args.cache_sizes.split(","))
        except ValueError:
            raise SystemExit(f"--cache-sizes: three sizes in bytes, comma-separated (got {args.cache_sizes!r})")
        cache_options = ["--cache-sim=yes", f"--I1={i1},8,64", f"--D1={d1},8,64", f"--LL={ll},8,64"]
    events = CACHE_EVENTS if args.cache else EVENTS
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="rs_instr_"))
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    pending, running, logs = list(variants), {}, {}
    while pending or running:
        while pending and len(running) < max(1, args.jobs):
            v = pending.pop(0)
            log = (folder / f"{v}.log").open("w")
            logs[v] = log
            running[v] = subprocess.Popen(
                ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={folder / ('cg.' + v)}",
                 *cache_options, sys.executable, __file__, "--child", v, "--steps", str(args.steps), "--warmup", str(args.warmup),
                 "--threads", str(args.threads)], stdout=log, stderr=subprocess.STDOUT)
        time.sleep(2)
        for v, proc in list(running.items()):
            if proc.poll() is not None:
                logs[v].close()
                del running[v]
                if proc.returncode != 0:
                    raise SystemExit(f"variant {v} failed (exit {proc.returncode}); its log: {folder / (v + '.log')}")
    every_event: dict[str, tuple[list[int], dict[str, list[int]]]] = {}
    for v in variants:
        dumps = sorted(folder.glob(f"cg.{v}.*"))  # .1: the "steps" dump (the others: the rest of the run)
        if not dumps:
            raise SystemExit(f"variant {v} wrote no dump of its steps; its log: {folder / (v + '.log')}")
        every_event[v] = read_counts(dumps[0], events)
    n = args.steps
    # The instructions (the first event) of every variant, for the sections every run reports.
    counts = {v: (total[0], {f: c[0] for f, c in fns.items()}) for v, (total, fns) in every_event.items()}
    by_object = {v: collections.Counter() for v in variants}
    for v in variants:
        for function, count in counts[v][1].items():
            by_object[v][object_of(function)] += count
    base = variants[0]
    result: dict[str, Any] = {
        "benchmark": "step_instructions", "steps": n, "warmup": args.warmup, "threads": args.threads,
        "variants": variants, "baseline": base, "wall_s": round(time.perf_counter() - started, 1),
        "minstr_per_step": {v: round(counts[v][0] / n / 1e6, 3) for v in variants},
        "kinstr_per_step_by_object": {
            v: {o: round(c / n / 1e3, 1) for o, c in by_object[v].most_common(12)} for v in variants},
        "differences": {},
    }
    for v in variants[1:]:
        objects = set(by_object[v]) | set(by_object[base])
        d_obj = {o: round((by_object[v][o] - by_object[base][o]) / n / 1e3, 1) for o in objects}
        functions = set(counts[v][1]) | set(counts[base][1])
        d_fn = {f: (counts[v][1].get(f, 0) - counts[base][1].get(f, 0)) / n / 1e3 for f in functions}
        # JIT-compiled kernels (oneDNN) have no symbol: each run names them by address.
        d_fn = {f: x for f, x in d_fn.items() if not f.startswith("???:0x")}
        result["differences"][v] = {
            "minstr_per_step": round((counts[v][0] - counts[base][0]) / n / 1e6, 3),
            "per_cent": round(100.0 * (counts[v][0] - counts[base][0]) / counts[base][0], 3),
            "kinstr_per_step_by_object": dict(sorted(((o, x) for o, x in d_obj.items() if abs(x) >= 1.0),
                                                     key=lambda kv: -abs(kv[1]))),
            "top_functions_kinstr_per_step": {short(f): round(x, 1) for f, x in
                                              sorted(d_fn.items(), key=lambda kv: -abs(kv[1]))[:25]},
        }
    if args.cache:
        result["cache"] = {"sizes_bytes": {"I1": i1, "D1": d1, "LL": ll}, "differences": {}}
        for v in variants[1:]:
            result["cache"]["differences"][v] = cache_differences(every_event[base], every_event[v], n)
    result["dumps"] = str(folder) if args.keep else None
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    emit_json(result, args.out)


if __name__ == "__main__":
    main()
