"""ridgescope: where memory goes during PyTorch training.

    import ridgescope as rs
    with rs.track(model=model, optimizer=opt, out="run.rstrace") as session:
        ...  # the training loop, unchanged
    print(session.report().summary())
"""
import torch  # noqa: F401  (loads libtorch before the native module that links it)

from . import _C
from ._errors import RidgescopeError, TraceFormatError
from ._estimate import Estimate, estimate
from ._report import Report, load
from ._session import Session, active_session, mark, phase, track
from ._version import __version__

CATEGORIES = tuple(_C.CATEGORIES)

__all__ = [
    "CATEGORIES",
    "Estimate",
    "Report",
    "RidgescopeError",
    "Session",
    "TraceFormatError",
    "__version__",
    "active_session",
    "estimate",
    "load",
    "mark",
    "phase",
    "track",
]
