"""Which process of a distributed job this is: rank, world size, local rank, host and backend.

Read from torch.distributed when a process group is initialised, else from the launcher's
environment (torchrun and most launchers set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK). Written into every trace as the `distributed` metadata so traces gathered from
several machines merge by rank, not by file name (docs/distributed.md)."""
from __future__ import annotations

import os
import socket
from typing import Any


def _env_int(environ: "dict[str, str] | os._Environ[str]", *names: str) -> int | None:
    for name in names:
        value = environ.get(name)
        if value is None:
            continue
        try:
            return int(value)
        except ValueError:
            return None
    return None


def process_info(environ: "dict[str, str] | None" = None) -> dict[str, Any]:
    """This process's place in the job. Values that cannot be known are None; a process
    outside any distributed job is rank 0 of a world of 1."""
    env = os.environ if environ is None else environ
    rank = _env_int(env, "RANK")
    world = _env_int(env, "WORLD_SIZE")
    backend = None
    initialized = False
    try:
        dist = torch_distributed()
        if dist is not None and dist.is_initialized():
            initialized = True
            rank = dist.get_rank()
            world = dist.get_world_size()
            backend = str(dist.get_backend())
    except Exception:  # a broken or partial torch.distributed: the environment still answers
        pass
    return {
        "rank": 0 if rank is None else rank,
        "world_size": 1 if world is None else world,
        "local_rank": _env_int(env, "LOCAL_RANK"),
        "local_world_size": _env_int(env, "LOCAL_WORLD_SIZE"),
        "group_rank": _env_int(env, "GROUP_RANK"),  # the node's index under torchrun
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "backend": backend,
        "process_group_initialized": initialized,
    }


_DISTRIBUTED: list[Any] = []  # [torch.distributed, or None where this torch lacks it]


def torch_distributed() -> Any:
    """``torch.distributed`` when this torch has it, imported once: a session asks at every step
    end whether the job's process group has started, and an import statement there would cost
    the import machinery's lookups every step."""
    if not _DISTRIBUTED:
        try:
            import torch.distributed as dist
            _DISTRIBUTED.append(dist if dist.is_available() else None)
        except Exception:  # a broken or partial torch.distributed
            _DISTRIBUTED.append(None)
    return _DISTRIBUTED[0]
