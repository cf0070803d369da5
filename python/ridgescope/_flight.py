"""The flight recorder's policy (docs/long-runs.md): how many steps' events a trace keeps
(``keep_steps``, ``RIDGESCOPE_KEEP_STEPS``) and ``rs.mark``.

A bounded trace keeps a summary of every step, and the events of the last ``keep_steps`` steps,
of the step with the highest peak and the one before it, and of the steps around each OOM, each
retained-tensor warning and each ``rs.mark()``. ``keep_steps="all"`` keeps every step's events
(the full trace). ``ridgescope run`` and the framework callbacks keep 20 steps by default;
``rs.track`` keeps all unless told otherwise. The environment variable ``RIDGESCOPE_KEEP_STEPS``
(a number or ``all``) replaces either default; an explicit argument replaces the variable.
``rs.mark`` is the session's (_session.py)."""
from __future__ import annotations

import os
from typing import Union

KeepSteps = Union[int, str, None]

ENV = "RIDGESCOPE_KEEP_STEPS"
RUN_DEFAULT = 20      # ridgescope run and the integrations
TRACK_DEFAULT = "all"  # rs.track


def parse_keep_steps(value: KeepSteps, where: str = "keep_steps") -> int:
    """A keep_steps value as the native session takes it: 0 for all, else a positive count.
    Raises ValueError naming ``where`` for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"{where} must be a positive number of steps or 'all', got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{where} must be a positive number of steps or 'all', got {value}")
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "all":
            return 0
        if text.isdigit() and int(text) > 0:
            return int(text)
    raise ValueError(f"{where} must be a positive number of steps or 'all', got {value!r}")


def resolve_keep_steps(value: KeepSteps, default: KeepSteps) -> int:
    """The explicit value, else $RIDGESCOPE_KEEP_STEPS, else the entry point's default."""
    if value is not None:
        return parse_keep_steps(value)
    env = os.environ.get(ENV)
    if env is not None and env.strip():
        return parse_keep_steps(env, where=ENV)
    return parse_keep_steps(default)
