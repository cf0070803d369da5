"""The dry run (rs.estimate) against a tracked real run, on the CPU.

Two sets of workloads:

* ``foundation``: the foundation issue's workloads (examples/models.py's MLP and TinyGPT, with
  and without activation checkpointing, and the built-in ``tiny-llama`` spec), FP32;
* ``zoo``: the six models of the GPU check's zoo (benchmarks/fit_zoo.py, at its CPU scale),
  each in FP32 and under ``torch.autocast("cpu", dtype=torch.bfloat16)``.

Each row runs in its own subprocess (a fresh interpreter: no allocator, autocast or module
state carries over). There the same model, optimizer (AdamW) and batches are (a) trained for
two steps under ``rs.track`` (the truth: ridgescope's own CPU allocator tracking, exact) and
(b) dry-run by ``rs.estimate(device="cpu")`` with the same dtype policy. Compared: the peak,
the activation peak (largest activation bytes at any phase's peak or end), every phase's peak,
and the parameter bytes at the peak, the gradient bytes at the end of every backward and the
optimizer-state bytes after the first step (these three must be exact). Prints a table on
stderr and ONE JSON object on stdout. The numbers in docs/accuracy.md §3 and docs/fit.md come
from this script.

    .venv/bin/python benchmarks/fit_accuracy_cpu.py [--set foundation|zoo|all] [--only NAME]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def foundation(name: str):
    """(make_model, make_batch, loss_fn) of one of the foundation issue's workloads."""
    import torch
    sys.path.insert(0, str(ROOT / "examples"))
    import models
    from ridgescope._zoo import SPECS

    def gpt(**kw):
        def make():
            torch.manual_seed(0)
            return models.TinyGPT(vocab=256, d_model=64, layers=2, seq_len=32, **kw)
        return make

    def mlp():
        torch.manual_seed(0)
        return models.MLP(d_in=128, hidden=256, d_out=10, layers=3)

    def loss(model, batch):
        x, y = batch
        out = model(x)
        return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    workloads = {
        "mlp": (mlp, lambda: (torch.randn(16, 128), torch.randint(0, 10, (16,)))),
        "tiny-gpt (materialised attention)": (gpt(), lambda: models.gpt_batch(16, 32, 256)),
        "tiny-gpt + checkpointing": (gpt(checkpointing=True),
                                     lambda: models.gpt_batch(16, 32, 256)),
        "tiny-llama (SDPA, RMSNorm, SwiGLU, RoPE)": (
            SPECS["tiny-llama"].make_model,
            lambda: SPECS["tiny-llama"].make_batch(batch_size=4, seq_len=128)),
    }
    make_model, make_batch = workloads[name]
    return make_model, make_batch, loss


FOUNDATION = ["mlp", "tiny-gpt (materialised attention)", "tiny-gpt + checkpointing",
              "tiny-llama (SDPA, RMSNorm, SwiGLU, RoPE)"]


