"""Built-in model specs for ``ridgescope fit`` and ``rs.estimate``: a Llama-style decoder
(RMSNorm, SwiGLU, rotary embeddings, SDPA attention), a GPT-2-style decoder (LayerNorm, GELU,
learned positions; SDPA or materialised attention scores), and their presets.

A spec is what a user's spec file defines (docs/fit.md): ``make_model(**kw)``,
``make_optimizer(model)``, ``make_batch(batch_size=..., seq_len=...)``, and optionally
``DTYPE_POLICY``, ``BATCH_SIZE``, ``SEQ_LEN``, ``loss_fn(model, batch)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint


# --------------------------------------------------------------------------- Llama-style
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.type_as(x)


def rotary_tables(head_dim: int, seq_len: int, theta: float = 10000.0,
                  device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    freqs = torch.outer(torch.arange(seq_len, device=device).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos.to(x.dtype) + _rotate_half(x) * sin.to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        shape = (b, t, self.n_heads, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, c))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, hidden: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(dim)
        self.self_attn = LlamaAttention(dim, n_heads)
        self.post_attention_layernorm = RMSNorm(dim)
        self.mlp = SwiGLU(dim, hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """A Llama-style decoder (the 7B shape: dim 4096, 32 layers, 32 heads, 11008, 32000)."""

    def __init__(self, vocab: int = 32000, dim: int = 4096, layers: int = 32, n_heads: int = 32,
                 hidden: int = 11008, checkpointing: bool = False) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(LlamaBlock(dim, n_heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.head_dim = dim // n_heads
        self.checkpointing = checkpointing

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        cos, sin = rotary_tables(self.head_dim, idx.shape[1], device=idx.device)
        x = self.embed_tokens(idx)
        for layer in self.layers:
            if self.checkpointing:
                x = checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


# --------------------------------------------------------------------------- GPT-2-style
class GPTAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int, sdpa: bool) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.sdpa = sdpa
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # the scores are materialised: (b, heads, t, t)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class GPTBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, sdpa: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = GPTAttention(dim, n_heads, sdpa)
        self.ln_2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.proj = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """A GPT-2-style decoder (GPT-2 small: dim 768, 12 layers, 12 heads, vocab 50257)."""

    def __init__(self, vocab: int = 50257, dim: int = 768, layers: int = 12, n_heads: int = 12,
                 max_seq: int = 1024, sdpa: bool = True, checkpointing: bool = False) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(max_seq, dim)
        self.h = nn.ModuleList(GPTBlock(dim, n_heads, sdpa) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.checkpointing = checkpointing

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        return self.lm_head(self.ln_f(x))


# --------------------------------------------------------------------------- specs
@dataclass
class Spec:
    """A model, its optimizer and its batches, as ``rs.estimate`` takes them."""
    name: str
    description: str
    make_model: Callable[..., nn.Module]
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    make_batch: Callable[..., Any]
    dtype_policy: str | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    loss_fn: Callable[..., Any] | None = None
    defaults: dict[str, Any] = field(default_factory=dict)


def token_batch(vocab: int, default_batch: int, default_seq: int) -> Callable[..., Any]:
    def make_batch(batch_size: int = default_batch, seq_len: int = default_seq):
        x = torch.randint(0, vocab, (batch_size, seq_len))
        y = torch.randint(0, vocab, (batch_size, seq_len))
        return x, y
    return make_batch


def adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-4)


def _llama(name: str, desc: str, dtype: str | None, seq: int, **shape: Any) -> Spec:
    vocab = shape.get("vocab", 32000)
    return Spec(name, desc, lambda checkpointing=False: Llama(checkpointing=checkpointing, **shape),
                adamw, token_batch(vocab, 1, seq), dtype, 1, seq)


def _gpt(name: str, desc: str, dtype: str | None, seq: int, batch: int, **shape: Any) -> Spec:
    vocab = shape.get("vocab", 50257)
    return Spec(name, desc,
                lambda checkpointing=False, sdpa=shape.get("sdpa", True): GPT(
                    checkpointing=checkpointing, sdpa=sdpa,
                    **{k: v for k, v in shape.items() if k != "sdpa"}),
                adamw, token_batch(vocab, batch, seq), dtype, batch, seq)


SPECS: dict[str, Spec] = {s.name: s for s in (
    _llama("llama-7b", "Llama-style 7B (4096 x 32 layers, 32 heads, SwiGLU 11008, vocab "
           "32000), bf16 weights, AdamW, batch 1 x 2048", "bf16", 2048),
    _llama("llama-1b", "Llama-style 1.1B (2048 x 22 layers, 32 heads, 5632), bf16, AdamW",
           "bf16", 2048, dim=2048, layers=22, n_heads=32, hidden=5632),
    _llama("tiny-llama", "Llama-style toy (256 x 2 layers, 4 heads, 688, vocab 1024), fp32",
           None, 128, vocab=1024, dim=256, layers=2, n_heads=4, hidden=688),
    _gpt("gpt2-small", "GPT-2 small (768 x 12 layers, 12 heads, vocab 50257), fp32 AdamW, "
         "batch 8 x 1024, SDPA attention", None, 1024, 8),
    _gpt("tiny-gpt", "GPT-style toy (128 x 2 layers, 4 heads, vocab 512), materialised "
         "attention scores, fp32 AdamW, batch 8 x 64", None, 64, 8,
         vocab=512, dim=128, layers=2, n_heads=4, max_seq=4096, sdpa=False),
)}
