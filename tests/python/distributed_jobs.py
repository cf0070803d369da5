"""The distributed jobs the distributed tests run (not a test file): one process per rank,
launched by ``torch.multiprocessing`` with gloo on the CPU. Every rank runs each scenario twice
with the same seeds, untracked and under ``rs.track``, and writes what torch itself says (bucket
sizes from DDP's reducer, local shards from the DTensors and flat parameters, optimizer state
from the optimizers) next to both loss sequences into ``results.rank<N>.json``. The tests read
those and the traces; nothing here asserts.

Scenarios are small (a 4-layer MLP of 64 wide, 4 steps), so one job of all scenarios costs a few
seconds beyond starting the processes."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.multiprocessing.reductions import StorageWeakRef

import ridgescope as rs

STEPS = 4
WIDTH = 64


class Net(nn.Module):
    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(depth))
        self.head = nn.Linear(WIDTH, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def make_net() -> Net:
    torch.manual_seed(0)
    return Net()


def batch(rank: int, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(size, WIDTH, generator=g), torch.randn(size, 8, generator=g)


def train(model: nn.Module, opt: torch.optim.Optimizer, rank: int, size: int = 16,
          after_backward: Callable[[int], None] | None = None) -> list[float]:
    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        x, y = batch(rank, step, size)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if after_backward is not None:
            after_backward(step)
        opt.step()
        losses.append(loss.item())
    return losses


def tensor_bytes(tensors: Any) -> int:
    """Bytes of distinct storages (a DTensor's local shard): what torch holds for them."""
    seen: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        s = local.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def state_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def tracked(out: Path, name: str, run: Callable[[], list[float]], model: nn.Module,
            opt: torch.optim.Optimizer) -> tuple[list[float], str, str | None]:
    path = out / f"{name}.rstrace"
    with rs.track(model=model, optimizer=opt, out=path) as session:
        losses = run()
    return losses, str(session.path), session.error


# ------------------------------------------------------------------------------ scenarios
def ddp(rank: int, world: int, out: Path, view: bool, name: str,
        sizes: dict[int, int] | None = None, hold: bool = False) -> dict[str, Any]:
    """DDP with small buckets. With ``hold`` (view mode) the loop keeps the first step's
    gradients, views of DDP's first bucket, through the second and third backward, as a
    process group's work may hold a bucket the reducer replaced: that bucket stays alive
    beside the rebuilt ones; the job records its bytes (``held_bytes``)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    size = (sizes or {}).get(rank, 16)
    held: list[torch.Tensor] = []
    held_bytes: list[int] = []

    def keep_first_gradients(step: int) -> None:
        if step == 0:
            held.extend(p.grad for p in net.parameters())
        held_bytes.append(tensor_bytes(held))
        if step == 2:
            held.clear()

    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        net = DDP(make_net(), bucket_cap_mb=0.01, gradient_as_bucket_view=view)
        return net, torch.optim.AdamW(net.parameters())

    net, opt = build()
    plain = train(net, opt, rank, size)
    net, opt = build()
    first = [b.buffer().numel() * b.buffer().element_size()
             for b in net.reducer._get_zeros_like_grad_buckets()]
    hook = keep_first_gradients if hold else None
    losses, path, error = tracked(out, name, lambda: train(net, opt, rank, size, hook), net, opt)
    rebuilt = [b.buffer().numel() * b.buffer().element_size()
               for b in net.reducer._get_zeros_like_grad_buckets()]
    return {"trace": path, "error": error, "losses": losses, "untracked_losses": plain,
            "first_bucket_bytes": first, "bucket_bytes": rebuilt, "held_bytes": held_bytes,
            "parameter_bytes": sum(p.numel() * p.element_size() for p in net.parameters()),
            "optimizer_state_bytes": tensor_bytes(state_tensors(opt))}


def ddp_inner(rank: int, world: int, out: Path) -> dict[str, Any]:
    """DDP with the inner module passed as the model: ``rs.track(model=ddp.module)``."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        net = DDP(make_net(), bucket_cap_mb=0.01)
        return net, torch.optim.AdamW(net.parameters())

    net, opt = build()
    plain = train(net, opt, rank)
    net, opt = build()
    losses, path, error = tracked(out, "ddp_inner", lambda: train(net, opt, rank), net.module, opt)
    return {"trace": path, "error": error, "losses": losses, "untracked_losses": plain,
            "bucket_bytes": [b.buffer().numel() * b.buffer().element_size()
                             for b in net.reducer._get_zeros_like_grad_buckets()]}


def fsdp2(rank: int, world: int, out: Path) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))

    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        net = make_net()
        inner = net.layers[3].forward

        def forward(x: torch.Tensor) -> torch.Tensor:  # a marker phase while layers.3 runs
            with rs.phase("inside layers.3"):
                return inner(x)
        net.layers[3].forward = forward
        for layer in net.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(net.head, mesh=mesh)
        fully_shard(net, mesh=mesh)
        return net, torch.optim.AdamW(net.parameters())

    net, opt = build()
    plain = train(net, opt, rank)
    net, opt = build()
    losses, path, error = tracked(out, "fsdp2", lambda: train(net, opt, rank), net, opt)
    steps = [v for v in state_tensors(opt) if v.dim() == 0]
    return {"trace": path, "error": error, "losses": losses, "untracked_losses": plain,
            "local_shard_bytes": tensor_bytes(net.parameters()),
            "optimizer_state_bytes": tensor_bytes(state_tensors(opt)),
            "step_counter_bytes": tensor_bytes(steps),
            "layer3_full_bytes": sum(p.numel() * p.element_size()
                                     for p in make_net().layers[3].parameters())}


