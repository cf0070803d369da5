"""``ridgescope report FILE``: turn a trace into a text or JSON report."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._output import emit

HELP = "Print or write the memory report of a trace (text, JSON or a self-contained HTML page)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="a ridgescope trace (.rstrace)")
    parser.add_argument("--format", choices=("text", "json", "html"), default="text",
                        help="text: a short plain-language report (default); json: the full "
                             "report in the schema of docs/report_schema.md; html: one "
                             "self-contained page with the chart and tables of "
                             "docs/html-report.md (opens with no network)")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="write the report to this file instead of standard output")
    parser.add_argument("--top-blocks", type=int, default=20, metavar="N",
                        help="how many of the largest blocks live at the peak to list (default 20)")


def run(args: argparse.Namespace) -> int:
    from .._html import HTML_TIMELINE_COLUMNS
    from .._progress import Progress
    from .._report import Report, load

    options = {"timeline_columns": HTML_TIMELINE_COLUMNS} if args.format == "html" else {}
    with Progress(["analysing the trace", "rendering the report"]) as progress:
        with progress.stage("analysing the trace"):
            report: Report = (load(args.file, **options) if args.top_blocks == 20
                              else Report.from_trace(args.file, args.top_blocks, **options))
        with progress.stage("rendering the report"):
            if args.format == "json":
                text = report.to_json() + "\n"
            elif args.format == "html":
                text = report.to_html()
            else:
                text = report.summary()
    emit(text, args.output)
    for w in report.warnings:
        if w["kind"] == "truncated_trace":
            print(f"ridgescope report: warning: {w['message']}", file=sys.stderr)
    return 0