def op_spans():
    """A dispatch mode that records, for every op the tracked run executes, the span of trace
    sequence numbers its kernel wrote (``Session.stats()["events"]`` is the next one). A block
    allocated and freed inside one span is the kernel's internal scratch (oneDNN reorders and
    scratchpads, the CPU flash-attention kernel's per-thread buffers, the CPU batch norm's
    running-statistics temporaries): never an op's output, so a dry run cannot see it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpSpans(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.native = None
            self.spans = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if self.native is None:
                return func(*args, **(kwargs or {}))
            start = self.native.stats()["events"]
            out = func(*args, **(kwargs or {}))
            self.spans.append((start, self.native.stats()["events"], func.__name__))
            return out
    return OpSpans()


def scratch_analysis(trace: str, spans: list[tuple[int, int]]) -> dict:
    """Replays the tracked trace's CPU blocks: the peak with every block (equal to the
    report's), the kernel-internal scratch live at that peak (total, and each block with the
    op whose kernel made it), and the peak without scratch."""
    import bisect
    from ridgescope import _C
    starts = [a for a, _, _ in spans]

    def span_of(alloc_seq, free_seq):
        """The op whose kernel allocated and freed the block, or None."""
        i = bisect.bisect_right(starts, alloc_seq) - 1
        return spans[i][2] if i >= 0 and spans[i][0] <= alloc_seq and free_seq < spans[i][1] \
            else None

    # The sequence numbers the recorder gave (the spans'): the trace's records without the ones
    # its flight recorder added to the file (step summaries, docs/trace_format.md "Version 4").
    events = []
    recorded = 0
    for e in _C.read_events(trace):
        if e.get("flight"):
            continue
        if e["kind"] in ("alloc", "free"):
            events.append(dict(e, seq=recorded))
        recorded += 1
    born: dict[int, int] = {}  # address -> sequence number of its live block's alloc
    is_scratch: dict[int, str | None] = {}  # alloc sequence number -> op it was scratch of
    for e in events:
        if e["kind"] == "alloc":
            born[e["addr"]] = e["seq"]
        elif e["addr"] in born:
            at = born.pop(e["addr"])
            is_scratch[at] = span_of(at, e["seq"])
    live = live_ns = peak = peak_ns = scratch_at_peak = 0
    blocks: dict[int, tuple[int, str | None]] = {}
    at_peak: list[tuple[int, str]] = []
    for e in events:
        if e["kind"] == "alloc":
            scratch = is_scratch.get(e["seq"])
            blocks[e["addr"]] = (e["bytes"], scratch)
            live += e["bytes"]
            live_ns += 0 if scratch else e["bytes"]
            if live > peak:
                peak, scratch_at_peak = live, live - live_ns
                at_peak = sorted(((n, op) for n, op in blocks.values() if op), reverse=True)
            peak_ns = max(peak_ns, live_ns)
        elif e["addr"] in blocks:
            n, scratch = blocks.pop(e["addr"])
            live -= n
            live_ns -= 0 if scratch else n
    return {"peak": peak, "kernel_scratch_at_peak": scratch_at_peak,
            "kernel_scratch_blocks_at_peak": at_peak,
            "peak_without_kernel_scratch": peak_ns}


def train_tracked(model, opt, make_batch, loss_fn, amp, trace: str, spans=None, steps: int = 2):
    """``steps`` training steps under ``rs.track`` (zero_grad(set_to_none=True), batch, loss
    under ``amp``, backward, step); with ``spans`` (``op_spans()``), each op's span of trace
    records is noted. Returns the report."""
    import ridgescope as rs
    with rs.track(model=model, optimizer=opt, out=trace) as s:
        if spans is not None:
            spans.native = s._native
        with spans if spans is not None else contextlib.nullcontext():
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                batch = make_batch()
                with amp:
                    loss = loss_fn(model, batch)
                loss.backward()
                opt.step()
        if spans is not None:
            spans.native = None
    return s.report()


def compare(kind: str, name: str, policy: str, separate_truth: bool = True) -> dict:
    """The tracked real runs, then the dry run, of one workload and dtype policy (in this
    process). ``kind``: "zoo" (benchmarks/fit_zoo.py at its CPU scale) or "foundation".
    ``separate_truth=False`` uses the run with op spans as the truth too (one tracked run)."""
    import torch
    from ridgescope._estimate import activation_peak

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_zoo
    if kind == "zoo":
        make_model, make_batch, loss_fn = fit_zoo.build(name, "cpu")
        adamw = fit_zoo.adamw
    else:
        make_model, make_batch, loss_fn = foundation(name)

        def adamw(model):
            return torch.optim.AdamW(model.parameters(), lr=1e-3)
    amp = (torch.autocast("cpu", dtype=torch.bfloat16) if policy == "bf16-autocast"
           else torch.autocast("cpu", enabled=False))

    def tracked(spans=None):
        """Two tracked steps; with ``spans``, each op's span of trace records is noted."""
        torch.manual_seed(0)
        model = make_model()
        with tempfile.TemporaryDirectory() as tmp:
            trace = str(Path(tmp) / "r.rstrace")
            report = train_tracked(model, adamw(model), make_batch, loss_fn, amp, trace, spans)
            if spans is None:
                return report, None
            scratch = scratch_analysis(trace, spans.spans)
            assert scratch["peak"] == report.peak_bytes, (scratch, report.peak_bytes)
            return report, scratch

    # The tracked run with the op spans, and (separate_truth) the truth without them: the
    # dispatch mode itself can keep a CPU scalar alive a little longer (8 bytes more at the
    # MLP's peak, in "span_run_peak_difference"; 0 for the other models).
    t0 = time.perf_counter()
    with_spans, scratch = tracked(op_spans())
    real = tracked()[0] if separate_truth else with_spans
    tracked_s = time.perf_counter() - t0
    torch.manual_seed(0)
    t0 = time.perf_counter()
    est = fit_zoo.predict(make_model, make_batch, loss_fn, policy, "cpu", adamw)
    dry_s = time.perf_counter() - t0

    def phase(r, name, i=0):
        return [p for p in r.phases() if p["phase"] == name][i]

    rp, ep = real.peak["by_category"], est.by_category
    return {
        "set": kind, "workload": name, "policy": policy,
        "real_peak": real.peak_bytes, "dry_peak": est.peak_allocated,
        "peak_error": est.peak_allocated / real.peak_bytes - 1,
        "kernel_scratch_at_real_peak": scratch["kernel_scratch_at_peak"],
        "kernel_scratch_blocks_at_real_peak": scratch["kernel_scratch_blocks_at_peak"],
        "span_run_peak_difference": with_spans.peak_bytes - real.peak_bytes,
        "real_peak_without_kernel_scratch": scratch["peak_without_kernel_scratch"],
        "peak_error_without_kernel_scratch":
            est.peak_allocated / scratch["peak_without_kernel_scratch"] - 1,
        "real_peak_at": [real.peak["step"], real.peak["phase"]],
        "dry_peak_at": [est.report.peak["step"], est.report.peak["phase"]],
        "real_activation_peak": activation_peak(real),
        "dry_activation_peak": est.activation_peak,
        "activation_error": est.activation_peak / activation_peak(real) - 1,
        "parameter_bytes": [rp["parameter"], ep["parameter"]],
        "parameter_exact": rp["parameter"] == ep["parameter"],
        "gradient_exact": all(
            a["end_by_category"]["gradient"] == b["end_by_category"]["gradient"]
            for a, b in zip(real.phases("backward"), est.report.phases("backward"),
                            strict=True)),
        "optimizer_state_exact": (
            phase(real, "optimizer_step")["end_by_category"]["optimizer_state"]
            == phase(est.report, "optimizer_step")["end_by_category"]["optimizer_state"]),
        "phase_peaks": [[p["step"], p["phase"], p["peak_bytes"], q["peak_bytes"]]
                        for p, q in zip(real.phases(), est.report.phases(), strict=True)],
        "real_by_category": rp, "dry_by_category": ep,
        "tracked_s": round(tracked_s, 2), "dry_s": round(dry_s, 2),
    }


