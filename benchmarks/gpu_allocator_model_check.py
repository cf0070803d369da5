"""GPU check of the CUDA caching allocator model (issue 7, item 2; docs/fit.md "The allocator
model"): does the model, fed the alloc/free sequence of a real torch memory snapshot, reproduce
the reserved bytes at every segment event and the segment count?

On a CUDA machine (a few seconds per case):

    .venv/bin/python benchmarks/gpu_allocator_model_check.py --out "$OUT"

Each case runs in a fresh Python process with PYTORCH_CUDA_ALLOC_CONF set and
torch.cuda.memory._record_memory_history on before the first CUDA allocation, trains a small
GPT-style model (bf16 autocast, AdamW) for a few steps with one empty_cache() in the middle,
and writes torch's snapshot to OUT/<case>.pickle; then the snapshot is compared with the model
(ridgescope._allocator_model.compare_with_snapshot). The result is ONE JSON object on stdout
(one entry per case: exact or not, the first disagreeing segment event, peaks, segment
counts); exit status 1 if any case is not exact. A snapshot is kept under tests/data by
copying it from OUT (e.g. tests/data/gpu_snapshot_default.pickle) for the CPU test.

Without a GPU:

    .venv/bin/python benchmarks/gpu_allocator_model_check.py --snapshot FILE [--alloc-conf C]

compares an existing snapshot pickle (only dicts, lists, ints, strings: loaded with Python's
pickle, so only open files you trust or ones written by torch's _dump_snapshot).
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "default": "",
    "expandable_segments": "expandable_segments:True",
    "roundup_power2_divisions_4": "roundup_power2_divisions:4",
    "max_split_size_mb_64": "max_split_size_mb:64",
}

_CHILD = r"""
import os, sys, torch
sys.path.insert(0, os.path.join(sys.argv[2], "examples"))
import models
torch.cuda.memory._record_memory_history(max_entries=10_000_000, stacks="python")
torch.manual_seed(0)
model = models.TinyGPT(vocab=8192, d_model=512, n_heads=8, layers=6, seq_len=512).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(4):
    batch = 8 if step % 2 == 0 else 6          # two shapes, as in batched inference
    x, y = models.gpt_batch(batch, 512, 8192, seed=step)
    x, y = x.cuda(), y.cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = models.gpt_loss(model, x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if step == 1:
        torch.cuda.empty_cache()
torch.cuda.synchronize()
torch.cuda.memory._dump_snapshot(sys.argv[1])
torch.cuda.memory._record_memory_history(enabled=None)
print(torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
"""


def compare(path: Path, alloc_conf: str | None) -> dict:
    from ridgescope._allocator_model import compare_with_snapshot
    with open(path, "rb") as f:
        snap = pickle.load(f)
    return compare_with_snapshot(snap, alloc_conf=alloc_conf)


def run_case(name: str, conf: str, out: Path) -> dict:
    snap = out / f"{name}.pickle"
    env = dict(os.environ)
    env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    env.pop("PYTORCH_ALLOC_CONF", None)
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(snap), str(ROOT)], env=env,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return {"case": name, "alloc_conf": conf, "error": proc.stderr[-2000:]}
    peak_alloc, peak_reserved = (int(v) for v in proc.stdout.split()[-2:])
    c = compare(snap, conf)
    c.update(case=name, torch_max_memory_allocated=peak_alloc,
             torch_max_memory_reserved=peak_reserved)
    return c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/allocator_model")))
    ap.add_argument("--snapshot", type=Path, default=None,
                    help="compare this snapshot pickle only (no GPU needed)")
    ap.add_argument("--alloc-conf", default=None,
                    help="with --snapshot: the settings (default: the snapshot's own)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of: "
                    + ", ".join(CASES))
    args = ap.parse_args()
    if args.snapshot is not None:
        result = {"snapshot": str(args.snapshot), **compare(args.snapshot, args.alloc_conf)}
        print(json.dumps(result, indent=2))
        return 0 if result["exact"] else 1
    import torch
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device; use --snapshot FILE on the CPU"}))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    results = [run_case(n, CASES[n], args.out) for n in args.cases.split(",") if n]
    print(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                      "cases": results}, indent=2))
    return 0 if all(r.get("exact") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
