"""``ridgescope report A B C`` / ``ridgescope report DIR``: the merged report of several rank
traces (called by report.py)."""
from __future__ import annotations

import argparse
import sys

from .._errors import RidgescopeError
from .._report import dumps_report
from ..distributed import expand_inputs, merge_traces
from ._output import emit


def report_ranks(args: argparse.Namespace) -> int:
    from .._progress import Progress

    if args.format == "snapshot":
        raise RidgescopeError("--format snapshot writes one run; name one trace, not several")
    for option, value in (("--tensorboard", getattr(args, "tensorboard", None)),
                          ("--device", getattr(args, "device", None)),
                          ("--rules", getattr(args, "rules", None)),
                          ("--top-blocks", None if getattr(args, "top_blocks", 20) == 20 else 1)):
        if value is not None:
            raise RidgescopeError(f"{option} applies to the report of one trace or snapshot; "
                                  "name one file, not the ranks of a job")
    files = expand_inputs(args.file)
    stages = [f"analysing {len(files)} rank trace(s)", "rendering the report"]
    with Progress(stages) as progress:
        with progress.stage(stages[0]):
            merged = merge_traces(files)
        with progress.stage(stages[1]):
            if args.format == "json":
                text = dumps_report(merged) + "\n"
            elif args.format == "html":
                from .._reporters._ranks_html import render_ranks_html
                text = render_ranks_html(merged)
            else:
                from .._reporters._ranks_text import render_ranks_text
                text = render_ranks_text(merged)
    emit(text, args.output)
    for p in merged["ranks"]["problems"]:
        if p["kind"] in ("truncated", "unreadable"):
            print(f"ridgescope report: warning: {p['message']}", file=sys.stderr)
    return 0
