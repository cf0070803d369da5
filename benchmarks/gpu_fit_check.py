"""Issue 7, item 5: predicted vs measured peak memory on a real GPU, for a zoo of models.

For each model (an MLP, a CNN, GPT-2 small, a Llama-style decoder, a ViT, and GPT-2 small with
activation checkpointing), in FP32 and with bf16 autocast, a fresh subprocess (a fresh CUDA
context and caching allocator, so no workspace or cached segment carries over):

  1. predicts with ``rs.estimate(device="cuda")`` (fake tensors; nothing on the GPU), then
  2. builds the same model on the GPU, resets the peak statistics, runs the same two training
     steps (zero_grad, forward + loss under the dtype policy, backward, AdamW step) and reads
     ``torch.cuda.max_memory_allocated()`` and ``max_memory_reserved()``.

The prediction counts from the same instant: after the model and optimizer are built (the dry
run registers the parameters then), so both include the parameters and everything the two
steps allocate. Targets (issue 7): allocated, median |error| <= 2 % and worst <= 5 %;
reserved, median |error| <= 5 %.

    python benchmarks/gpu_fit_check.py [--only NAME] [--json OUT] [--predict-only]

Prints a table on stdout, then ONE line "JSON: {...}" with every row and the verdicts (also
written to --json). Exit code 0 when every target is met, 1 when not, 2 when no CUDA device.
Needs torch with CUDA, ridgescope importable (built for this torch) and fit_zoo.py beside it.
``--predict-only`` runs only the dry runs (no GPU needed; exit 0 when all twelve ran).

The zoo (models, GPU shapes, batches, loss, AdamW) is benchmarks/fit_zoo.py, shared with the
CPU check (benchmarks/fit_accuracy_cpu.py), which compares the same models at small shapes
with tracked CPU runs: there the dry run reproduces every tensor the real run's ops return;
what it cannot see on a GPU is listed in docs/fit.md (kernel-internal memory such as cuDNN
convolution workspaces is the largest expected difference, for the CNN).

Status: written on a machine without a GPU; not yet run on one (unverified). The predictions
(``--predict-only``) run on the CPU machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fit_zoo import POLICIES, ZOO, adamw, build, predict  # noqa: E402  (the zoo, shared with the CPU check)


def one(name: str, policy: str, mode: str = "measure") -> dict:
    """Runs in a fresh subprocess: the prediction, then (mode "measure") the measurement."""
    import torch

    make_model, make_batch, loss_fn = build(name, "gpu")
    torch.manual_seed(0)
    t0 = time.perf_counter()
    est = predict(make_model, make_batch, loss_fn, policy, "cuda")
    predict_s = time.perf_counter() - t0
    if mode == "predict":
        return {"model": name, "policy": policy, "predict_s": round(predict_s, 2),
                "predicted_allocated": est.peak_allocated,
                "predicted_reserved": est.peak_reserved,
                "peak_step": est.report.peak["step"], "peak_phase": est.report.peak["phase"],
                "by_category": est.by_category, "torch": torch.__version__}

    dev = torch.device("cuda")
    torch.manual_seed(0)
    with torch.device(dev):
        model = make_model()
    opt = adamw(model)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if policy == "bf16-autocast"
           else torch.autocast("cuda", enabled=False))
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        with torch.device(dev):
            batch = make_batch()
        with amp:
            loss = loss_fn(model, batch)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    measured_alloc = torch.cuda.max_memory_allocated()
    measured_res = torch.cuda.max_memory_reserved()
    # The cuBLAS(Lt) workspaces torch keeps per handle and stream (the dry run predicts one
    # per thread: forward's and autograd's): what memory_allocated() drops by when torch
    # frees them.
    measured_ws = None
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        before = torch.cuda.memory_allocated()
        clear()
        torch.cuda.synchronize()
        measured_ws = before - torch.cuda.memory_allocated()
    predicted_ws = sum(b["bytes"] for b in est.report.to_dict()["peak"]["top_blocks"]
                       if b["category"] == "workspace")
    return {
        "model": name, "policy": policy, "predict_s": round(predict_s, 2),
        "predicted_allocated": est.peak_allocated, "measured_allocated": measured_alloc,
        "allocated_error": est.peak_allocated / measured_alloc - 1,
        "predicted_reserved": est.peak_reserved, "measured_reserved": measured_res,
        "reserved_error": (est.peak_reserved / measured_res - 1) if est.peak_reserved else None,
        "peak_phase": est.report.peak["phase"],
        "predicted_workspace": predicted_ws, "measured_workspace": measured_ws,
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
    }


def _mib(n: "int | None") -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description="predicted vs measured GPU peaks (issue 7)")
    parser.add_argument("--only", default=None, help="one model of the zoo")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--timeout", type=int, default=150, help="seconds per model and policy")
    parser.add_argument("--predict-only", action="store_true",
                        help="only the dry runs (no GPU needed): checks the script and prints "
                             "the predictions")
    parser.add_argument("--_one", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._one:
        print("RESULT " + json.dumps(one(*args._one)))
        return 0

    import torch
    if not args.predict_only and not torch.cuda.is_available():
        print("gpu_fit_check: no CUDA device; nothing measured", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
    rows, failures = [], []
    for name in ([args.only] if args.only else ZOO):
        for policy in POLICIES:
            try:
                mode = "predict" if args.predict_only else "measure"
                proc = subprocess.run([sys.executable, __file__, "--_one", name, policy, mode],
                                      capture_output=True, text=True, timeout=args.timeout,
                                      env=env, cwd=ROOT)
            except subprocess.TimeoutExpired:
                failures.append({"model": name, "policy": policy, "error": "timeout"})
                continue
            line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                failures.append({"model": name, "policy": policy,
                                 "error": (proc.stderr or proc.stdout)[-2000:]})
                continue
            rows.append(json.loads(line[len("RESULT "):]))

    gib = 2 ** 30
    if args.predict_only:
        for r in rows:
            res = f"{r['predicted_reserved'] / gib:.3f}" if r["predicted_reserved"] else "-"
            print(f"{r['model']:<16} {r['policy']:<14} allocated {r['predicted_allocated'] / gib:.3f}"
                  f" GiB  reserved {res} GiB  peak at step {r['peak_step']} {r['peak_phase']}  "
                  f"({r['predict_s']} s)")
    else:
        print(f"{'model':<16} {'policy':<14} {'pred alloc':>10} {'meas alloc':>10} {'err':>7}  "
              f"{'pred res':>9} {'meas res':>9} {'err':>7}  {'ws pred/meas MiB':>16}")
        for r in rows:
            rerr = f"{r['reserved_error']:+.2%}" if r["reserved_error"] is not None else "-"
            pres = f"{r['predicted_reserved'] / gib:.3f}" if r["predicted_reserved"] else "-"
            print(f"{r['model']:<16} {r['policy']:<14} {r['predicted_allocated'] / gib:>10.3f} "
                  f"{r['measured_allocated'] / gib:>10.3f} {r['allocated_error']:>+7.2%}  "
                  f"{pres:>9} {r['measured_reserved'] / gib:>9.3f} {rerr:>7}  "
                  f"{r['predicted_workspace'] / 2**20:>7.2f}/{_mib(r['measured_workspace']):<8}")
    for f in failures:
        print(f"FAILED {f['model']} {f['policy']}: {f['error'][-300:]}")
    if args.predict_only:
        out = {"schema_version": 1, "check": "gpu_fit_predictions", "rows": rows,
               "failures": failures}
        print("JSON: " + json.dumps(out))
        if args.json:
            args.json.write_text(json.dumps(out, indent=2) + "\n")
        return 1 if failures else 0
    aerr = [abs(r["allocated_error"]) for r in rows]
    rerr = [abs(r["reserved_error"]) for r in rows if r["reserved_error"] is not None]
    verdict = {
        "allocated_median_abs_error": statistics.median(aerr) if aerr else None,
        "allocated_worst_abs_error": max(aerr) if aerr else None,
        "reserved_median_abs_error": statistics.median(rerr) if rerr else None,
    }
    verdict["targets_met"] = bool(
        rows and not failures and verdict["allocated_median_abs_error"] <= 0.02
        and verdict["allocated_worst_abs_error"] <= 0.05
        and (verdict["reserved_median_abs_error"] or 1) <= 0.05)
    print("unit: GiB. " + ", ".join(f"{k}={v:.2%}" if isinstance(v, float) else f"{k}={v}"
                                    for k, v in verdict.items()))
    out = {"schema_version": 1, "check": "gpu_fit", "rows": rows, "failures": failures, **verdict}
    print("JSON: " + json.dumps(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0 if verdict["targets_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