def _blocks(tensors: Any) -> list[list[int]]:
    """[address, bytes] of each distinct storage (a CPU block's address is its data pointer)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            if s.nbytes() > 0:
                seen[s.data_ptr()] = s.nbytes()
    return sorted([a, b] for a, b in seen.items())


# Every communication buffer fsdp2_holds saw: storage (StorageImpl address) -> weak reference
_COMM_SEEN: dict[int, StorageWeakRef] = {}


def forget_comm() -> None:
    """Starts a new run's record of communication buffers."""
    _COMM_SEEN.clear()


def remember_comm(tensors: list[torch.Tensor]) -> None:
    """Notes communication buffers a strategy holds (weakly), for drain_comm_buffers."""
    for t in tensors:
        ref = StorageWeakRef(t.untyped_storage())
        _COMM_SEEN.setdefault(ref.cdata, ref)


def _holds_memory(ref: StorageWeakRef) -> bool:
    """Whether the storage is alive with bytes (FSDP frees unsharded parameters by resizing
    their storage to 0)."""
    if ref.expired():
        return False
    storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
    return storage is not None and storage.nbytes() > 0


def drain_comm_buffers(still_held: list[torch.Tensor], timeout_s: float = 30.0) -> str | None:
    """Waits until every communication buffer the records saw is freed or is one of
    ``still_held`` (what the strategy holds now): gloo's worker thread releases a collective's
    work, and the buffers it holds, some time after the collective completed, and a buffer the
    trace never sees freed cannot be told from a leak. Returns a problem, or None."""
    held = {StorageWeakRef(t.untyped_storage()).cdata for t in still_held}
    deadline = time.monotonic() + timeout_s
    while True:
        pending = [c for c, ref in _COMM_SEEN.items() if c not in held and _holds_memory(ref)]
        if not pending:
            return None
        if time.monotonic() > deadline:
            return f"{len(pending)} communication buffers still alive after {timeout_s} s"
        time.sleep(0.005)


def fsdp2_tensors(net: nn.Module, opt: torch.optim.Optimizer) -> dict[str, list[torch.Tensor]]:
    """What FSDP2 holds now, by category, read from its parameter groups (torch 2.14): the
    local shards, the sharded gradients, the optimizer's state, and as communication buffers
    the unsharded parameters, a pending or kept all-gather output and the reduce-scatter (and
    HSDP all-reduce) buffers it keeps."""
    from torch.distributed.fsdp import FSDPModule
    groups = [g for m in net.modules() if isinstance(m, FSDPModule)
              for g in m._get_fsdp_state()._fsdp_param_groups]
    fsdp_params = [fp for g in groups for fp in g.fsdp_params]
    grads = [fp.sharded_param.grad for fp in fsdp_params if fp.sharded_param.grad is not None]
    comm: list[Any] = [t for fp in fsdp_params for t in getattr(fp, "all_gather_outputs", [])]
    for g in groups:
        result = g._all_gather_result
        comm += [result.all_gather_output] if result is not None else []
        kept = g.comm_ctx.all_gather_state  # the last all-gather's output, kept for its stream
        comm += [kept.all_gather_result.all_gather_output] if kept is not None else []
        comm += [st.reduce_scatter_input for st in g.comm_ctx.reduce_scatter_states]
        comm += [g._all_reduce_state.all_reduce_input] if g._all_reduce_state is not None else []
    return {"parameter": [fp._sharded_param_data for fp in fsdp_params],
            "gradient": [g.to_local() for g in grads],
            "optimizer_state": [t.to_local() if hasattr(t, "to_local") else t
                                for t in state_tensors(opt)],
            "comm_buffer": [t for t in comm if isinstance(t, torch.Tensor)]}


