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

    python benchmarks/gpu_fit_check.py [--only NAME] [--json OUT]

Prints a table on stdout, then ONE line "JSON: {...}" with every row and the verdicts (also
written to --json). Exit code 0 when every target is met, 1 when not, 2 when no CUDA device.
Standalone: needs torch with CUDA and ridgescope importable (built for this torch).

Status: written on a machine without a GPU; not yet run on one (unverified).
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

# name -> (model builder source, batch shape); kept small enough for the whole check to run in
# a few minutes on one GPU.
ZOO = ["mlp", "cnn", "gpt2-small", "llama", "vit", "gpt2-small-ckpt"]
POLICIES = ["fp32", "bf16-autocast"]


def build(name: str):
    """(make_model(), make_batch(), loss_fn(model, batch))."""
    import torch
    from torch import nn
    from torch.nn import functional as F
    from ridgescope._zoo import GPT, Llama

    def ce(model, batch):
        x, y = batch
        out = model(x)
        return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))

    def tokens(vocab, b, s):
        return lambda: (torch.randint(0, vocab, (b, s)), torch.randint(0, vocab, (b, s)))

    if name == "mlp":
        def make():
            layers = [nn.Linear(1024, 4096), nn.GELU()]
            for _ in range(3):
                layers += [nn.Linear(4096, 4096), nn.GELU()]
            return nn.Sequential(*layers, nn.Linear(4096, 1000))
        return make, lambda: (torch.randn(512, 1024), torch.randint(0, 1000, (512,))), ce
    if name == "cnn":
        def block(cin, cout, stride):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU())

        def make():
            return nn.Sequential(block(3, 64, 2), block(64, 64, 1), block(64, 128, 2),
                                 block(128, 128, 1), block(128, 256, 2), block(256, 256, 1),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 1000))
        return make, lambda: (torch.randn(64, 3, 128, 128), torch.randint(0, 1000, (64,))), ce
    if name in ("gpt2-small", "gpt2-small-ckpt"):
        ckpt = name.endswith("ckpt")
        return (lambda: GPT(sdpa=True, checkpointing=ckpt), tokens(50257, 4, 512), ce)
    if name == "llama":
        return (lambda: Llama(vocab=32000, dim=1024, layers=8, n_heads=16, hidden=2816),
                tokens(32000, 4, 512), ce)
    if name == "vit":
        class Block(nn.Module):
            def __init__(self, d, h):
                super().__init__()
                self.h = h
                self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
                self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
                self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

            def forward(self, x):
                b, t, c = x.shape
                q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4)
                y = F.scaled_dot_product_attention(q, k, v)
                x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
                return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

        class ViT(nn.Module):
            def __init__(self, d=384, layers=12, heads=6, patch=16, img=224, classes=1000):
                super().__init__()
                self.patch = nn.Conv2d(3, d, patch, patch)
                self.cls = nn.Parameter(torch.zeros(1, 1, d))
                self.pos = nn.Parameter(torch.zeros(1, (img // patch) ** 2 + 1, d))
                self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
                self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

            def forward(self, x):
                x = self.patch(x).flatten(2).transpose(1, 2)
                x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
                for blk in self.blocks:
                    x = blk(x)
                return self.head(self.norm(x[:, 0]))
        return ViT, lambda: (torch.randn(32, 3, 224, 224), torch.randint(0, 1000, (32,))), ce
    raise ValueError(f"unknown model {name!r}")


def adamw(model):
    import torch
    return torch.optim.AdamW(model.parameters(), lr=1e-4)


def one(name: str, policy: str) -> dict:
    """Runs in a fresh subprocess: the prediction, then the measurement."""
    import torch
    import ridgescope as rs

    make_model, make_batch, loss_fn = build(name)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    est = rs.estimate(make_model, adamw, make_batch, device="cuda", capacity=None,
                      dtype_policy=None if policy == "fp32" else policy, steps=2,
                      loss_fn=loss_fn, remedies=False)
    predict_s = time.perf_counter() - t0

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
    return {
        "model": name, "policy": policy, "predict_s": round(predict_s, 2),
        "predicted_allocated": est.peak_allocated, "measured_allocated": measured_alloc,
        "allocated_error": est.peak_allocated / measured_alloc - 1,
        "predicted_reserved": est.peak_reserved, "measured_reserved": measured_res,
        "reserved_error": (est.peak_reserved / measured_res - 1) if est.peak_reserved else None,
        "peak_phase": est.report.peak["phase"],
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="predicted vs measured GPU peaks (issue 7)")
    parser.add_argument("--only", default=None, help="one model of the zoo")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--timeout", type=int, default=150, help="seconds per model and policy")
    parser.add_argument("--_one", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._one:
        print("RESULT " + json.dumps(one(*args._one)))
        return 0

    import torch
    if not torch.cuda.is_available():
        print("gpu_fit_check: no CUDA device; nothing measured", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
    rows, failures = [], []
    for name in ([args.only] if args.only else ZOO):
        for policy in POLICIES:
            try:
                proc = subprocess.run([sys.executable, __file__, "--_one", name, policy],
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
    print(f"{'model':<16} {'policy':<14} {'pred alloc':>10} {'meas alloc':>10} {'err':>7}  "
          f"{'pred res':>9} {'meas res':>9} {'err':>7}")
    for r in rows:
        rerr = f"{r['reserved_error']:+.2%}" if r["reserved_error"] is not None else "-"
        pres = f"{r['predicted_reserved'] / gib:.3f}" if r["predicted_reserved"] else "-"
        print(f"{r['model']:<16} {r['policy']:<14} {r['predicted_allocated'] / gib:>10.3f} "
              f"{r['measured_allocated'] / gib:>10.3f} {r['allocated_error']:>+7.2%}  "
              f"{pres:>9} {r['measured_reserved'] / gib:>9.3f} {rerr:>7}")
    for f in failures:
        print(f"FAILED {f['model']} {f['policy']}: {f['error'][-300:]}")
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
