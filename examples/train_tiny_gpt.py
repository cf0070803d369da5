"""The built-in example: train a small GPT-style transformer with AdamW on synthetic tokens
under ridgescope, print the report, and write the trace, the JSON and the text report.

    python examples/train_tiny_gpt.py --out out/demo [--steps 4] [--batch 8] [--checkpointing]

The three ridgescope lines are marked; the rest is an ordinary PyTorch training loop.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import TinyGPT, gpt_batch, gpt_loss  # noqa: E402

import ridgescope as rs  # ridgescope line 1 of 3  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/demo", help="output prefix (default out/demo)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing per block")
    args = ap.parse_args()

    torch.manual_seed(0)
    model = TinyGPT(layers=args.layers, seq_len=args.seq_len, checkpointing=args.checkpointing)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    with rs.track(model=model, optimizer=optimizer, out=f"{out}.rstrace") as session:  # line 2
        for step in range(args.steps):
            x, y = gpt_batch(args.batch, args.seq_len, seed=step)
            optimizer.zero_grad(set_to_none=True)
            loss = gpt_loss(model, x, y)
            loss.backward()
            optimizer.step()
            print(f"step {step}: loss {loss.item():.4f}")
        with rs.phase("checkpoint"):
            torch.save(model.state_dict(), f"{out}.ckpt.pt")

    report = session.report()  # ridgescope line 3 of 3
    text = report.summary()
    print()
    print(text, end="")
    report.to_json(f"{out}.json")
    Path(f"{out}.txt").write_text(text)
    print(f"\nwrote {out}.rstrace (trace), {out}.json (report), {out}.txt (text); "
          f"`ridgescope report {out}.rstrace` prints it again")
    return 0


if __name__ == "__main__":
    sys.exit(main())
