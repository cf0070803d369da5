"""``ridgescope run SCRIPT [ARGS...]``: track an unmodified training script."""
from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from pathlib import Path

HELP = ("Run a Python training script under tracking, unchanged: the root module and the "
        "optimizer are found by themselves. Arguments after the script go to the script; its "
        "exit code is ridgescope's. At exit the trace and an HTML report (beside the trace) are "
        "written and their paths printed.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .. import _C

    parser.add_argument("-o", "--out", type=Path, default=None,
                        help="the trace file to write (default: SCRIPT's name with .rstrace, in "
                             "the working directory); the HTML report goes beside it, with "
                             ".html. Under torchrun (WORLD_SIZE > 1) each rank writes its own: "
                             "'{rank}' in the name is replaced by the rank, else '.rank<N>' is "
                             "put before the suffix")
    parser.add_argument("--capacity", default=None, metavar="SIZE",
                        help="simulate a device of SIZE (e.g. 2GiB) on the CPU: past it the script "
                             "gets torch.OutOfMemoryError, and the report explains it")
    hook = parser.add_mutually_exclusive_group()
    hook.add_argument("--no-activations-hook", action="store_true",
                      help="do not install the saved-tensor hook (lower overhead; activations are "
                           "inferred from lifetimes and named after the module that made them)")
    hook.add_argument("--activations-hook-every-step", action="store_true",
                      help="run the saved-tensor hook in every step (by default it runs in the "
                           "first two and in steps with new input shapes; the others read the "
                           "savers it named: docs/categories.md)")
    parser.add_argument("--stacks", choices=_C.STACK_MODES, default="site",
                        help="where each allocation was made (docs/sites.md): 'site' (default) the "
                             "innermost frame of your code, or the autograd node in backward; "
                             "'python' the whole Python stack; 'all' native frames too (slow); "
                             "'none' nothing")
    parser.add_argument("--keep-steps", default=None, metavar="N|all",
                        help="keep the trace bounded for long runs (docs/long-runs.md): a summary "
                             "of every step, and the events of the last N steps, of the step with "
                             "the highest peak and of the steps around each OOM, warning and "
                             "rs.mark(); 'all' keeps every step's events. Default: "
                             "$RIDGESCOPE_KEEP_STEPS, else 20")
    parser.add_argument("--no-cupti", action="store_true",
                        help="do not itemise device memory outside PyTorch with CUPTI (CUPTI takes "
                             "one subscriber: use this to profile the script with torch.profiler "
                             "or Nsight at the same time)")
    parser.add_argument("--no-host-memory", action="store_true",
                        help="do not read the process's resident set at phase boundaries")
    parser.add_argument("script", type=Path, help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")


def run(args: argparse.Namespace) -> int:
    from .._errors import RidgescopeError
    from .._flight import RUN_DEFAULT
    from .._format import format_bytes
    from .._saved_hooks import EVERY_STEP
    from .._session import Session

    script = args.script
    if not script.is_file():
        raise RidgescopeError(f"no such script: {script}")
    try:
        session = Session(out=args.out or Path(f"{script.stem}.rstrace"),
                          activations=(False if args.no_activations_hook else
                                       EVERY_STEP if args.activations_hook_every_step else True),
                          capacity=args.capacity,
                          stacks=None if args.stacks == "none" else args.stacks,
                          cupti=False if args.no_cupti else None, host_memory=not args.no_host_memory,
                          keep_steps=args.keep_steps, keep_steps_default=RUN_DEFAULT)
    except ValueError as exc:
        raise RidgescopeError(str(exc).removeprefix("ridgescope.track: ")) from None
    out = session.path  # one per rank under torchrun (per_rank_path)

    exit_code = 0
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = [str(script), *args.args]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        with session:
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:  # the script's own exit code
        code = exc.code
        exit_code = code if isinstance(code, int) else (0 if code is None else 1)
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
    except BaseException:  # the script raised: show it as Python would, keep the trace
        traceback.print_exc()
        exit_code = 1
    finally:
        sys.argv = saved_argv
        if sys.path and sys.path[0] == str(script.resolve().parent):
            sys.path.pop(0)
        del saved_path0

    try:
        from .._reporters._html import HTML_TIMELINE_COLUMNS
        from .._progress import Progress
        from .._report import Report

        if session.active:
            session.stop()
        html_path = out.with_suffix(".html")
        with Progress(["analysing the trace", "writing the HTML report"]) as progress:
            with progress.stage("analysing the trace"):
                full = Report.from_trace(out, timeline_columns=HTML_TIMELINE_COLUMNS)
            with progress.stage("writing the HTML report"):
                try:
                    full.to_html(html_path)
                except OSError as exc:
                    print(f"ridgescope run: cannot write {html_path}: {exc}", file=sys.stderr)
                    html_path = None
        report = full.to_dict()
        p = report["peak"]
        parts = sorted(((v, k) for k, v in p["by_category"].items() if v), reverse=True)[:4]
        print(f"\nridgescope: peak {format_bytes(p['bytes'])} in step {p['step']}, {p['phase']}: "
              + ", ".join(f"{k} {format_bytes(v)}" for v, k in parts), file=sys.stderr)
        if report["ooms"]:
            print(f"ridgescope: {len(report['ooms'])} out-of-memory error(s): "
                  f"ridgescope explain {out}", file=sys.stderr)
        print(f"ridgescope: trace {os.fspath(out)}; `ridgescope report {os.fspath(out)}` for the "
              "full report", file=sys.stderr)
        if html_path is not None:
            print(f"ridgescope: HTML report {os.fspath(html_path)}", file=sys.stderr)
    except RidgescopeError as exc:
        print(f"ridgescope run: the trace could not be read: {exc}", file=sys.stderr)
    return exit_code
