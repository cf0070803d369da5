"""The report's `distributed` section: the trace's `distributed` metadata (written by
``DistributedTracking``), parsed into data (docs/report_schema.md, "distributed"). Its lines in
the text report: ``_reporters/_distributed_text.py``."""
from __future__ import annotations

import json
from typing import Any


def distributed_section(data: dict[str, Any]) -> dict[str, Any] | None:
    """The parsed `distributed` metadata of a report dict, or None when the trace has none or
    it is not a JSON object."""
    text = data.get("metadata", {}).get("distributed")
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def add_distributed_section(data: dict[str, Any]) -> dict[str, Any]:
    """Adds `distributed` to a report dict when its trace carries the metadata."""
    section = distributed_section(data)
    if section is not None:
        data["distributed"] = section
    return data
