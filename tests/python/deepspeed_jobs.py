"""The DeepSpeed jobs the DeepSpeed tests run (not a test file): one process per rank, launched
by ``torch.multiprocessing`` on the CPU (DeepSpeed's CPU accelerator, gloo). Every rank runs
ZeRO stages 1, 2 and 3 in turn, each twice with the same seeds, untracked and under
``rs.track(model=engine)``, and records at every phase boundary what DeepSpeed itself holds: the
storages (address, bytes) of its partitions, master weights, gradient partitions, reduce
buckets and gathered parameters, read from the ZeRO optimizer and the parameters. The tests
compare those with the blocks the trace tags at the same instants; nothing here asserts.

One launch covers the three stages (DeepSpeed's import costs seconds per process): a 3-layer MLP
of 64 wide, 3 steps per run."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

import ridgescope as rs
from distributed_jobs import drain_comm_buffers, forget_comm, remember_comm

STEPS = 3
WIDTH = 64
BUCKET = 5000        # reduce_bucket_size (elements): filled and reduced inside each backward
PERSISTENCE = 100    # stage3_param_persistence_threshold: the biases stay whole on every rank


def make_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                         nn.Linear(WIDTH, 8))


def no_compiled_ops() -> None:
    """Keeps DeepSpeed from compiling its CPU ops (minutes on a fresh machine): its
    shared-memory collectives (training uses torch.distributed's gloo without them) and
    FusedAdam's CPU kernel (``torch_adam``: torch's AdamW steps the fp32 partition instead)."""
    import deepspeed.ops
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def config(stage: int) -> dict[str, Any]:
    return {"train_micro_batch_size_per_gpu": 16, "steps_per_print": 10**9,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": BUCKET,
                                  "stage3_param_persistence_threshold": PERSISTENCE}}


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(16, WIDTH, generator=g), torch.randn(16, 8, generator=g)


def _blocks(tensors: Any) -> list[list[int]]:
    """[address, bytes] of each distinct storage (a CPU block's address is its data pointer)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 0:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sorted([a, b] for a, b in seen.items())


class Truth:
    """What DeepSpeed holds, by category, at the instants the job asks."""

    def __init__(self, engine: Any, stage: int) -> None:
        self.engine, self.stage, self.zero = engine, stage, engine.optimizer
        self.params = list(engine.module.parameters())
        # the gathered parameters' data: a weak reference (never keeps it alive) and its block
        self.gathered: list[tuple[Any, list[int]]] = []
        self.records: list[dict[str, Any]] = []
        self.step = 0
        if stage == 3:
            for m in engine.module.modules():  # runs after DeepSpeed's fetch hook: gathered now
                m.register_forward_pre_hook(self._gathered)

    def _gathered(self, module: nn.Module, args: Any) -> None:
        from torch.multiprocessing.reductions import StorageWeakRef
        for p in module.parameters(recurse=False):
            if p.data.numel() > 0 and not p.ds_persist:
                s = p.data.untyped_storage()
                self.gathered.append((StorageWeakRef(s), [s.data_ptr(), s.nbytes()]))
                remember_comm([p.data])

    def now(self) -> dict[str, list[list[int]]]:
        z = self.zero
        state = [v for s in z.optimizer.state.values() for v in s.values()
                 if isinstance(v, torch.Tensor)]
        if self.stage < 3:
            fp32 = list(z.single_partition_of_fp32_groups)
            grads = [v for views in z.averaged_gradients.values() for v in views or []]
            grads += [z.grads_in_partition] if z.grads_in_partition is not None else []
            if self.stage == 1:  # autograd's gradients, until DeepSpeed reduces them
                grads += [p.grad for p in self.params if p.grad is not None]
            params = list(z.bit16_groups_flat)
        else:
            fp32 = list(z.fp32_partitioned_groups_flat)
            grads = [z.grad_partitions_flat_buffer]
            params = [z.lp_param_buffer] + [p.data for p in self.params if p.ds_persist]
        grads += [t.grad for t in fp32 if t.grad is not None]
        buckets = self.buckets()
        remember_comm(buckets)
        # gathered parameters still alive (in use, or kept by autograd for backward)
        self.gathered = [(ref, block) for ref, block in self.gathered if not ref.expired()]
        comm = sorted({tuple(b) for b in _blocks(buckets)} | {tuple(b) for _, b in self.gathered})
        return {"parameter": _blocks(params), "optimizer_state": _blocks(fp32 + state),
                "gradient": _blocks(grads), "comm_buffer": [list(b) for b in comm]}

    def buckets(self) -> list[torch.Tensor]:
        """The reduce buckets' buffers (ZeRO-1/2 keeps a list per bucket, ZeRO-3 one)."""
        return [b for bucket in self.zero.ipg_buckets.values()
                for b in (bucket.buffer if self.stage < 3 else [bucket.buffer])]

    def held_now(self) -> list[torch.Tensor]:
        """The reduce buckets and parameters' data DeepSpeed holds now (for drain_comm_buffers)."""
        return self.buckets() + [p.data for p in self.params]

    def record(self, where: str) -> None:
        self.records.append({"step": self.step, "where": where, **self.now()})


def train(engine: Any, rank: int, truth: Truth | None) -> list[float]:
    losses = []
    for step in range(STEPS):
        x, y = batch(rank, step)
        if truth is not None:
            truth.step = step
        out = engine(x)
        if truth is not None:
            truth.record("forward")
        loss = torch.nn.functional.mse_loss(out, y)
        engine.backward(loss)
        if truth is not None:
            truth.record("backward")
        engine.step()
        if truth is not None:
            truth.record("optimizer_step")
        losses.append(loss.item())
    return losses


def run_stage(rank: int, out: Path, stage: int) -> dict[str, Any]:
    import deepspeed
    no_compiled_ops()

    def build() -> Any:
        net = make_net()
        engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(),
                                          config=config(stage))
        return engine

    plain = train(build(), rank, None)
    engine = build()
    forget_comm()
    truth = Truth(engine, stage)
    if stage < 3:
        # inside backward, once DeepSpeed's hook on the first layer's weight (the last gradient
        # autograd makes) has run: the reduce bucket is live
        def inside(param: Any) -> None:
            with rs.phase("bucket check"):
                truth.record("bucket check")
        engine.module[0].weight.register_post_accumulate_grad_hook(inside)
    path = out / f"zero{stage}.rstrace"
    with rs.track(model=engine, out=path) as session:
        losses = train(engine, rank, truth)
        # inside the session: the trace sees the buffers gloo's worker thread lets go of last
        drained = drain_comm_buffers(truth.held_now())
    z = engine.optimizer
    fp32 = z.fp32_partitioned_groups_flat if stage == 3 else z.single_partition_of_fp32_groups
    return {"trace": str(session.path), "error": session.error, "drained": drained,
            "losses": losses,
            "untracked_losses": plain, "records": truth.records,
            "parameters": sum(int(getattr(p, "ds_numel", p.numel())) for p in truth.params),
            "reduce_bucket_bytes": BUCKET * 4,
            "fp32_partition_bytes": sum(t.numel() * t.element_size() for t in fp32)}


def job(rank: int, world: int, port: int, out: str, stages: list[int]) -> None:
    """One rank of the job (the target of torch.multiprocessing.start_processes)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    outdir = Path(out)
    results = {str(stage): run_stage(rank, outdir, stage) for stage in stages}
    (outdir / f"results.rank{rank}.json").write_text(json.dumps(results))
    import torch.distributed as dist
    dist.barrier()
    dist.destroy_process_group()
