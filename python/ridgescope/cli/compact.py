"""``ridgescope compact FULL -o BOUNDED --keep-steps N``: a full trace made bounded."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = ("Re-record a full trace as a bounded one (docs/long-runs.md): a summary of every step, "
        "and the events of only the last N steps, the highest-peak step and the steps around "
        "each OOM, warning and mark, as `ridgescope run --keep-steps N` would have written it.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", type=Path, help="a full trace (.rstrace)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the bounded trace to write")
    parser.add_argument("--keep-steps", default="20", metavar="N",
                        help="the steps whose events are kept (default 20)")


def run(args: argparse.Namespace) -> int:
    from .. import _C
    from .._errors import RidgescopeError
    from .._flight import parse_keep_steps

    try:
        keep = parse_keep_steps(args.keep_steps, where="--keep-steps")
    except ValueError as exc:
        raise RidgescopeError(str(exc)) from None
    if not args.trace.is_file():
        raise RidgescopeError(f"no such trace: {args.trace}")
    if args.output.resolve() == args.trace.resolve():
        raise RidgescopeError("the bounded trace must go to another file than the full one")
    try:
        r = _C.compact_trace(str(args.trace), str(args.output), keep)
    except _C.TraceError as exc:
        raise RidgescopeError(str(exc)) from None
    except RuntimeError as exc:
        raise RidgescopeError(str(exc).removeprefix("ridgescope: ")) from None
    note = " (the input ended in a torn chunk: its readable prefix was used)" if r["truncated"] else ""
    print(f"wrote {args.output}: {r['steps']} steps summarised, {r['out_bytes']} bytes from "
          f"{r['in_bytes']}{note}", file=sys.stderr)
    return 0
