"""What a tracked process does when it is told to stop (docs/long-runs.md): on SIGTERM and
SIGINT the trace is flushed, on SIGUSR1 it is flushed and the run goes on, and at interpreter
exit (an unhandled exception included) a session still running is stopped, so a job a scheduler
or torchrun kills leaves every rank's trace whole up to that moment.

Each handler chains to the one installed before it (the script's or its framework's) and never
swallows the signal: a previous Python handler is called (SIGINT's default raises
KeyboardInterrupt, whose unwinding stops the session); where the previous action was the
system's default, the session is stopped and the signal raised again with that default, so the
process ends as it would have, with the same status; an ignored signal stays ignored (the trace
is only flushed). SIGUSR1's default action, ending the process, is the one thing not done: the
user asked for a flush. Handlers can only be set from the main thread; a session started from
another thread has none (atexit still stops it). A handler installed over ours later is left in
place at stop."""
from __future__ import annotations

import atexit
import os
import signal
import threading
from typing import Any, Callable

_FLUSH_ONLY = {getattr(signal, "SIGUSR1", None)} - {None}
_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGINT", None),
                             getattr(signal, "SIGUSR1", None)) if s is not None)


class SignalFlush:
    """The handlers of one session: ``install()`` at start, ``remove()`` at stop."""

    def __init__(self, flush: Callable[[], None], stop: Callable[[], None]) -> None:
        self._flush = flush
        self._stop = stop
        self._previous: dict[int, Any] = {}
        self._installed: dict[int, Callable[[int, Any], Any]] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in _SIGNALS:
            try:
                previous = signal.getsignal(sig)
                handler = self._make(sig)
                signal.signal(sig, handler)
            except (ValueError, OSError, TypeError):
                continue  # not settable here (an embedded interpreter, a restricted platform)
            self._previous[sig] = previous
            self._installed[sig] = handler

    def remove(self) -> None:
        for sig, handler in list(self._installed.items()):
            try:
                if signal.getsignal(sig) is handler:  # nobody installed over ours: put theirs back
                    signal.signal(sig, self._previous[sig])
            except (ValueError, OSError, TypeError):
                pass
        self._installed.clear()
        self._previous.clear()

    def _make(self, sig: int) -> Callable[[int, Any], Any]:
        def handler(signum: int, frame: Any) -> Any:
            previous = self._previous.get(signum, signal.SIG_DFL)
            try:
                self._flush()
            except Exception:  # flushing is an aid: the signal goes on regardless
                pass
            if callable(previous):
                return previous(signum, frame)
            if previous == signal.SIG_IGN or signum in _FLUSH_ONLY:
                return None
            # The system's default action (terminate): the trace is closed first, then the
            # signal is delivered again as if we had never been there.
            try:
                self._stop()
            except Exception:
                pass
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return None
        return handler


_exit_stops: list[Callable[[], None]] = []


def stop_at_exit(stop: Callable[[], None]) -> None:
    """Runs ``stop`` at interpreter exit unless ``forget_at_exit`` was called for it."""
    if not _exit_stops:
        atexit.register(_run_exit_stops)
    _exit_stops.append(stop)


def forget_at_exit(stop: Callable[[], None]) -> None:
    if stop in _exit_stops:
        _exit_stops.remove(stop)


def _run_exit_stops() -> None:
    for stop in list(_exit_stops):
        try:
            stop()
        except Exception:
            pass
    _exit_stops.clear()
