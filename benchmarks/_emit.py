"""How every benchmark hands over its result: ONE JSON object on stdout, and a copy in
``--out FILE`` (its folder made) when asked for."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit_json(result: dict[str, Any], out: str | None, indent: int = 2) -> None:
    text = json.dumps(result, indent=indent)
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
