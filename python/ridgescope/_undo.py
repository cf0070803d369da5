"""Undoing what a session installed into torch: hook handles (each removed on its own, one that
fails does not stop the others) and patches (restored in reverse order of patching)."""
from __future__ import annotations

from typing import Any, Callable


def remove_all(handles: list[Any], restores: list[Callable[[], None]]) -> None:
    """Removes every handle and runs every restore, newest first; empties both lists."""
    for handle in handles:
        try:
            handle.remove()
        except Exception:
            pass
    handles.clear()
    for restore in reversed(restores):
        restore()
    restores.clear()
