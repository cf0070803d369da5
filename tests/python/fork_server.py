"""Processes the tests start from a fork server that has already imported torch,
torch.distributed, FSDP, DDP and ridgescope: the ranks of a distributed job, and a call that
must run in a fresh process.

With ``spawn`` every process is a fresh interpreter that imports all of that again (about 4 s
on the 2-core machine: torch 2.14's optimizers import torch._dynamo); a world of 4 paid it four
times at once. The fork server imports it once per pytest worker and forks each process from
there (measured: the world-4 job's start, 20 s to 6-9 s). A child is still a process of its
own, with its own process group, allocator and ridgescope session: the fork server has created
no thread, process group or session to inherit. It runs in its main thread, on a stack a few
frames deep, as a script does."""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import socket
from typing import Any, Callable

import torch.multiprocessing as mp

PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "torch.distributed.fsdp",
           "torch.nn.parallel", "ridgescope", "ridgescope.distributed", "distributed_jobs"]


def _context() -> multiprocessing.context.BaseContext:
    mp.set_forkserver_preload(PRELOAD)  # read when the fork server starts: once per worker
    return mp.get_context("forkserver")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(target: Callable[..., None], world: int, args: tuple[Any, ...],
              killed_rank: int | None = None) -> None:
    """Runs ``target(rank, *args)`` on ``world`` processes and waits for all of them. A rank that
    fails raises here, except ``killed_rank``, which must end by SIGKILL."""
    _context()
    ctx = mp.start_processes(target, nprocs=world, join=False, start_method="forkserver", args=args)
    try:
        while not ctx.join(timeout=60):
            pass
    except mp.ProcessExitedException as exc:
        if not (killed_rank is not None and exc.error_index == killed_rank
                and exc.signal_name == "SIGKILL"):
            raise


def call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a process forked from the server; its result (or its exception) comes
    back pickled. For a run whose cost grows with the depth of the Python stack it runs on (a
    profiler recording every frame): under pytest that stack is some 60 frames deep."""
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=_context()) as pool:
        return pool.submit(fn, *args).result()
