"""``ridgescope explain FILE``: why the run ran out of memory, and what to change."""
from __future__ import annotations

import argparse
from pathlib import Path

from . import _device_rules
from ._output import emit

HELP = ("Explain a trace's out-of-memory errors (verdict, evidence, remedies) and what "
        "periodic dashboards would have shown next to the true peak.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path,
                        help="a ridgescope trace (.rstrace) or a torch memory snapshot pickle")
    parser.add_argument("--request", default=None, metavar="SIZE",
                        help="also answer: could a request of SIZE (e.g. 800MiB, or bytes) be served "
                             "from the allocator's cache at the peak?")
    parser.add_argument("--at", default="peak", metavar="SECONDS|peak",
                        help="the instant --request is asked about: 'peak' (default) or seconds "
                             "since tracking started")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="write the explanation to this file instead of standard output")
    _device_rules.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from .._report import load
    from .._reporters._text import render_explain

    from .._errors import RidgescopeError
    from .._format import parse_bytes

    request = None
    if args.request is not None:
        try:
            request = parse_bytes(args.request)
        except ValueError as exc:
            raise RidgescopeError(f"--request: {exc}") from None

    options = _device_rules.load_options(args)
    if args.at == "peak":
        data = load(args.file, **options).to_dict()
    else:
        try:
            seconds = float(args.at)
            if seconds < 0:
                raise ValueError
        except ValueError:
            raise RidgescopeError(f"--at: expected 'peak' or seconds since tracking started, got {args.at!r}") from None
        load(args.file, **options)  # the same clear errors for a file that is not a trace
        data = load(args.file, probe_time_ns=int(seconds * 1e9), **options).to_dict()
    text = render_explain(data, request=request)
    emit(text, args.output)
    return 0
