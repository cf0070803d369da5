"""The dry run (rs.estimate) against a tracked real run, on the CPU.

For each workload the same model, optimizer (AdamW) and batch are (a) trained for two steps
under ``rs.track`` and (b) dry-run by ``rs.estimate(device="cpu")``; the figures compared are
the peak, the activation peak (largest activation bytes at any phase's peak or end), and the
parameter, gradient and optimizer-state bytes. Prints a table on stderr and ONE JSON object on
stdout. The numbers in docs/fit.md come from this script.

    .venv/bin/python benchmarks/fit_accuracy_cpu.py
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import models  # noqa: E402
import ridgescope as rs  # noqa: E402
from ridgescope._estimate import activation_peak  # noqa: E402
from ridgescope._zoo import SPECS  # noqa: E402


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


WORKLOADS = {
    "mlp": (mlp, lambda: (torch.randn(16, 128), torch.randint(0, 10, (16,)))),
    "tiny-gpt (materialised attention)": (gpt(), lambda: models.gpt_batch(16, 32, 256)),
    "tiny-gpt + checkpointing": (gpt(checkpointing=True), lambda: models.gpt_batch(16, 32, 256)),
    "tiny-llama (SDPA, RMSNorm, SwiGLU, RoPE)": (
        SPECS["tiny-llama"].make_model,
        lambda: SPECS["tiny-llama"].make_batch(batch_size=4, seq_len=128)),
}


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def main() -> int:
    rows = []
    for name, (make_model, make_batch) in WORKLOADS.items():
        model = make_model()
        opt = adamw(model)
        with tempfile.TemporaryDirectory() as tmp:
            with rs.track(model=model, optimizer=opt, out=Path(tmp) / "r.rstrace") as s:
                for _ in range(2):
                    opt.zero_grad()
                    loss(model, make_batch()).backward()
                    opt.step()
            real = s.report()
        est = rs.estimate(make_model, adamw, make_batch, device="cpu", capacity=None,
                          loss_fn=loss)
        rp, ep = real.to_dict()["peak"]["by_category"], est.by_category
        first = lambda r: [p for p in r.phases() if p["phase"] == "optimizer_step"][0]  # noqa: E731
        rows.append({
            "workload": name,
            "real_peak": real.peak_bytes, "dry_peak": est.peak_allocated,
            "peak_error": est.peak_allocated / real.peak_bytes - 1,
            "real_activation_peak": activation_peak(real),
            "dry_activation_peak": est.activation_peak,
            "activation_error": est.activation_peak / activation_peak(real) - 1,
            "parameter_exact": rp["parameter"] == ep["parameter"],
            "optimizer_state_exact": (first(real)["end_by_category"]["optimizer_state"]
                                      == first(est.report)["end_by_category"]["optimizer_state"]),
            "gradient_exact": all(
                a["end_by_category"]["gradient"] == b["end_by_category"]["gradient"]
                for a, b in zip(real.phases("backward"), est.report.phases("backward"))),
        })
    print(f"{'workload':<42} {'peak err':>9} {'act err':>9}  exact p/g/s", file=sys.stderr)
    for r in rows:
        print(f"{r['workload']:<42} {r['peak_error']:>+9.3%} {r['activation_error']:>+9.3%}  "
              f"{r['parameter_exact']}/{r['gradient_exact']}/{r['optimizer_state_exact']}",
              file=sys.stderr)
    print(json.dumps({"schema_version": 1, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
