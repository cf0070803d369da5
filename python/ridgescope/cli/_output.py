"""Where a subcommand's text goes: standard output, or a file named by -o."""
from __future__ import annotations

import sys
from pathlib import Path


def emit(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        print(f"wrote {output}", file=sys.stderr)
