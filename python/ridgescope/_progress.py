"""A progress bar for long report generation: one line on standard error, redrawn in place,
shown only when that stream is a terminal (never in a pipe, a file or a CI log).

    with Progress(["analysing the trace", "rendering"]) as progress:
        with progress.stage("analysing the trace"):
            ...

The stages are known in advance; while one runs (the native analysis releases the GIL) a
background thread redraws the elapsed time a few times a second."""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import IO, Iterator, Sequence

_WIDTH = 24


class Progress:
    def __init__(self, stages: Sequence[str], stream: IO[str] | None = None,
                 enabled: bool | None = None, interval_s: float = 0.2) -> None:
        self._stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self._stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self._stages = list(stages)
        self._done = 0
        self._current = ""
        self._started = 0.0
        self._interval = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn = 0

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Marks `name` as running until the block ends."""
        if not self.enabled:
            yield
            return
        with self._lock:
            self._current = name
            self._started = time.monotonic()
            self._draw()
        self._stop.clear()
        self._thread = threading.Thread(target=self._tick, name="ridgescope-progress", daemon=True)
        self._thread.start()
        try:
            yield
        finally:
            self._stop.set()
            self._thread.join()
            self._thread = None
            with self._lock:
                self._done = min(len(self._stages), self._done + 1)
                self._draw()

    def close(self) -> None:
        """Erases the bar, leaving the terminal line clean for what follows."""
        if self.enabled and self._drawn:
            with self._lock:
                self._stream.write("\r" + " " * self._drawn + "\r")
                self._stream.flush()
                self._drawn = 0

    def _tick(self) -> None:
        while not self._stop.wait(self._interval):
            with self._lock:
                self._draw()

    def _draw(self) -> None:
        total = max(1, len(self._stages))
        filled = round(_WIDTH * self._done / total)
        elapsed = time.monotonic() - self._started
        line = (f"[{'#' * filled}{'-' * (_WIDTH - filled)}] {min(self._done + 1, total)}/{total} "
                f"{self._current} ({elapsed:.1f} s)")
        pad = max(0, self._drawn - len(line))
        self._stream.write("\r" + line + " " * pad)
        self._stream.flush()
        self._drawn = len(line)
