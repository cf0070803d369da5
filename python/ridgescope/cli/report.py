"""``ridgescope report FILE``: turn a trace into a text or JSON report."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._output import emit

HELP = "Print or write the memory report of a trace (text or JSON)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="a ridgescope trace (.rstrace)")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="text: a short plain-language report (default); json: the full "
                             "report in the schema of docs/report_schema.md")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="write the report to this file instead of standard output")
    parser.add_argument("--top-blocks", type=int, default=20, metavar="N",
                        help="how many of the largest blocks live at the peak to list (default 20)")


def run(args: argparse.Namespace) -> int:
    from .._report import Report, load

    report: Report = load(args.file) if args.top_blocks == 20 else Report.from_trace(args.file, args.top_blocks)
    text = report.to_json() + "\n" if args.format == "json" else report.summary()
    emit(text, args.output)
    for w in report.warnings:
        if w["kind"] == "truncated_trace":
            print(f"ridgescope report: warning: {w['message']}", file=sys.stderr)
    return 0
