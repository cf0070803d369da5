"""The two ledgers beside the composition, as text (docs/forensics.md): the device ledger (the
driver's figure for the process = PyTorch reserved + memory outside PyTorch by library + the CUDA
context + the unexplained remainder) and the host's resident set in three layers."""
from __future__ import annotations

from typing import Any

from .._format import format_bytes


def _signed(v: int) -> str:
    return ("-" if v < 0 else "") + format_bytes(abs(v))


def _where(step: int | None, phase: str | None) -> str:
    return f"step {step}, {phase}" if step is not None else "?"


def _lifetime(g: dict[str, Any]) -> str:
    start = f"from step {g['first_step']} {g['first_phase']}"
    if g["end_bytes"]:
        return start + ", live to the end"
    return start + f" to step {g['last_free_step']} {g['last_free_phase']}"


def device_ledger_lines(d: dict[str, Any], max_groups: int = 8) -> list[str]:
    led = d.get("device_ledger")
    if not led:
        return []
    out: list[str] = []
    row = led.get("at_peak") or led.get("last")
    if not led["available"] or row is None:
        out.append(f"Device ledger: {led['reason'] or 'no driver readings'}.")
    else:
        source = ("NVML, this process" if led["driver_source"] == "process"
                  else "NVML, the whole device: this process's own figure was not listed")
        when = "at the peak" if led.get("at_peak") else "at the last reading"
        exact = "" if row["exact"] else "; the device's memory changed between the peak and this reading"
        out.append(f"Device ledger {when} ({_where(row['step'], row['phase'])}{exact}):")
        modules = (f"; {led['modules_loaded']} kernel modules loaded while tracking, "
                   f"{format_bytes(led['module_bytes'])} of code" if led.get("modules_loaded") else "")
        width = max(len(source) + 9, 30)
        lines = [(f"driver ({source})", format_bytes(row["driver_bytes"]), ""),
                 ("= PyTorch reserved", format_bytes(row["reserved_bytes"]), ""),
                 ("+ outside PyTorch, itemised", format_bytes(row["outside_bytes"]), ""),
                 ("+ CUDA context", format_bytes(row["context_bytes"]),
                  f"  (at the first reading, with anything made before tracking{modules})"),
                 ("+ unexplained", _signed(row["unexplained_bytes"]), "")]
        for label, value, note in lines:
            out.append(f"  {label:<{width}} {value:>10}{note}")
        if led.get("other_processes"):
            out.append(f"  other processes on the device: {led['other_processes']}")
    if led["itemised"]:
        groups = led["groups"]
        if groups:
            out.append("  Allocations outside PyTorch (CUPTI), by library:")
            for g in groups[:max_groups]:
                name = g["library_name"] if g["library_name"] == g["library"] else f"{g['library_name']} ({g['library']})"
                site = f"; at {g['site']}" if g.get("site") else ""
                out.append(f"    {name}: {format_bytes(g['bytes_at_peak'])} at the peak in {g['live_at_peak']} of "
                           f"{g['allocations']} allocation(s) ({g['api']}), at most {format_bytes(g['max_bytes'])}, "
                           f"{_lifetime(g)}{site}")
            if len(groups) > max_groups:
                out.append(f"    ... {len(groups) - max_groups} more group(s) (see the JSON report)")
        else:
            out.append("  No allocation outside PyTorch was seen while tracking (CUPTI).")
    else:
        out.append(f"  Memory outside PyTorch is not itemised: {led['itemise_reason']}")
    return out + [""]


def _malloc_note(r: dict[str, Any]) -> str:
    """Where a reading's glibc counters come from (they are read under a time budget)."""
    if not r["malloc_known"]:
        return "  (glibc's counters not available)"
    read_at = r.get("malloc_time_ns", r["time_ns"])
    if read_at != r["time_ns"]:
        return f"  (glibc's counters of {(r['time_ns'] - read_at) / 1e6:.1f} ms earlier)"
    return ""


def host_memory_lines(d: dict[str, Any]) -> list[str]:
    h = d.get("host_memory")
    if not h or not h.get("max_resident"):
        return []
    out: list[str] = []
    shown = [("at its highest", h["max_resident"])]
    if h.get("at_peak") and h["at_peak"]["time_ns"] != h["max_resident"]["time_ns"]:
        shown.append(("at the peak", h["at_peak"]))
    for label, r in shown:
        o = r["outside"]
        out.append(f"Host memory {label} ({_where(r['step'], r['phase'])}): resident set "
                   f"{format_bytes(r['resident_bytes'])}")
        untouched = f"; {format_bytes(r['untouched_bytes'])} of them never written" if r["untouched_bytes"] else ""
        out.append(f"  = PyTorch's live CPU blocks    {format_bytes(r['pytorch_bytes']):>10} resident "
                   f"({format_bytes(r['torch_live_bytes'])} live{untouched})")
        out.append(f"  + the C allocator's slack      {format_bytes(r['allocator_slack_bytes']):>10}"
                   + _malloc_note(r))
        out.append(f"  + everything else              {format_bytes(r['outside_bytes']):>10}: "
                   f"files and libraries {format_bytes(o['files_bytes'])}, shared memory "
                   f"{format_bytes(o['shared_memory_bytes'])}, other heap users (Python objects, numpy, "
                   f"libraries) {format_bytes(o['other_heap_bytes'])}, remainder {_signed(o['remainder_bytes'])} "
                   f"(Python's small objects, thread stacks, other mappings)")
        if r.get("malloc_misses_torch"):
            out.append("  glibc's counters do not cover torch's blocks: another malloc serves this process")
    skipped = h.get("readings_skipped", 0)
    if skipped:
        ends = h["phase_end_readings"]
        out.append(f"  Read at {ends:,} of {ends + skipped:,} phase ends (and when tracking started and "
                   f"stopped): the readings are kept under {h['reading_share']:.2%} of the run's time, "
                   f"and every new high of torch's live CPU bytes is read.")
    return out + [""]


def ledger_lines(d: dict[str, Any]) -> list[str]:
    """Both ledgers, device first (empty when the report has neither)."""
    return device_ledger_lines(d) + host_memory_lines(d)