def rows_to_run(which: str, only: str | None) -> list[tuple[str, str, str]]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_zoo
    todo = []
    if which in ("foundation", "all"):
        todo += [("foundation", n, "fp32") for n in FOUNDATION]
    if which in ("zoo", "all"):
        todo += [("zoo", n, p) for n in fit_zoo.ZOO for p in fit_zoo.POLICIES]
    return [t for t in todo if only is None or t[1] == only]


def main() -> int:
    parser = argparse.ArgumentParser(description="rs.estimate vs a tracked run on the CPU")
    parser.add_argument("--set", default="all", choices=["foundation", "zoo", "all"])
    parser.add_argument("--only", default=None, help="one workload (its name)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per row")
    parser.add_argument("--_one", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._one:
        print("RESULT " + json.dumps(compare(*args._one)))
        return 0

    import torch
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
    rows, failures = [], []
    print(f"{'workload':<40} {'policy':<14} {'peak err':>9} {'no scratch':>9} {'act err':>9}  "
          "exact p/g/s", file=sys.stderr)
    for kind, name, policy in rows_to_run(args.set, args.only):
        proc = subprocess.run([sys.executable, __file__, "--_one", kind, name, policy],
                              capture_output=True, text=True, timeout=args.timeout, env=env,
                              cwd=ROOT)
        line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            failures.append({"workload": name, "policy": policy,
                             "error": (proc.stderr or proc.stdout)[-2000:]})
            print(f"FAILED {name} {policy}: {failures[-1]['error'][-600:]}", file=sys.stderr)
            continue
        r = json.loads(line[len("RESULT "):])
        rows.append(r)
        print(f"{r['workload'][:40]:<40} {r['policy']:<14} {r['peak_error']:>+9.3%} "
              f"{r['peak_error_without_kernel_scratch']:>+9.3%} {r['activation_error']:>+9.3%}"
              f"  {r['parameter_exact']}/{r['gradient_exact']}/{r['optimizer_state_exact']}  "
              f"peak {r['real_peak']:,} (dry {r['dry_peak']:,}, scratch at the real peak "
              f"{r['kernel_scratch_at_real_peak']:,})", file=sys.stderr)
    print(json.dumps({"schema_version": 2, "torch": torch.__version__,
                      "date": time.strftime("%Y-%m-%d", time.gmtime()),
                      "rows": rows, "failures": failures}, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
