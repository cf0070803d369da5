"""An ordinary PyTorch training script with no ridgescope in it, for `ridgescope run`:

    ridgescope run examples/train_plain.py --steps 3

It trains the small GPT-style model of models.py with AdamW on synthetic tokens and prints the
loss of every step.
"""
from __future__ import annotations

import argparse
import sys

import torch

from models import TinyGPT, gpt_batch, gpt_loss


def build(seed: int = 0):
    torch.manual_seed(seed)
    model = TinyGPT(vocab=256, d_model=64, layers=2, seq_len=32)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train(model, optimizer, steps: int, batch: int = 8) -> list[float]:
    losses = []
    for step in range(steps):
        x, y = gpt_batch(batch, 32, 256, seed=step)
        optimizer.zero_grad(set_to_none=True)
        loss = gpt_loss(model, x, y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step}: loss {loss.item():.6f}")
    return losses


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--fail", action="store_true", help="raise after training (for tests)")
    ap.add_argument("--exit-code", type=int, default=0)
    args = ap.parse_args(argv)
    model, optimizer = build()
    train(model, optimizer, args.steps)
    if args.fail:
        raise RuntimeError("the script failed on purpose")
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
