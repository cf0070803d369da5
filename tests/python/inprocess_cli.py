"""`ridgescope ARGS` run inside the test's own process (``ridgescope.cli.main``), for the tests
that read what a command prints: the same parser, commands and exit codes, without paying a
new interpreter's import of torch for every call. `ridgescope run` still gets a process of its
own (it runs a script). What only a real process shows (the console script, ``python -m``,
exit codes through the shell, signals) is specified in test_cli_run.py."""
from __future__ import annotations

import contextlib
import io
import subprocess
import sys


def ridgescope(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    if args and args[0] == "run":
        return subprocess.run([sys.executable, "-m", "ridgescope.cli", *args],
                              capture_output=True, text=True, timeout=timeout)
    from ridgescope.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse: --help, usage errors
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess(["ridgescope", *args], code, out.getvalue(), err.getvalue())
