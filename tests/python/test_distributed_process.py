"""Which process a trace came from (docs/distributed.md, "Each trace knows its rank"), without a
process group: the launcher's environment, a run outside any job, and a DDP reducer that cannot
be read."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch

import ridgescope as rs
from ridgescope import _C
from ridgescope.distributed import process_info


def test_environment_gives_the_rank_before_a_process_group_exists() -> None:
    """Given torchrun's variables and no process group, then the rank, world, local rank, node
    and host come from them and the backend is unknown; bad values are not guessed."""
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "GROUP_RANK": "1"}
    info = process_info(env)
    assert (info["rank"], info["world_size"], info["local_rank"], info["local_world_size"],
            info["group_rank"]) == (5, 8, 1, 4, 1)
    assert info["backend"] is None and info["process_group_initialized"] is False
    assert info["host"] == socket.gethostname()
    bad = process_info({"RANK": "x", "WORLD_SIZE": "2"})
    assert (bad["rank"], bad["world_size"], bad["local_rank"]) == (0, 2, None)


def test_single_process_run_is_rank_0_of_1_and_says_nothing_more(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Given an ordinary run outside any job, then the report's distributed section says rank
    0 of 1 with no strategy, and the text report has no rank lines."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with rs.track(model=model, optimizer=opt, out=tmp_path / "run.rstrace") as s:
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
    report = s.report()
    d = report.to_dict()["distributed"]
    assert (d["rank"], d["world_size"], d["strategies"]) == (0, 1, [])
    assert "Rank " not in report.summary()


def test_a_reducer_that_is_not_one_is_a_clear_error() -> None:
    """Given something that is not torch's Reducer, then _C.ddp_buckets raises TypeError (which
    the DDP tracker records in its section instead of stopping the session)."""
    with pytest.raises(TypeError, match="expected DDP's reducer"):
        _C.ddp_buckets(object())
