"""``ridgescope whatif FILE --alloc-conf ...``: replay a recorded run through the model of
PyTorch's CUDA caching allocator under other settings and compare peak allocated and reserved
memory (docs/fit.md, "The allocator model")."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .._allocator_model import simulate
from .._errors import RidgescopeError
from .._format import format_bytes, format_count
from .._snapshot import file_kind, replayed_trace
from ._output import emit

HELP = ("Replay a trace's or a torch memory snapshot's allocations through the CUDA caching "
        "allocator model with other PYTORCH_CUDA_ALLOC_CONF settings (e.g. "
        "expandable_segments:True) and compare peak allocated and reserved memory with the "
        "run's own settings.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path,
                        help="a ridgescope trace (.rstrace) or a torch memory snapshot pickle "
                             "(torch.cuda.memory._dump_snapshot; read without Python's pickle)")
    parser.add_argument("--alloc-conf", action="append", required=True, metavar="CONF",
                        help="settings to try, as PYTORCH_CUDA_ALLOC_CONF "
                             "(repeat to compare several)")
    parser.add_argument("--baseline-conf", default=None, metavar="CONF",
                        help="the settings the run used (default: a snapshot's recorded "
                             "allocator_settings; torch's defaults for a trace)")
    parser.add_argument("--capacity", default=None,
                        help="device memory the allocator may reserve, e.g. 80GiB (default: "
                             "unlimited); requests that do not fit are counted as failed")
    parser.add_argument("--device", default=None,
                        help="'cpu' or a CUDA index (default: the first CUDA device in the "
                             "trace, else the CPU events)")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="text (default) or json")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="write to this file instead of standard output")


def _device(value: str | None) -> "int | str | None":
    if value is None or value == "cpu":
        return value
    try:
        index = int(value.removeprefix("cuda:"))
    except ValueError:
        raise RidgescopeError(f"--device must be 'cpu' or a CUDA index, got {value!r}") from None
    if index < 0:
        raise RidgescopeError(f"--device must be 'cpu' or a CUDA index, got {value!r}")
    return index


def compare(path: Path, confs: list[str], baseline_conf: "str | None" = None,
            capacity: "int | str | None" = None, device: "int | str | None" = None) -> dict[str, Any]:
    """The baseline and each what-if run as JSON-ready data. A torch snapshot pickle is first
    replayed as a trace (its requested sizes are what the model replays); its recorded
    settings are the baseline unless ``baseline_conf`` is given."""
    if file_kind(path) == "pickle":
        with replayed_trace(path, device if isinstance(device, int) else None) as (trace, recorded):
            c = _compare_trace(trace, confs, recorded if baseline_conf is None else baseline_conf,
                               capacity, None if isinstance(device, int) else device)
        c["file"] = str(path)
        c["recorded_alloc_conf"] = recorded
        return c
    return _compare_trace(path, confs, baseline_conf or "", capacity, device)


def _compare_trace(path: Path, confs: list[str], baseline_conf: str,
                   capacity: "int | str | None", device: "int | str | None") -> dict[str, Any]:
    runs = []
    for conf in [baseline_conf, *confs]:
        r = simulate(path, conf, capacity, timeline_points=64, device=device)
        runs.append({
            "alloc_conf": conf,
            "canonical_alloc_conf": r["settings"]["alloc_conf"],
            "peak_allocated_bytes": r["peak_allocated_bytes"],
            "peak_reserved_bytes": r["peak_reserved_bytes"],
            "peak_reserved_time_ns": r["peak_reserved_time_ns"],
            "segment_count_at_end": r["segment_count"],
            "failed_allocs": r["failed_allocs"],
            "alloc_retries": r["final"]["alloc_retries"],
            "timeline": r["timeline"],
        })
        meta = r
    return {
        "file": str(path),
        "capacity": meta["settings"]["capacity"] or None,
        "allocs": meta["allocs"],
        "frees": meta["frees"],
        "unmatched_frees": meta["unmatched_frees"],
        "recorded_peak_bytes": meta["recorded_peak_bytes"],
        "truncated": meta["truncated"],
        "baseline": runs[0],
        "whatif": runs[1:],
    }


def render(c: dict[str, Any]) -> str:
    runs = [c["baseline"], *c["whatif"]]
    names = [(r["alloc_conf"] or "torch defaults") for r in runs]
    names[0] = f"baseline: {names[0]}"
    rows: list[tuple[str, list[str]]] = [
        ("peak allocated", [format_bytes(r["peak_allocated_bytes"]) for r in runs]),
        ("peak reserved", [format_bytes(r["peak_reserved_bytes"]) for r in runs]),
        ("reserved - allocated",
         [format_bytes(r["peak_reserved_bytes"] - r["peak_allocated_bytes"]) for r in runs]),
        ("change in peak reserved",
         ["-"] + [_signed(r["peak_reserved_bytes"] - runs[0]["peak_reserved_bytes"])
                  for r in runs[1:]]),
        ("segments at the end", [format_count(r["segment_count_at_end"]) for r in runs]),
    ]
    if c["capacity"]:
        rows.append(("failed requests", [format_count(r["failed_allocs"]) for r in runs]))
        rows.append(("release-and-retry", [format_count(r["alloc_retries"]) for r in runs]))
    label_w = max(len(label) for label, _ in rows)
    col_w = [max(len(names[i]), *(len(v[i]) for _, v in rows)) for i in range(len(runs))]
    lines = [f"ridgescope whatif {c['file']}: {format_count(c['allocs'])} allocations replayed"
             f" through the CUDA caching allocator model"
             + (f", capacity {format_bytes(c['capacity'])}" if c["capacity"] else ""),
             ""]
    lines.append((" " * label_w + "  " + "  ".join(n.ljust(w) for n, w in zip(names, col_w))).rstrip())
    for label, values in rows:
        lines.append((label.ljust(label_w) + "  "
                      + "  ".join(v.ljust(w) for v, w in zip(values, col_w))).rstrip())
    lines.append("")
    lines.append(f"recorded peak of the blocks: {format_bytes(c['recorded_peak_bytes'])}"
                 + (f"; {format_count(c['unmatched_frees'])} frees of blocks from before the "
                    f"recording" if c["unmatched_frees"] else ""))
    if c["truncated"]:
        lines.append("the trace ends in a torn chunk: replayed up to it")
    lines.append("(a model of torch's native allocator: see docs/fit.md, \"The allocator model\")")
    return "\n".join(lines) + "\n"


def _signed(n: int) -> str:
    return ("+" if n > 0 else "-" if n < 0 else "") + format_bytes(abs(n))


def run(args: argparse.Namespace) -> int:
    c = compare(args.file, args.alloc_conf, args.baseline_conf, args.capacity,
                _device(args.device))
    if args.format == "json":
        emit(json.dumps(c, indent=2) + "\n", args.output)
    else:
        emit(render(c), args.output)
    return 0
