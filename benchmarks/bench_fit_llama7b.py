"""How long `ridgescope fit` takes, and how much memory, on a 7B Llama-style model.

The built-in ``llama-7b`` spec (hidden 4096, 32 layers, 32 heads, SwiGLU 11008, vocab 32000,
RMSNorm, rotary embeddings, SDPA attention), bf16 weights, AdamW, batch 1, dry-run for a CUDA
target (two training steps: the first creates the optimizer state) in this process. Measures
the wall time of ``rs.estimate`` (import excluded; model construction, the two steps under fake
tensors, the trace analysis and the allocator model included) and the process's maximum
resident memory (``resource.getrusage``, the whole process: Python, torch and ridgescope).

Targets (issue 7): under 60 s and under 4 GiB resident on the 2-core CI machine.

    .venv/bin/python benchmarks/bench_fit_llama7b.py [--seq-len 2048] [--batch-size 1]

Prints ONE JSON object on stdout (schema_version 1); progress and errors go to stderr. Run it
in a fresh process: the resident-memory figure is a high-water mark.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--capacity", default="80GiB")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()

    t0 = time.perf_counter()
    import torch
    import ridgescope as rs
    from ridgescope._zoo import SPECS
    import_s = time.perf_counter() - t0
    rss_after_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    spec = SPECS["llama-7b"]
    t1 = time.perf_counter()
    est = rs.estimate(spec.make_model, spec.make_optimizer, spec.make_batch, device="cuda",
                      capacity=args.capacity, dtype_policy="bf16", steps=args.steps,
                      batch_size=args.batch_size, seq_len=args.seq_len, remedies=False)
    wall = time.perf_counter() - t1
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model = est.report.to_dict()["model"]
    out = {
        "schema_version": 1,
        "benchmark": "fit_llama7b",
        "spec": "llama-7b",
        "parameters": model["parameters"],
        "dtype_policy": "bf16",
        "optimizer": "AdamW",
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "steps": args.steps,
        "wall_s": round(wall, 3),
        "import_s": round(import_s, 3),
        "max_rss_bytes": rss,
        "max_rss_after_import_bytes": rss_after_import,
        "targets": {"wall_s": 60, "max_rss_bytes": 4 * 2**30},
        "meets_targets": wall < 60 and rss < 4 * 2**30,
        "predicted": {
            "peak_allocated_bytes": est.peak_allocated,
            "peak_reserved_bytes": est.peak_reserved,
            "fits": est.fits,
            "capacity_bytes": est.capacity,
            "peak_phase": est.report.peak["phase"],
            "peak_step": est.report.peak["step"],
            "by_category": {k: v for k, v in est.by_category.items() if v},
            "activation_peak_bytes": est.activation_peak,
        },
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__},
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
