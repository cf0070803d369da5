"""The ``ridgescope`` command line: one module per subcommand, registered in _COMMANDS.

User errors (a missing or corrupt file, a bad option) print one line and exit non-zero, with
no traceback."""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from .._errors import RidgescopeError
from . import compact as _compact
from . import diff as _diff
from . import explain as _explain
from . import fit as _fit
from . import report as _report
from . import run as _run
from . import watch as _watch
from . import whatif as _whatif

# name -> (help, add_arguments(parser), run(args) -> exit code)
_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                           Callable[[argparse.Namespace], int]]] = {
    "report": (_report.HELP, _report.add_arguments, _report.run),
    "explain": (_explain.HELP, _explain.add_arguments, _explain.run),
    "run": (_run.HELP, _run.add_arguments, _run.run),
    "watch": (_watch.HELP, _watch.add_arguments, _watch.run),
    "diff": (_diff.HELP, _diff.add_arguments, _diff.run),
    "compact": (_compact.HELP, _compact.add_arguments, _compact.run),
    "whatif": (_whatif.HELP, _whatif.add_arguments, _whatif.run),
    "fit": (_fit.HELP, _fit.add_arguments, _fit.run),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ridgescope",
        description="Where memory goes during PyTorch training: read a ridgescope trace and "
                    "explain its peak by category and phase.")
    from .._version import __version__
    parser.add_argument("--version", action="version", version=f"ridgescope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add_arguments, _) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _, _, run = _COMMANDS[args.command]
    try:
        return run(args)
    except (RidgescopeError, OSError) as exc:
        print(f"ridgescope {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
