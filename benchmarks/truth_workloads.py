"""The workloads of the ground-truth benchmark for snapshot inference (benchmarks/
inference_truth.py; not a benchmark by itself). Each is a tiny CPU training (or inference) run
of a different shape, tracked live by ridgescope, where every category is exact: the model and
optimizer are built before tracking starts (as in a torch snapshot recorded after the model was
built), then 2 to 4 steps run under ``rs.track(..., stacks="python")``.

The stack of every free, which torch records by default (``_record_memory_history(context=
"all")``) and ridgescope's live trace does not, comes from torch.profiler running around the
same run (``profile_memory=True, with_stack=True``): each free's Python calls and, in backward,
the autograd node being evaluated, written next to the trace as ``<trace>.frees.json``.

``WORKLOADS`` maps a name to a function ``(out_dir, steps) -> trace path`` that runs it and
returns the ridgescope trace it wrote (DDP: rank 0's)."""
from __future__ import annotations

import contextlib
import copy
import json
import os
import socket
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

import ridgescope as rs

Run = Callable[[Path, int], Path]
WORKLOADS: dict[str, Run] = {}


def workload(fn: Run) -> Run:
    WORKLOADS[fn.__name__] = fn
    return fn


NODE_PREFIX = "autograd::engine::evaluate_function: "


