"""Which directories hold library code when looking for the user's frame (torch, ridgescope,
the standard library, Inductor's cache): read by the session's site capture and by the model
finder, so it lives in neither."""
from __future__ import annotations

import os
import tempfile

import torch


def _code_roots() -> tuple[list[str], list[str]]:
    """The directories whose files are library code when looking for the user's frame: torch and
    ridgescope, and the standard library (third-party packages installed inside it excepted)."""
    import sysconfig

    def with_real(paths: list[str]) -> list[str]:
        out: list[str] = []
        for p in paths:
            for q in (p, os.path.realpath(p)):
                q = q.rstrip(os.sep) + os.sep
                if q not in out:
                    out.append(q)
        return out

    library = [os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)),
               _inductor_cache_dir()]
    paths = sysconfig.get_paths()
    stdlib = [paths[k] for k in ("stdlib", "platstdlib") if paths.get(k)]
    stdlib.append(os.path.dirname(os.__file__))
    return with_real(library), with_real(stdlib)


def _inductor_cache_dir() -> str:
    """Where Inductor writes the Python code of compiled graphs (torch._inductor's cache_dir(),
    computed without importing Inductor): library code, not the user's."""
    import getpass
    import re

    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if env:
        return env
    try:
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except Exception:
        user = "unknown"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + user)