def fsdp2_holds(net: nn.Module, opt: torch.optim.Optimizer) -> dict[str, list[list[int]]]:
    """fsdp2_tensors as [address, bytes] blocks; a buffer that is the sharded gradients' storage
    (HSDP's all-reduce runs in place on them) counts as gradient."""
    tensors = fsdp2_tensors(net, opt)
    remember_comm(tensors["comm_buffer"])
    held = {c: _blocks(ts) for c, ts in tensors.items()}
    held["comm_buffer"] = [b for b in held["comm_buffer"] if b not in held["gradient"]]
    return held


def fsdp2_variant(rank: int, world: int, out: Path, name: str, mp: bool = False,
                  offload: bool = False, hsdp: bool = False) -> dict[str, Any]:
    """FSDP2 with MixedPrecisionPolicy(param_dtype=bfloat16), CPUOffloadPolicy, or HSDP on a
    2 x 2 mesh (replicate x shard). The job records what FSDP2 holds (fsdp2_holds) at the end of
    every forward, backward and optimizer step, inside layers.3's forward (its parameters
    unsharded) and inside each post-backward (the reduce-scatter and all-reduce buffers of the
    group being reduced, read from torch's foreach_reduce as it hands out the gradients)."""
    import sys

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    mesh = (init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
            if hsdp else init_device_mesh("cpu", (world,)))
    kwargs: dict[str, Any] = {}
    if mp:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    records: list[dict[str, Any]] = []
    holds: list[Any] = []
    problems: list[str] = []
    step = [0]

    def record(where: str, extra: list[Any] | None = None) -> None:
        now = holds[0]()
        if extra:
            now["comm_buffer"] = sorted({tuple(b) for b in now["comm_buffer"]} |
                                        {tuple(b) for b in _blocks(extra)
                                         if b not in now["gradient"]})
            now["comm_buffer"] = [list(b) for b in now["comm_buffer"]]
        remember_comm(extra or [])
        records.append({"step": step[0], "where": where, **now})

    def build(tracked_run: bool) -> tuple[nn.Module, torch.optim.Optimizer]:
        net = make_net()
        if tracked_run:
            inner = net.layers[3].forward

            def forward(x: torch.Tensor) -> torch.Tensor:
                with rs.phase("inside layers.3"):
                    record("inside layers.3")
                return inner(x)
            net.layers[3].forward = forward
        for layer in net.layers:
            fully_shard(layer, mesh=mesh, **kwargs)
        fully_shard(net.head, mesh=mesh, **kwargs)
        fully_shard(net, mesh=mesh, **kwargs)
        if tracked_run:
            def post_reduce(param: Any) -> None:
                # called by foreach_reduce once this group's gradients are reduced
                frame = sys._getframe(1)
                held = [frame.f_locals.get(k) for k in ("reduce_scatter_input", "all_reduce_input")]
                with rs.phase("reduced"):
                    record("reduced", [t for t in held if isinstance(t, torch.Tensor)])
            for layer in [*net.layers, net.head]:
                layer.weight.register_post_accumulate_grad_hook(post_reduce)
        return net, torch.optim.AdamW(net.parameters())

    def run(net: nn.Module, opt: torch.optim.Optimizer, tracked_run: bool) -> list[float]:
        losses = []
        for i in range(STEPS):
            step[0] = i
            opt.zero_grad(set_to_none=True)
            x, y = batch(rank, i, 16)
            out_ = net(x)
            if tracked_run:
                record("forward")
            loss = torch.nn.functional.mse_loss(out_.float(), y)
            loss.backward()
            if tracked_run:
                record("backward")
            opt.step()
            if tracked_run:
                record("optimizer_step")
            losses.append(loss.item())
        if tracked_run:  # inside the tracked run: the trace sees the last buffers freed
            kept = [t for ts in fsdp2_tensors(net, opt).values() for t in ts]
            problems.extend(p for p in [drain_comm_buffers(kept)] if p)
        return losses

    net, opt = build(False)
    plain = run(net, opt, False)
    net, opt = build(True)
    forget_comm()
    holds.append(lambda: fsdp2_holds(net, opt))
    losses, path, error = tracked(out, name, lambda: run(net, opt, True), net, opt)
    return {"trace": path, "error": error or (problems[0] if problems else None),
            "losses": losses, "untracked_losses": plain,
            "records": records, "local_shard_bytes": tensor_bytes(net.parameters())}