@contextlib.contextmanager
def free_stacks(path: Path):
    """Records the stack of every free of c10's CPU allocator while the block runs, with
    torch.profiler, into ``path`` (JSON: ``[ptr, bytes, frames]`` in time order, frames
    innermost first as ``{filename, line, name}``, an autograd node as ``<autograd>``; a Python
    frame's line is its function's first line, which is what the profiler keeps)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True) as prof:
        yield
    frees, calls = [], []
    todo = list(prof.profiler.kineto_results.experimental_event_tree())
    events = []
    while todo:
        e = todo.pop()
        todo.extend(e.children)
        events.append(e)
        if e.tag in (_EventType.PyCall, _EventType.PyCCall):
            calls.append(e)
    calls.sort(key=lambda c: c.start_time_ns)
    for e in events:
        if e.tag != _EventType.Allocation or e.typed[1].alloc_size >= 0:
            continue
        frames = []
        q = e.parent
        if q is None:  # freed outside any op (inside a C++ call such as DDP's reducer's): the
            # innermost Python call (or call of a C function from Python) around it on its thread
            around = [c for c in calls if c.start_time_ns <= e.start_time_ns <= c.end_time_ns
                      and c.start_tid == e.start_tid]
            q = max(around, key=lambda c: c.start_time_ns) if around else None
        while q is not None:
            if q.tag == _EventType.PyCall:
                cs = q.typed[1].callsite
                frames.append({"filename": cs.file_name, "line": cs.line_number, "name": cs.function_name})
            elif q.tag == _EventType.TorchOp and q.name.startswith(NODE_PREFIX):
                frames.append({"filename": "<autograd>", "line": 0, "name": q.name[len(NODE_PREFIX):]})
            q = q.parent
        frees.append((e.start_time_ns, e.typed[1].ptr, -e.typed[1].alloc_size, frames))
    frees.sort(key=lambda f: f[0])
    path.write_text(json.dumps([f[1:] for f in frees]))


# Extra rs.track() arguments for every workload (benchmarks/activation_modes.py runs each with
# activations=True and with activations=False); and whether to record the frees' stacks.
TRACK_OPTIONS: dict = {}
FREE_STACKS = True


def tracked(out: Path, name: str, model: nn.Module, opt: torch.optim.Optimizer | None,
            loop: Callable[[], None]) -> Path:
    path = out / f"{name}.rstrace"
    frees = free_stacks(Path(f"{path}.frees.json")) if FREE_STACKS else contextlib.nullcontext()
    with frees:
        with rs.track(model=model, optimizer=opt, out=path, stacks="python", **TRACK_OPTIONS) as session:
            loop()
    if session.error:
        raise RuntimeError(f"{name}: tracking failed: {session.error}")
    return Path(session.path)


class Tower(nn.Module):
    """An MLP tower: ``depth`` blocks of Linear, GELU."""

    def __init__(self, width: int = 64, depth: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def batch(step: int, n: int = 32, width: int = 64, classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(n, width, generator=g), torch.randint(0, classes, (n,), generator=g)


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, steps: int,
                loss_of: Callable[[int], torch.Tensor]) -> Callable[[], None]:
    def loop() -> None:
        for i in range(steps):
            opt.zero_grad(set_to_none=True)
            loss_of(i).backward()
            opt.step()
    return loop


# ------------------------------------------------------------------------------ workloads
@workload
def cnn_batchnorm(out: Path, steps: int) -> Path:
    """A conv net with batch norm, SGD with momentum."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def loss(i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, 3, 16, 16, generator=g)
        return F.cross_entropy(model(x), torch.randint(0, 10, (8,), generator=g))
    return tracked(out, "cnn_batchnorm", model, opt, train_steps(model, opt, steps, loss))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 128, d: int = 64, heads: int = 4, layers: int = 2, seq: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos[: idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def lm_loss(model: nn.Module, i: int, batch_size: int = 4, seq: int = 32, vocab: int = 128) -> torch.Tensor:
    g = torch.Generator().manual_seed(i)
    idx = torch.randint(0, vocab, (batch_size, seq + 1), generator=g)
    logits = model(idx[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())


@workload
def transformer_adamw(out: Path, steps: int) -> Path:
    """A two-layer transformer LM, AdamW."""
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return tracked(out, "transformer_adamw", model, opt, train_steps(model, opt, steps, lambda i: lm_loss(model, i)))


class CheckpointedTower(Tower):
    def __init__(self, reentrant: bool) -> None:
        super().__init__(width=64, depth=4)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint
        if self.reentrant:
            x.requires_grad_(True)
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=self.reentrant)
        return self.head(x)


def checkpointed(out: Path, steps: int, reentrant: bool) -> Path:
    torch.manual_seed(0)
    model = CheckpointedTower(reentrant)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss(i: int) -> torch.Tensor:
        x, y = batch(i, n=64)
        return F.cross_entropy(model(x), y)
    name = "checkpoint_reentrant" if reentrant else "checkpoint_nonreentrant"
    return tracked(out, name, model, opt, train_steps(model, opt, steps, loss))


@workload
def checkpoint_reentrant(out: Path, steps: int) -> Path:
    """Activation checkpointing per block, use_reentrant=True, Adam."""
    return checkpointed(out, steps, True)


@workload
def checkpoint_nonreentrant(out: Path, steps: int) -> Path:
    """Activation checkpointing per block, use_reentrant=False, Adam."""
    return checkpointed(out, steps, False)


@workload
def grad_accumulation(out: Path, steps: int) -> Path:
    """Two micro-batches per optimizer step (gradients accumulated), SGD with momentum."""
    torch.manual_seed(0)
    model = Tower()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def loop() -> None:
        for i in range(steps):
            opt.zero_grad(set_to_none=True)
            for micro in range(2):
                x, y = batch(10 * i + micro)
                (F.cross_entropy(model(x), y) / 2).backward()
            opt.step()
    return tracked(out, "grad_accumulation", model, opt, loop)


@workload
def bf16_autocast(out: Path, steps: int) -> Path:
    """The transformer LM under CPU autocast to bfloat16, AdamW."""
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss(i: int) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return lm_loss(model, i)
    return tracked(out, "bf16_autocast", model, opt, train_steps(model, opt, steps, loss))


class LoRALinear(nn.Module):
    """A frozen linear layer with a trainable low-rank adapter."""

    def __init__(self, width: int, rank: int = 4) -> None:
        super().__init__()
        self.base = nn.Linear(width, width)
        self.base.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, width) * 0.01)
        self.b = nn.Parameter(torch.zeros(width, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.t()) @ self.b.t()


@workload
def lora_frozen(out: Path, steps: int) -> Path:
    """Frozen layers (an embedding and a first block), LoRA-style adapters on the others, AdamW
    over the adapters and the head only."""
    torch.manual_seed(0)
    width = 64
    model = nn.Sequential(nn.Linear(width, width), nn.GELU(), *[m for _ in range(3) for m in (LoRALinear(width), nn.GELU())],
                          nn.Linear(width, 10))
    model[0].requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)

    def loss(i: int) -> torch.Tensor:
        x, y = batch(i, n=64)
        return F.cross_entropy(model(x), y)
    return tracked(out, "lora_frozen", model, opt, train_steps(model, opt, steps, loss))


