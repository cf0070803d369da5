"""``python -m ridgescope COMMAND ...``: the ``ridgescope`` command itself (as ``python -m pytest``
is pytest), for environments where the console script is not on PATH or where the interpreter
must be chosen explicitly."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