def fsdp1(rank: int, world: int, out: Path) -> dict[str, Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        net = FSDP(make_net(), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                   device_id=torch.device("cpu"))
        return net, torch.optim.AdamW(net.parameters())

    net, opt = build()
    plain = train(net, opt, rank)
    net, opt = build()
    losses, path, error = tracked(out, "fsdp1", lambda: train(net, opt, rank), net, opt)
    return {"trace": path, "error": error, "losses": losses, "untracked_losses": plain,
            "local_shard_bytes": sum(p.numel() * p.element_size() for p in net.parameters()),
            "optimizer_state_bytes": tensor_bytes(state_tensors(opt))}


def zero(rank: int, world: int, out: Path) -> dict[str, Any]:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        net = DDP(make_net())
        return net, ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.AdamW,
                                            parameters_as_bucket_view=True)

    net, opt = build()
    plain = train(net, opt, rank)
    net, opt = build()
    losses, path, error = tracked(out, "zero", lambda: train(net, opt, rank), net, opt)
    return {"trace": path, "error": error, "losses": losses, "untracked_losses": plain,
            "parameter_bytes": sum(p.numel() * p.element_size() for p in net.parameters()),
            "local_optimizer_state_bytes": tensor_bytes(state_tensors(opt.optim)),
            "bucket_bytes": [b.buffer().numel() * b.buffer().element_size()
                             for b in net.reducer._get_zeros_like_grad_buckets()]}


def killed(rank: int, world: int, out: Path) -> None:
    """Each rank tracks a local loop; rank 1 is killed (SIGKILL) in its third step, after rank
    0 has finished, so no collective waits on it."""
    net = make_net()
    opt = torch.optim.AdamW(net.parameters())
    with rs.track(model=net, optimizer=opt, out=out / "killed.rstrace") as session:
        for step in range(STEPS):
            if rank == 1 and step == 2:
                session.flush()
                deadline = time.monotonic() + 60
                while not (out / "killed.done").exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad(set_to_none=True)
            x, y = batch(rank, step, 16)
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
    (out / "killed.done").write_text("rank 0 finished\n")


SCENARIOS: dict[str, Callable[[int, int, Path], dict[str, Any]]] = {
    "ddp": lambda r, w, o: ddp(r, w, o, view=False, name="ddp"),
    "ddp_view": lambda r, w, o: ddp(r, w, o, view=True, name="ddp_view"),
    "ddp_view_held": lambda r, w, o: ddp(r, w, o, view=True, name="ddp_view_held", hold=True),
    "ddp_inner": ddp_inner,
    # rank 2 trains on a 4x larger batch: it must peak highest in the merged report
    "ddp_skewed": lambda r, w, o: ddp(r, w, o, view=False, name="skewed", sizes={2: 64}),
    "fsdp2": fsdp2,
    "fsdp2_mp": lambda r, w, o: fsdp2_variant(r, w, o, "fsdp2_mp", mp=True),
    "fsdp2_offload": lambda r, w, o: fsdp2_variant(r, w, o, "fsdp2_offload", offload=True),
    "hsdp": lambda r, w, o: fsdp2_variant(r, w, o, "hsdp", hsdp=True),
    "fsdp1": fsdp1,
    "zero": zero,
}


def job(rank: int, world: int, port: int, out: str, scenarios: list[str], kill: bool) -> None:
    """One rank of the job (the target of torch.multiprocessing.start_processes)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    outdir = Path(out)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {name: SCENARIOS[name](rank, world, outdir) for name in scenarios}
    (outdir / f"results.rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
    if kill:
        killed(rank, world, outdir)
