"""Shared fixtures and small training loops for the Python tests."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import models  # noqa: E402


@pytest.fixture
def trace_path(tmp_path: Path) -> Path:
    return tmp_path / "run.rstrace"


def param_bytes(model: torch.nn.Module) -> int:
    """The exact bytes of a model's parameters: sum of numel * element_size."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(v.numel() * v.element_size() for s in optimizer.state.values()
               for v in s.values() if isinstance(v, torch.Tensor))


def make_mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return models.MLP(d_in=128, hidden=256, d_out=10, layers=3)


def make_gpt(seed: int = 0, **kwargs) -> torch.nn.Module:
    torch.manual_seed(seed)
    kwargs.setdefault("layers", 2)
    kwargs.setdefault("d_model", 64)
    kwargs.setdefault("seq_len", 32)
    kwargs.setdefault("vocab", 256)
    return models.TinyGPT(**kwargs)


def mlp_batch(batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 128, generator=g), torch.randint(0, 10, (batch,), generator=g)


def mlp_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(x), y)


def gpt_inputs(batch: int, seed: int, seq_len: int = 32, vocab: int = 256):
    return models.gpt_batch(batch, seq_len, vocab, seed=seed)


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
          batch_fn: Callable[[int], tuple], loss_fn: Callable, steps: int = 3,
          micro_batches: int = 1, set_to_none: bool = True) -> list[float]:
    """An ordinary training loop; returns the loss of every micro-batch."""
    losses = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=set_to_none)
        for micro in range(micro_batches):
            x, y = batch_fn(step * micro_batches + micro)
            loss = loss_fn(model, x, y) / micro_batches
            loss.backward()
            losses.append(loss.item())
        optimizer.step()
    return losses
