"""The text report's lines about the rank and its strategies: the report's `distributed`
section (``distributed/_section.py`` parses it; docs/report_schema.md, "distributed")."""
from __future__ import annotations

from typing import Any

from .._format import format_bytes


def _strategy_line(s: dict[str, Any], fmt: Any) -> str:
    kind = s.get("strategy")
    if kind != "ddp" and s.get("error"):
        return f"{kind}: found, but its structures were not recognised ({s['error']})"
    if kind == "ddp":
        n = len(s.get("buckets", []))
        line = (f"DDP: {n} gradient bucket(s), {fmt(s.get('bucket_bytes', 0))}, "
                f"as {s.get('buckets_category')}: {s.get('note', '')}")
        return line + (f" ({s['error']})" if s.get("error") else "")
    if kind == "fsdp2":
        line = (f"FSDP2 (fully_shard): {s.get('parameter_count', 0)} parameter shard(s) on this "
                f"rank, {fmt(s.get('local_shard_bytes', 0))}; unsharded parameters count as "
                "comm_buffer ('all-gather of ...') while they live")
        mp = s.get("mixed_precision") or {}
        if mp.get("param_dtype"):
            line += (f"; mixed precision: gathered in {mp['param_dtype']}, reduced in "
                     f"{mp.get('reduce_dtype') or mp['param_dtype']}")
        mesh = s.get("mesh") or {}
        if mesh.get("hsdp"):
            line += f"; HSDP on a {' x '.join(str(n) for n in mesh.get('shape', []))} mesh"
        if s.get("cpu_offload"):
            line += "; CPU offload"
        return line
    if kind == "fsdp1":
        return (f"FSDP1: {s.get('flat_parameter_count', 0)} flat parameter shard(s), "
                f"{fmt(s.get('local_shard_bytes', 0))}; unsharded flat parameters count as "
                "comm_buffer ('all-gather of ...')")
    if kind == "zero":
        return (f"ZeroRedundancyOptimizer ({s.get('optimizer')}): optimizer state for "
                f"{s.get('local_parameters', 0)} of {s.get('parameters', 0)} parameter tensors "
                f"on this rank ({fmt(s.get('local_parameter_bytes', 0))} of parameters)")
    if kind == "deepspeed":
        return _deepspeed_line(s, fmt)
    return f"{kind}"


_ZERO_SHARDS = {0: "nothing", 1: "optimizer state", 2: "optimizer state and gradients",
                3: "optimizer state, gradients and parameters"}


def _deepspeed_line(s: dict[str, Any], fmt: Any) -> str:
    stage = s.get("zero_stage")
    line = (f"DeepSpeed ZeRO-{stage} ({s.get('optimizer')}): {s.get('parameters', 0):,} parameters "
            f"in {s.get('parameter_tensors', 0)} tensors; partitions "
            f"{_ZERO_SHARDS.get(stage, '?')}")
    parts = [f"{p['what']} {fmt(p['bytes'])} ({p['category']})" for p in s.get("partitions", [])]
    if parts:
        line += "; this rank: " + ", ".join(parts)
    for b in s.get("buffers", []):
        key = b.get("config_key")
        elements = f" ({b['elements']:,} elements)" if b.get("elements") is not None else ""
        line += f"; {key}{elements} holds {fmt(b['bytes'])} ({b['category']})"
    return line


def text_lines(data: dict[str, Any]) -> list[str]:
    """The text report's lines about the rank and its strategies (none outside a job)."""
    d = data.get("distributed")
    if not d or (d.get("world_size", 1) <= 1 and not d.get("strategies")):
        return []
    where = ", ".join(x for x in (d.get("host"), d.get("backend")) if x)
    lines = [f"Rank {d.get('rank')} of {d.get('world_size')}" + (f" ({where})" if where else "")]
    lines += [f"  {_strategy_line(s, format_bytes)}" for s in d.get("strategies", [])]
    return lines
