"""The GPU check of compiled training (issue 12, docs/compile.md): torch.compile under tracking.

Run by benchmarks/gpu_check.sh after benchmarks/gpu_check.py, in about a minute of its shared
budget. The same line conventions as gpu_check.py, whose helpers it imports: each check prints
``PASS name: detail``, ``FAIL name: detail`` or ``SKIP name: why``; the script ends with
``GPU_CHECK_COMPILE_SUMMARY {json}`` (also OUT/gpu_check_compile_summary.json). Exit status: 0
when nothing failed.

Checks:
  counters      a compiled GPT-style model (mode="default"), bf16 autocast, AdamW: Dynamo's
                counters (frames, recompiles, graph breaks) are the same tracked and untracked;
                parameter bytes exact; the ledger agrees with torch.cuda.memory_allocated() at
                every phase boundary; a `compile` phase in step 0.
  graph_pool    the same model with mode="reduce-overhead" (CUDA graphs): the report's
                cuda_pools metadata lists the graph's private pool (segment_pool_id not (0, 0))
                with the bytes torch.cuda.memory_snapshot() gives for that pool.
  overhead      the compiled step's time, interleaved rounds untracked/tracked; target: tracked
                at most 2 % over untracked.

``--dry-run`` runs the plumbing on the CPU (no GPU, Dynamo's "aot_eager" backend so nothing is
compiled to machine code): the counters comparison and the overhead loop on a tiny model, the
pool summary on synthetic segments, the summary line. It proves nothing about the GPU.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import gpu_check  # benchmarks/: its reporting helpers, its Workload and the package path
from gpu_check import FIGURES, RESULTS, check, record, section, skip

import torch  # noqa: E402

import ridgescope as rs  # noqa: E402


def fresh_dynamo() -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()


def dynamo_counters() -> dict:
    from torch._dynamo.utils import counters
    return {"frames": dict(counters["frames"]), "recompiles": dict(counters["recompiles"]),
            "graph_break": {k[:120]: v for k, v in counters["graph_break"].items()},
            "unique_graphs": counters["stats"]["unique_graphs"]}


def compiled_run(w: gpu_check.Workload, steps: int, mode: str, backend: str, out: Path | None):
    """Fresh Dynamo, a fresh model compiled with `mode`, `steps` training steps (tracked when
    `out` is given); returns (model, Dynamo's counters, report dict or None)."""
    fresh_dynamo()
    model, opt = w.make()
    kw = {"backend": backend} if backend != "inductor" else {"mode": mode}
    compiled = torch.compile(model, **kw)
    report = None
    if out is not None:
        with rs.track(model=model, optimizer=opt, out=out) as s:
            for i in range(steps):
                w.step(compiled, opt, i)
        report = s.report().to_dict()
    else:
        for i in range(steps):
            w.step(compiled, opt, i)
    return model, dynamo_counters(), report


def counters_check(w: gpu_check.Workload, steps: int, backend: str, out: Path, cuda: bool) -> None:
    if backend == "inductor":
        compiled_run(w, steps, "default", backend, None)  # fills Inductor's caches for both runs
    _, plain, _ = compiled_run(w, steps, "default", backend, None)
    model, tracked, r = compiled_run(w, steps, "default", backend, out / "compile.rstrace")
    check("compile.counters_unchanged", tracked == plain,
          f"untracked {json.dumps(plain)[:300]}; tracked {json.dumps(tracked)[:300]}")
    p_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    check("compile.parameter_bytes_exact", r["peak"]["by_category"]["parameter"] == p_bytes,
          f"{r['peak']['by_category']['parameter']} B in the report, {p_bytes} B in the model")
    compiles = [(s["step"], p["peak_bytes"]) for s in r["steps"] for p in s["phases"]
                if p["phase"] == "compile"]
    check("compile.phase_in_step_0", bool(compiles) and compiles[0][0] == 0,
          f"compile phases (step, peak bytes): {compiles[:6]}")
    c = r["consistency"]
    if cuda:
        check("compile.ledger_agrees", c["mismatches"] == 0 and c["samples"] > 0,
              f"{c['samples']} boundaries, {c['mismatches']} mismatches")
    else:
        skip("compile.ledger_agrees", f"dry run on the CPU ({c['samples']} boundaries, "
                                      f"{c['mismatches']} mismatches)")
    FIGURES["compile_unknown_share"] = round(r["peak"]["by_category"]["unknown"] / max(1, r["peak"]["bytes"]), 5)
    (out / "compile.rstrace").unlink(missing_ok=True)


def graph_pool_check(w: gpu_check.Workload, steps: int, out: Path) -> None:
    from ridgescope._compile import summarize_pools
    model, _, r = compiled_run(w, steps, "reduce-overhead", "inductor", out / "pool.rstrace")
    recorded = json.loads(r["metadata"].get("cuda_pools", "{}")).get("pools", [])
    torch.cuda.synchronize()
    now = [p for p in summarize_pools(torch.cuda.memory_snapshot()) if p["pool_id"] != [0, 0]]
    private = [p for p in recorded if p["pool_id"] != [0, 0]]
    FIGURES["cuda_pools"] = recorded
    check("graph_pool.reported", bool(private) and all(p["reserved_bytes"] > 0 for p in private),
          f"private pools in the report: {private}")
    check("graph_pool.bytes_match_torch", private == now,
          f"report {private}; torch.cuda.memory_snapshot() after tracking {now}")
    (out / "pool.rstrace").unlink(missing_ok=True)
    del model


def overhead_check(w: gpu_check.Workload, rounds: int, steps: int, backend: str, out: Path,
                   cuda: bool) -> None:
    fresh_dynamo()
    model, opt = w.make()
    kw = {"backend": backend} if backend != "inductor" else {}
    compiled = torch.compile(model, **kw)
    for i in range(3):  # compile, and warm the kernels
        w.step(compiled, opt, i)
    times: dict[str, list[float]] = {"untracked": [], "tracked": []}

    def timed(mode: str) -> None:
        for i in range(steps):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            w.step(compiled, opt, i)
            if cuda:
                torch.cuda.synchronize()
            times[mode].append(time.perf_counter() - t0)

    for r in range(rounds):
        for mode in (("untracked", "tracked") if r % 2 == 0 else ("tracked", "untracked")):
            w.step(compiled, opt, 0)  # one untimed step after each switch
            if mode == "tracked":
                with rs.track(model=model, optimizer=opt, out=out / "overhead_compile.rstrace"):
                    timed(mode)
            else:
                timed(mode)
    med = {m: statistics.median(v) for m, v in times.items()}
    ratio = med["tracked"] / med["untracked"]
    FIGURES["compiled_step_ms"] = {m: round(v * 1e3, 3) for m, v in med.items()}
    FIGURES["compiled_step_ratio"] = round(ratio, 4)
    detail = (f"median compiled step {med['untracked'] * 1e3:.2f} ms untracked, "
              f"{med['tracked'] * 1e3:.2f} ms tracked (ratio {ratio:.4f}); {rounds} interleaved "
              f"rounds x {steps} steps")
    if cuda:
        check("overhead.compiled_step_within_2_percent", ratio <= 1.02, detail)
    else:
        skip("overhead.compiled_step_within_2_percent", "dry run on the CPU, not a GPU figure: " + detail)
    (out / "overhead_compile.rstrace").unlink(missing_ok=True)


def pool_selftest() -> None:
    from ridgescope._compile import summarize_pools
    pools = summarize_pools([{"device": 0, "segment_pool_id": (0, 1), "total_size": 2 << 20,
                              "allocated_size": 512},
                             {"device": 0, "segment_pool_id": (0, 0), "total_size": 2 << 20,
                              "allocated_size": 0}])
    check("selftest.pool_summary", [p["pool_id"] for p in pools] == [[0, 0], [0, 1]]
          and pools[1]["reserved_bytes"] == 2 << 20, str(pools))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("gpu-check-out"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dry-run", action="store_true", help="CPU plumbing check, no GPU")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cuda = torch.cuda.is_available() and not args.dry_run
    FIGURES.update(torch=torch.__version__, cuda=torch.version.cuda, dry_run=args.dry_run)
    if not cuda:
        if not args.dry_run:
            record("FAIL", "setup", "no CUDA device; use --dry-run for the CPU plumbing check")
        else:
            section("selftest", pool_selftest)
            w = gpu_check.Workload("cpu", vocab=64, d_model=32, heads=2, layers=1, seq=16, batch=2)
            section("counters", lambda: counters_check(w, 2, "aot_eager", args.out, False))
            skip("graph_pool.reported", "no CUDA device (dry run)")
            section("overhead", lambda: overhead_check(w, 2, 2, "aot_eager", args.out, False))
    else:
        FIGURES["device"] = torch.cuda.get_device_name(0)
        torch.cuda.init()
        # Small enough that Inductor compiles it in seconds; big enough that a step is GPU-bound.
        w = gpu_check.Workload("cuda", vocab=8192, d_model=512, heads=8, layers=4, seq=256, batch=16)
        section("counters", lambda: counters_check(w, args.steps, "inductor", args.out, True))
        section("graph_pool", lambda: graph_pool_check(w, max(args.steps, 4), args.out))
        big = gpu_check.Workload("cuda", vocab=8192, d_model=1024, heads=16, layers=8, seq=512, batch=16)
        section("overhead", lambda: overhead_check(big, 5, 8, "inductor", args.out, True))
    FIGURES["seconds"] = round(time.perf_counter() - t0, 1)
    return gpu_check.finish(args.out, "gpu_check_compile")


if __name__ == "__main__":
    sys.exit(main())
