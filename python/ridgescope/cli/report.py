"""``ridgescope report FILE``: turn a trace into a text or JSON report."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import _device_rules
from ._output import emit

HELP = "Print or write the memory report of a trace (text, JSON or a self-contained HTML page)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, nargs="+",
                        help="a ridgescope trace (.rstrace) or a torch memory snapshot pickle; "
                             "several traces, or a directory of them (the ranks of one job: "
                             "run.rank*.rstrace), give one merged report of every rank "
                             "(docs/distributed.md)")
    parser.add_argument("--format", choices=("text", "json", "html", "snapshot"), default="text",
                        help="text: a short plain-language report (default); json: the full "
                             "report in the schema of docs/report_schema.md; html: one "
                             "self-contained page with the chart and tables of "
                             "docs/html-report.md (opens with no network); snapshot: a "
                             "torch.cuda.memory._snapshot() pickle for PyTorch's memory_viz, "
                             "coloured by category (docs/snapshot.md; needs -o)")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="write the report to this file instead of standard output")
    parser.add_argument("--tensorboard", type=Path, default=None, metavar="DIR",
                        help="also write the per-step peak and its composition by category as "
                             "TensorBoard scalars into an event file in DIR (needs the "
                             "tensorboard package: pip install 'ridgescope[tensorboard]'; "
                             "docs/integrations.md)")
    parser.add_argument("--top-blocks", type=int, default=20, metavar="N",
                        help="how many of the largest blocks live at the peak to list (default 20)")
    parser.add_argument("--group-by", choices=("category", "site", "stack"), default="category",
                        help="text report: category (default) gives the whole report; site lists "
                             "the peak's live bytes by allocation site and category; stack lists "
                             "them by allocation stack, largest first, with their categories and "
                             "the frames (docs/sites.md; for a torch snapshot, its entries' "
                             "frames). --top-blocks sets how many rows (default 20)")
    parser.add_argument("--library-frames", action="store_true",
                        help="show library frames (torch's, the standard library's, the "
                             "interpreter's and libc's native ones), which are folded away by "
                             "default: every frame of each stack with --group-by stack, and the "
                             "HTML flame graph opened with them shown (its checkbox toggles them)")
    _device_rules.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from .._reporters._html import HTML_TIMELINE_COLUMNS
    from .._progress import Progress
    from .._report import Report, load

    if len(args.file) > 1 or args.file[0].is_dir():  # the ranks of a job: one merged report
        from ._ranks import report_ranks
        return report_ranks(args)
    args.file = args.file[0]
    if args.group_by != "category" and args.format != "text":
        from .._errors import RidgescopeError
        raise RidgescopeError(f"--group-by {args.group_by} goes with --format text; the JSON "
                              "report holds every site (peak.by_site) and stack (peak.stacks)")
    if args.library_frames and not (args.format == "html" or args.group_by == "stack"):
        from .._errors import RidgescopeError
        raise RidgescopeError("--library-frames goes with --group-by stack (text) or --format html; the "
                              "JSON report holds every frame, each with its 'library' flag")
    if args.format == "snapshot":
        if args.tensorboard is not None:
            from .._errors import RidgescopeError
            raise RidgescopeError("--tensorboard goes with --format text, json or html, not snapshot")
        return _write_snapshot(args)
    options = {"timeline_columns": HTML_TIMELINE_COLUMNS} if args.format == "html" else {}
    options.update(_device_rules.load_options(args))
    with Progress(["analysing the trace", "rendering the report"]) as progress:
        with progress.stage("analysing the trace"):
            report: Report = (load(args.file, **options) if args.top_blocks == 20
                              else load(args.file, top_blocks=args.top_blocks, **options))
        with progress.stage("rendering the report"):
            if args.format == "json":
                text = report.to_json() + "\n"
            elif args.format == "html":
                text = report.to_html(library_frames=args.library_frames)
            elif args.group_by != "category":
                text = report.grouped(args.group_by, limit=args.top_blocks, library_frames=args.library_frames)
            else:
                text = report.summary()
    emit(text, args.output)
    if args.tensorboard is not None:
        written = report.to_tensorboard(args.tensorboard)
        print(f"ridgescope report: wrote {written['scalars']} TensorBoard scalars "
              f"({written['steps']} steps) to {written['logdir']}", file=sys.stderr)
    for w in report.warnings:
        if w["kind"] == "truncated_trace":
            print(f"ridgescope report: warning: {w['message']}", file=sys.stderr)
    return 0


def _write_snapshot(args: argparse.Namespace) -> int:
    from .._errors import RidgescopeError
    from .._snapshot import write_snapshot

    if args.output is None:
        raise RidgescopeError("--format snapshot writes a binary pickle: name the file with -o FILE")
    stats = write_snapshot(args.file, args.output)
    print(f"wrote {args.output}: {stats['trace_entries']} trace entries, {stats['allocations']} "
          f"allocations, {stats['segments']} segments live at the end ({stats['bytes']} bytes). "
          f"Open it at https://pytorch.org/memory_viz or with "
          f"python -m torch.cuda._memory_viz trace_plot {args.output} -o plot.html", file=sys.stderr)
    return 0
