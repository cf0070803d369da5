"""An ordinary compiled training script with no ridgescope in it, for `ridgescope run`:

    ridgescope run examples/train_compiled.py --how module --steps 4

It compiles the small GPT-style model of models.py (``--how module``: ``torch.compile(model)``;
``method``: ``model.compile()``; ``step``: ``torch.compile`` of the whole train step;
``graph-break``: a model that breaks its graph on purpose between its blocks), trains it with
AdamW on synthetic tokens and prints the loss of every step. ``--json`` prints instead one line
with the losses (exact, as hex) and Dynamo's counters (frames compiled, recompiles, graph
breaks), the figures a tracked run must reproduce.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from models import TinyGPT, gpt_batch, gpt_loss


class GraphBreakGPT(TinyGPT):
    """TinyGPT whose forward breaks Dynamo's graph after its first block."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device))
        x = self.layers[0](x)
        torch._dynamo.graph_break()  # Dynamo compiles the rest as a second graph
        for block in self.layers[1:]:
            x = block(x)
        return self.head(self.ln_f(x))


def build(how: str, seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    # small enough to compile fast; the graph-break model needs a block on either side
    kwargs = {"vocab": 64, "d_model": 32, "n_heads": 2, "layers": 2 if how == "graph-break" else 1,
              "seq_len": 16, **kwargs}
    model = (GraphBreakGPT if how == "graph-break" else TinyGPT)(**kwargs)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = gpt_loss(model, x, y)
    loss.backward()
    optimizer.step()
    return loss


def compiled_loop(model, optimizer, how: str, mode: str = "default", fullgraph: bool = False,
                  dynamic: bool | None = None):
    """(the module to call, the step to call) for one way of compiling."""
    opts = {"mode": mode, "fullgraph": fullgraph, "dynamic": dynamic}
    if how in ("module", "graph-break"):
        return torch.compile(model, **opts), train_step
    if how == "method":
        model.compile(**opts)
        return model, train_step
    if how == "step":
        return model, torch.compile(train_step, **opts)
    raise ValueError(f"unknown --how {how!r}")


def train(model, optimizer, how: str, steps: int, batch: int = 4, mode: str = "default",
          fullgraph: bool = False, seq_len: int = 16, vocab: int = 64) -> list[float]:
    module, step = compiled_loop(model, optimizer, how, mode, fullgraph)
    losses = []
    for i in range(steps):
        x, y = gpt_batch(batch, seq_len, vocab, seed=i)
        losses.append(step(module, optimizer, x, y).item())
    return losses


def dynamo_counters() -> dict:
    """What Dynamo did: frames it converted, recompiles, graph breaks (by reason)."""
    from torch._dynamo.utils import counters
    return {"frames": dict(counters["frames"]), "recompiles": dict(counters["recompiles"]),
            "graph_break": dict(counters["graph_break"]),
            "unique_graphs": counters["stats"]["unique_graphs"]}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--how", default="module", choices=["module", "method", "step", "graph-break"])
    ap.add_argument("--mode", default="default")
    ap.add_argument("--fullgraph", action="store_true")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--json", action="store_true", help="print losses and Dynamo's counters")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads (1: Inductor's CPU kernels reduce in a fixed order, so "
                         "the losses repeat bit for bit)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, optimizer = build(args.how)
    losses = train(model, optimizer, args.how, args.steps, mode=args.mode,
                   fullgraph=args.fullgraph)
    if args.json:
        print(json.dumps({"losses": [float(v).hex() for v in losses],
                          "counters": dynamo_counters()}, sort_keys=True))
    else:
        for i, loss in enumerate(losses):
            print(f"step {i}: loss {loss:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
