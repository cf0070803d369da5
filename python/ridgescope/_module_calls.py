"""Module calls, seen through ``torch.nn.Module.__call__`` (docs/phases.md, docs/compile.md).

A session learns which module runs (the module context every allocation carries, the root's
``forward``, a recomputation inside backward) at each module call. Global module forward hooks
would tell it too, but while any global hook is registered torch takes the slow path of
``Module._call_impl`` for every module call of the process (a closure, a set and the hook
dictionaries' items per call: about 1.6 µs a call on this project's machine, against 0.7 µs for
this wrapper; docs/performance.md). So while a session tracks, ``Module.__call__`` is this
module's wrapper: it calls the session's ``module_call`` around the original, and the original
takes torch's fast path when the script registered no hooks of its own.

The sessions are held in an ordered dictionary behind a ``RemovableHandle``, as a hook is, so
that a compiled region takes them out and puts them back with the hooks (_compile.py); with none
held the wrapper only calls the original. Dynamo never sees the wrapper: the compile callbacks
put the original ``__call__`` back for each compilation (``hide_for_compile``), so it takes the
same path through a module call (``forward`` directly when no hook is registered) and installs
the same guards as without tracking. The original comes back when the last session ends.
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Any, Callable

import torch
from torch.utils.hooks import RemovableHandle

from ._compile import run_as_python, run_frame_as_python

_is_compiling = torch.compiler.is_compiling

# handle id -> the session's module_call(call, module, args, kwargs); a region empties it
_SESSIONS: "OrderedDict[int, Callable[..., Any]]" = OrderedDict()
_lock = threading.Lock()
_original: Callable[..., Any] = torch.nn.Module.__call__  # what the wrapper calls
_users = 0  # sessions registered and not yet released (hidden or not)
_compile_depth = 0  # open compilations, for which the original is back


def _call(module: Any, *args: Any, **kwargs: Any) -> Any:
    original = _original
    # is_compiling() first: were Dynamo ever to trace this (a compilation its callbacks did not
    # announce) it folds to True there, and the sessions are never read, nor guarded
    if _is_compiling() or not _SESSIONS:
        return original(module, *args, **kwargs)
    # One session at a time (rs.track refuses a second, rs.estimate refuses to run inside one)
    for session_call in _SESSIONS.values():
        return session_call(original, module, args, kwargs)
    return original(module, *args, **kwargs)  # emptied by another thread since the test


# The wrapper's own frame is never converted by Dynamo's frame evaluator (a module called in a
# compiled region's eager part); what it calls is, as without it.
run_frame_as_python(_call)
functools.update_wrapper(_call, _original)  # looks like Module.__call__ (name, signature)


def register(session_call: Callable[..., Any]) -> RemovableHandle:
    """Adds a session's ``module_call(call, module, args, kwargs)`` and puts the wrapper in.
    Returns the handle that takes the session out (``remove()``, or a region's hiding); the
    session calls ``release()`` once it removed it."""
    global _original, _users
    with _lock:
        handle = RemovableHandle(_SESSIONS)
        _SESSIONS[handle.id] = session_call
        _users += 1
        if _compile_depth == 0 and torch.nn.Module.__call__ is not _call:
            _original = torch.nn.Module.__call__
            torch.nn.Module.__call__ = _call  # type: ignore[method-assign]
    return handle


def release() -> None:
    """A session ended: the original ``__call__`` back once no session is left (unless something
    patched over the wrapper since: then the wrapper stays, calling the original)."""
    global _users, _compile_depth
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0:
            _compile_depth = 0  # a compilation left open (its end callback gone with the session)
            if torch.nn.Module.__call__ is _call:
                torch.nn.Module.__call__ = _original  # type: ignore[method-assign]


def hide_for_compile(args: Any = None) -> None:
    """A compilation starts (a Dynamo start callback): the original ``__call__`` for Dynamo."""
    global _compile_depth
    with _lock:
        _compile_depth += 1
        if _compile_depth == 1 and torch.nn.Module.__call__ is _call:
            torch.nn.Module.__call__ = _original  # type: ignore[method-assign]


def show_after_compile(args: Any = None) -> None:
    """A compilation ended (an end callback): the wrapper back while sessions need it."""
    global _compile_depth
    with _lock:
        if _compile_depth == 0:
            return
        _compile_depth -= 1
        if _compile_depth == 0 and _users > 0 and torch.nn.Module.__call__ is _original:
            torch.nn.Module.__call__ = _call  # type: ignore[method-assign]


run_as_python(hide_for_compile, show_after_compile)


def installed() -> bool:
    """Whether ``Module.__call__`` is the wrapper now."""
    return torch.nn.Module.__call__ is _call
