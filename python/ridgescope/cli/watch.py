"""``ridgescope watch TRACE|DIR``: a live view of a running job, from its growing trace."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HELP = ("Watch a running job from its trace as it grows (docs/long-runs.md): the step and phase "
        "it is in, its live bytes by category, the per-step peaks so far; for a directory of "
        "rank traces, every rank, with the highest marked. Redraws in place on a terminal "
        "(with rich), prints a line per completed step otherwise. Stops when every trace's "
        "session has ended, or on Ctrl-C.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", type=Path,
                        help="a trace being written (.rstrace), or a directory of them (the ranks "
                             "of a job: run.rank*.rstrace); it may not exist yet")
    parser.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                        help="seconds between refreshes (default 1)")
    parser.add_argument("--once", action="store_true",
                        help="read the trace(s) once, show what they hold and exit")
    parser.add_argument("--plain", action="store_true",
                        help="plain lines even on a terminal (one per completed step)")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="stop after this many seconds even if the job still runs")


def _traces(target: Path) -> list[Path]:
    if target.is_dir():
        return sorted(target.glob("*.rstrace"))
    return [target]


def run(args: argparse.Namespace) -> int:
    from .._errors import RidgescopeError
    from .._reporters._watch_view import Watched, final_line, plain_lines, renderable

    if args.interval <= 0:
        raise RidgescopeError(f"--interval must be positive, got {args.interval}")
    watched: dict[Path, Watched] = {}

    def refresh() -> list[Watched]:
        for p in _traces(args.trace):
            if p not in watched:
                watched[p] = Watched(p)
        for w in watched.values():
            w.poll()
        return list(watched.values())

    def done(ws: list[Watched]) -> bool:
        return bool(ws) and all(w.view.get("ended") for w in ws)

    fancy = not args.plain and sys.stdout.isatty()
    if fancy:
        try:
            from rich.console import Console
            from rich.live import Live
        except ImportError:  # rich is optional (ridgescope[watch]): without it, the plain view
            fancy = False
    started = time.monotonic()
    title = f"ridgescope watch {args.trace}"
    if fancy:
        console = Console()
        ws = refresh()
        with Live(renderable(ws, title), console=console, auto_refresh=False) as live:
            while not args.once and not done(ws) and not _timed_out(args, started):
                time.sleep(args.interval)
                ws = refresh()
                live.update(renderable(ws, title), refresh=True)
        for w in ws:
            console.print(final_line(w), highlight=False, markup=False, soft_wrap=True)
        return 0
    ws = refresh()
    while True:
        for line in plain_lines(ws):
            print(line, flush=True)
        if args.once or done(ws) or _timed_out(args, started):
            break
        time.sleep(args.interval)
        ws = refresh()
    for w in ws:
        if not w.view.get("readable") and w.view.get("problem"):
            print(f"{w.path.name}: {w.view['problem']}", flush=True)
        print(final_line(w), flush=True)
    return 0


def _timed_out(args: argparse.Namespace, started: float) -> bool:
    return args.timeout is not None and time.monotonic() - started >= args.timeout
