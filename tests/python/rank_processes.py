"""The ranks of a test's distributed job, started by torch.multiprocessing from a fork server that
has already imported torch, torch.distributed, FSDP, DDP and ridgescope.

With ``spawn`` every rank is a fresh interpreter that imports all of that again (about 4 s a
rank on the 2-core machine: torch 2.14's optimizers import torch._dynamo); a world of 4 paid
it four times at once. The fork server imports it once per pytest worker and forks each rank
from there (measured: the world-4 job's start, 20 s to 6-9 s). A rank is still a process of its
own, with its own process group, allocator and ridgescope session: the fork server has
created no thread, process group or session to inherit."""
from __future__ import annotations

import socket
from typing import Any, Callable

import torch.multiprocessing as mp

PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "torch.distributed.fsdp",
           "torch.nn.parallel", "ridgescope", "ridgescope.distributed", "distributed_jobs"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(target: Callable[..., None], world: int, args: tuple[Any, ...],
              killed_rank: int | None = None) -> None:
    """Runs ``target(rank, *args)`` on ``world`` processes and waits for all of them. A rank that
    fails raises here, except ``killed_rank``, which must end by SIGKILL."""
    mp.set_forkserver_preload(PRELOAD)  # read when the fork server starts: once per worker
    ctx = mp.start_processes(target, nprocs=world, join=False, start_method="forkserver", args=args)
    try:
        while not ctx.join(timeout=60):
            pass
    except mp.ProcessExitedException as exc:
        if not (killed_rank is not None and exc.error_index == killed_rank
                and exc.signal_name == "SIGKILL"):
            raise
