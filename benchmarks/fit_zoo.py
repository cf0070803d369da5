"""The model zoo of the "will it fit" checks (issue 7, item 5): ONE definition used by the GPU
check (benchmarks/gpu_fit_check.py) and the CPU check (benchmarks/fit_accuracy_cpu.py).

Six models, each at two scales with the same architecture:

* ``"gpu"``: the shapes the GPU check measures (a few hundred MiB to a few GiB per step);
* ``"cpu"``: the same layers with small widths, depths and batches, so that a tracked real run
  and a dry run of two AdamW steps take about a second on a 2-core CPU.

| name | model |
|---|---|
| ``mlp`` | Linear + GELU stack (4 hidden layers) |
| ``cnn`` | 6 x (Conv2d 3x3 without bias, BatchNorm2d, ReLU), strides 2/1, global pool, Linear |
| ``gpt2-small`` | GPT-2-style decoder (ridgescope._zoo.GPT, SDPA attention) |
| ``llama`` | Llama-style decoder (ridgescope._zoo.Llama: RMSNorm, SwiGLU, rotary, SDPA) |
| ``vit`` | ViT: Conv2d patch embedding, class token, learned positions, pre-LN blocks (SDPA) |
| ``gpt2-small-ckpt`` | ``gpt2-small`` with activation checkpointing of every block |

``build(name, scale)`` returns ``(make_model(), make_batch(), loss_fn(model, batch))``: the
model is built on the default device (the GPU check wraps the calls in ``torch.device``), the
loss is cross-entropy in float32 of the model's output against integer targets.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

from ridgescope._zoo import GPT, Llama

ZOO = ["mlp", "cnn", "gpt2-small", "llama", "vit", "gpt2-small-ckpt"]
POLICIES = ["fp32", "bf16-autocast"]
SCALES = ("gpu", "cpu")

# name -> scale -> shape. "gpu": what the GPU check measures (kept small enough for the whole
# check to run in a few minutes on one GPU); "cpu": the same architecture, CPU-sized.
SHAPES: dict[str, dict[str, dict[str, Any]]] = {
    "mlp": {"gpu": dict(d_in=1024, hidden=4096, classes=1000, batch=512),
            "cpu": dict(d_in=128, hidden=512, classes=100, batch=64)},
    "cnn": {"gpu": dict(widths=(64, 128, 256), img=128, classes=1000, batch=64),
            "cpu": dict(widths=(16, 32, 64), img=32, classes=100, batch=8)},
    "gpt2-small": {"gpu": dict(model=dict(), vocab=50257, batch=4, seq=512),
                   "cpu": dict(model=dict(vocab=2048, dim=128, layers=2, n_heads=4,
                                          max_seq=128), vocab=2048, batch=4, seq=64)},
    "llama": {"gpu": dict(model=dict(vocab=32000, dim=1024, layers=8, n_heads=16, hidden=2816),
                          vocab=32000, batch=4, seq=512),
              "cpu": dict(model=dict(vocab=2048, dim=128, layers=2, n_heads=4, hidden=352),
                          vocab=2048, batch=4, seq=64)},
    "vit": {"gpu": dict(model=dict(d=384, layers=12, heads=6, patch=16, img=224, classes=1000),
                        batch=32),
            "cpu": dict(model=dict(d=64, layers=2, heads=4, patch=8, img=32, classes=100),
                        batch=8)},
}
SHAPES["gpt2-small-ckpt"] = SHAPES["gpt2-small"]


def ce(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy (in float32) of ``model(x)`` over its last dimension against ``y``."""
    x, y = batch
    out = model(x)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))


def adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-4)


def predict(make_model: Callable[[], nn.Module], make_batch: Callable[[], Any],
            loss_fn: Callable[..., torch.Tensor], policy: str, device: str,
            make_optimizer: Callable[[nn.Module], torch.optim.Optimizer] = adamw) -> Any:
    """The dry run both checks compare: two AdamW steps under ``policy`` ("fp32" or
    "bf16-autocast") predicted for ``device``, no capacity, no remedies."""
    import ridgescope as rs
    return rs.estimate(make_model, make_optimizer, make_batch, device=device, capacity=None,
                       dtype_policy=None if policy == "fp32" else policy, steps=2,
                       loss_fn=loss_fn, remedies=False)


def mlp(d_in: int, hidden: int, classes: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(d_in, hidden), nn.GELU()]
    for _ in range(3):
        layers += [nn.Linear(hidden, hidden), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(hidden, classes))


def cnn(widths: tuple[int, int, int], classes: int) -> nn.Module:
    def block(cin: int, cout: int, stride: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU())
    a, b, c = widths
    return nn.Sequential(block(3, a, 2), block(a, a, 1), block(a, b, 2), block(b, b, 1),
                         block(b, c, 2), block(c, c, 1),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes))


class ViTBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.h = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ViT(nn.Module):
    """ViT-S/16 at the defaults (d 384, 12 layers, 6 heads, 224 x 224 images)."""

    def __init__(self, d: int = 384, layers: int = 12, heads: int = 6, patch: int = 16,
                 img: int = 224, classes: int = 1000) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.zeros(1, (img // patch) ** 2 + 1, d))
        self.blocks = nn.ModuleList(ViTBlock(d, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x[:, 0]))


def build(name: str, scale: str = "gpu") -> tuple[Callable[[], nn.Module],
                                                  Callable[[], Any], Callable[..., torch.Tensor]]:
    """(make_model(), make_batch(), loss_fn(model, batch)) of one zoo model at one scale."""
    if name not in SHAPES:
        raise ValueError(f"unknown model {name!r} (one of {', '.join(ZOO)})")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r} (one of {', '.join(SCALES)})")
    s = SHAPES[name][scale]

    def images(b: int, img: int, classes: int) -> Callable[[], Any]:
        return lambda: (torch.randn(b, 3, img, img), torch.randint(0, classes, (b,)))

    def tokens(vocab: int, b: int, t: int) -> Callable[[], Any]:
        return lambda: (torch.randint(0, vocab, (b, t)), torch.randint(0, vocab, (b, t)))

    if name == "mlp":
        return (lambda: mlp(s["d_in"], s["hidden"], s["classes"]),
                lambda: (torch.randn(s["batch"], s["d_in"]),
                         torch.randint(0, s["classes"], (s["batch"],))), ce)
    if name == "cnn":
        return (lambda: cnn(s["widths"], s["classes"]),
                images(s["batch"], s["img"], s["classes"]), ce)
    if name in ("gpt2-small", "gpt2-small-ckpt"):
        ckpt = name.endswith("ckpt")
        return (lambda: GPT(sdpa=True, checkpointing=ckpt, **s["model"]),
                tokens(s["vocab"], s["batch"], s["seq"]), ce)
    if name == "llama":
        return lambda: Llama(**s["model"]), tokens(s["vocab"], s["batch"], s["seq"]), ce
    m = s["model"]  # vit
    return lambda: ViT(**m), images(s["batch"], m["img"], m["classes"]), ce