class WithEMA(nn.Module):
    """The trained model and an exponential moving average of its weights (a deep copy whose
    parameters do not train), tracked together so the copy's weights are parameters."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.ema = copy.deepcopy(net).requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@workload
def ema_weights(out: Path, steps: int) -> Path:
    """A tower trained with AdamW and an EMA copy of its weights updated after every step."""
    torch.manual_seed(0)
    both = WithEMA(Tower())
    opt = torch.optim.AdamW(both.net.parameters(), lr=1e-3)

    def loop() -> None:
        for i in range(steps):
            opt.zero_grad(set_to_none=True)
            x, y = batch(i)
            F.cross_entropy(both(x), y).backward()
            opt.step()
            with torch.no_grad():
                for e, p in zip(both.ema.parameters(), both.net.parameters()):
                    e.mul_(0.99).add_(p, alpha=0.01)
    return tracked(out, "ema_weights", both, opt, loop)


@workload
def compiled(out: Path, steps: int) -> Path:
    """torch.compile (Inductor) of a tower, AdamW; the first step compiles."""
    torch.manual_seed(0)
    model = Tower(width=32, depth=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fast = torch.compile(model)

    def loss(i: int) -> torch.Tensor:
        x, y = batch(i, width=32)
        return F.cross_entropy(fast(x), y)
    return tracked(out, "compiled", model, opt, train_steps(model, opt, steps, loss))


class CachedAttention(nn.Module):
    """One decoder layer that keeps a growing key/value cache (torch.cat each token)."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 1), torch.cat([cache[1], v], 1)
        att = torch.softmax(q @ k.transpose(1, 2) / 8.0, -1) @ v
        x = x + self.out(att)
        return x + self.mlp(x), (k, v)


class Decoder(nn.Module):
    def __init__(self, vocab: int = 128, d: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(CachedAttention(d) for _ in range(layers))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor, caches: list | None = None):
        x = self.emb(idx)
        new = []
        for i, layer in enumerate(self.layers):
            x, c = layer(x, None if caches is None else caches[i])
            new.append(c)
        return self.head(x), new


@workload
def inference_kv_cache(out: Path, steps: int) -> Path:
    """Inference only: weights, then generation of 8 tokens per step with a KV cache that grows
    each token (no optimizer, no backward)."""
    torch.manual_seed(0)
    model = Decoder().eval()

    def loop() -> None:
        with torch.no_grad():
            for i in range(steps):
                g = torch.Generator().manual_seed(i)
                idx = torch.randint(0, 128, (2, 16), generator=g)
                logits, caches = model(idx)
                for _ in range(8):
                    nxt = logits[:, -1:].argmax(-1)
                    logits, caches = model(nxt, caches)
                del logits, caches
    return tracked(out, "inference_kv_cache", model, None, loop)


@workload
def sgd_plain(out: Path, steps: int) -> Path:
    """SGD without momentum: no optimizer state at all."""
    torch.manual_seed(0)
    model = Tower()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def loss(i: int) -> torch.Tensor:
        x, y = batch(i)
        return F.cross_entropy(model(x), y)
    return tracked(out, "sgd_plain", model, opt, train_steps(model, opt, steps, loss))


@workload
def leak_across_steps(out: Path, steps: int) -> Path:
    """A leak: every step keeps its logits (detached) and the features of the last block in a
    list that is never cleared, AdamW."""
    torch.manual_seed(0)
    model = Tower()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    kept: list[torch.Tensor] = []

    def loop() -> None:
        for i in range(steps):
            opt.zero_grad(set_to_none=True)
            x, y = batch(i, n=64)
            logits = model(x)
            kept.append(logits.detach())
            F.cross_entropy(logits, y).backward()
            opt.step()
    return tracked(out, "leak_across_steps", model, opt, loop)


# ------------------------------------------------------------------------------ DDP (gloo)
def _ddp_rank(rank: int, world: int, port: int, out: str, steps: int) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        net = DDP(Tower(), bucket_cap_mb=0.02)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)

        def loss(i: int) -> torch.Tensor:
            x, y = batch(100 * rank + i)
            return F.cross_entropy(net(x), y)
        path = Path(out) / f"ddp_gloo.rank{rank}.rstrace"
        with free_stacks(Path(f"{path}.frees.json")):
            with rs.track(model=net, optimizer=opt, out=path, stacks="python") as session:
                train_steps(net, opt, steps, loss)()
        if session.error:
            raise RuntimeError(session.error)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@workload
def ddp_gloo(out: Path, steps: int) -> Path:
    """DistributedDataParallel on gloo, two CPU ranks, AdamW; rank 0's trace."""
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_ddp_rank, args=(2, port, str(out), steps), nprocs=2, join=True, start_method="spawn")
    return out / "ddp_gloo.rank0.rstrace"
