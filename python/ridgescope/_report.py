"""``rs.Report``: the report of one run, built from a trace by the native analysis, with the
model header added from the run's metadata. Reporters (text, JSON) consume it; it never reads
live native state. Schema: docs/report_schema.md."""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from . import _C, _model_info
from ._errors import TraceFormatError

TRACE_MAGIC = b"RIDGESCP"


def _last_complete_phase(data: dict[str, Any], name: str) -> dict[str, Any] | None:
    found = None
    for step in data.get("steps", []):
        for ph in step["phases"]:
            if ph["phase"] == name and ph["complete"]:
                found = ph
    return found


def _model_section(data: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    meta = run.get("model") or {}
    measured_params = data["totals"]["final_by_category"]["parameter"]
    model: dict[str, Any] = {
        "class": meta.get("class"),
        "parameters": meta.get("parameters"),
        "trainable_parameters": meta.get("trainable_parameters"),
        "parameter_bytes": meta.get("parameter_bytes", measured_params),
        "trainable_parameter_bytes": meta.get("trainable_parameter_bytes"),
        "parameter_tensors": meta.get("parameter_tensors"),
        "dtypes": meta.get("dtypes", {}),
        "buffers": meta.get("buffers"),
        "buffer_bytes": meta.get("buffer_bytes"),
    }
    expected = _model_info.expected_persistent_bytes_per_parameter(run)
    measured = None
    where = None
    opt = _last_complete_phase(data, "optimizer_step")
    n = meta.get("trainable_parameters")
    if opt is not None and n:
        end = opt["end_by_category"]
        trainable_bytes = meta.get("trainable_parameter_bytes", end["parameter"])
        measured = (trainable_bytes + end["gradient"] + end["optimizer_state"]) / n
        where = {"step": opt["step"], "phase": "optimizer_step", "at": "end"}
    model["persistent_bytes_per_trainable_parameter"] = {
        "expected": expected, "measured": measured, "measured_at": where,
    }
    return model


def _optimizer_section(data: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    meta = run.get("optimizer") or {}
    opt = _last_complete_phase(data, "optimizer_step")
    state_bytes = (opt["end_by_category"]["optimizer_state"] if opt is not None
                   else data["totals"]["final_by_category"]["optimizer_state"])
    return {
        "type": meta.get("type"),
        "state_bytes": state_bytes,
        "states_per_parameter": meta.get("states_per_parameter"),
        "state_keys": meta.get("state_keys", []),
        "hyperparameters": meta.get("hyperparameters", {}),
        "steps": sum(1 for s in data.get("steps", []) for p in s["phases"]
                     if p["phase"] == "optimizer_step"),
    }


def _finish(data: dict[str, Any]) -> dict[str, Any]:
    """Adds the Python-side sections (run, model, optimizer) to the native report."""
    metadata = data.pop("metadata", {})
    run: dict[str, Any] = {}
    for key, text in metadata.items():
        try:
            value = json.loads(text)
        except (TypeError, ValueError):
            data["warnings"].append({"kind": "corrupt_metadata", "bytes": 0, "step": 0,
                                     "message": f"The trace's '{key}' metadata is not valid JSON "
                                                "and was ignored."})
            continue
        if key == "run" and isinstance(value, dict):
            run = value
        elif key == "session" and isinstance(value, dict):
            data["recorder"] = {k: value[k] for k in ("events", "dropped_events", "bytes_written",
                                                      "buffer_bytes_peak") if isinstance(value.get(k), int)}
    data["run"] = {k: run[k] for k in ("ridgescope_version", "torch_version", "python_version",
                                       "argv") if k in run}
    data["model"] = _model_section(data, run)
    data["optimizer"] = _optimizer_section(data, run)
    return data


class Report:
    """The memory report of one run. ``to_dict()`` is JSON-ready (docs/report_schema.md)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    @classmethod
    def from_trace(cls, path: str | os.PathLike[str], top_blocks: int = 20) -> "Report":
        try:
            text = _C.analyze(str(path), top_blocks)
        except _C.TraceError as exc:
            raise TraceFormatError(str(exc)) from None
        return cls(_finish(json.loads(text)))

    # ------------------------------------------------------------------ data
    def to_dict(self) -> dict[str, Any]:
        """A deep copy of the report as plain JSON-ready data."""
        return copy.deepcopy(self._data)

    def to_json(self, path: str | os.PathLike[str] | None = None, indent: int | None = 2) -> str:
        """The report as JSON text; also written to ``path`` when given."""
        text = json.dumps(self._data, indent=indent)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    def summary(self) -> str:
        """A short, plain-language text report."""
        from ._text import render_text
        return render_text(self._data)

    def __str__(self) -> str:
        return self.summary()

    # ------------------------------------------------------------------ convenience
    @property
    def peak_bytes(self) -> int:
        return self._data["peak"]["bytes"]

    @property
    def peak(self) -> dict[str, Any]:
        return self._data["peak"]

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self._data["steps"]

    @property
    def warnings(self) -> list[dict[str, Any]]:
        return self._data["warnings"]

    def phases(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every phase instance in order, optionally only those called ``name``."""
        return [p for s in self._data["steps"] for p in s["phases"]
                if name is None or p["phase"] == name]


def load(path: str | os.PathLike[str]) -> Report:
    """Reads a ridgescope trace file into a Report. Raises TraceFormatError naming the
    problem for anything else."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise TraceFormatError(f"cannot read {p}: {exc.strerror}") from None
    if head == TRACE_MAGIC:
        return Report.from_trace(p)
    if head[:1] == b"\x80":
        raise TraceFormatError(f"{p} is a pickle (a torch memory snapshot?); this version of "
                               "ridgescope reads only its own .rstrace traces")
    raise TraceFormatError(f"{p} is not a ridgescope trace (bad magic at byte offset 0)")
