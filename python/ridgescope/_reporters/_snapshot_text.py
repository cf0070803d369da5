"""Text for reports read from torch memory snapshots: the per-device summary and the reasons
behind each category (the ``snapshot`` section, docs/snapshot.md). Rendering only: the figures
come from the native replay and inference."""
from __future__ import annotations

from typing import Any

from .._format import format_bytes

MAX_REASONS = 12


def _composition(by_category: dict[str, int], limit: int = 4) -> str:
    parts = sorted(((v, k) for k, v in by_category.items() if v > 0), reverse=True)[:limit]
    return ", ".join(f"{k} {format_bytes(v)}" for v, k in parts) if parts else "nothing live"


def device_summary(d: dict[str, Any]) -> list[str]:
    """One line per device the snapshot holds memory for, and which one the report is about."""
    snap = d.get("snapshot") or {}
    rows = snap.get("devices") or []
    if not rows or snap.get("device_choice") == "asked":
        return []
    out = ["Devices in this snapshot (each replayed on its own):"]
    for r in rows:
        out.append(f"  {r['device']:<7} peak {format_bytes(r['peak_bytes']):>10} "
                   f"({format_bytes(r['peak_reserved_bytes'])} reserved), at the end "
                   f"{format_bytes(r['end_live_bytes'])} live of {format_bytes(r['end_reserved_bytes'])} "
                   f"reserved; at its peak: {_composition(r['peak_by_category'])}")
    if len(rows) > 1:
        out.append(f"  This report is about {d['device']}, the device whose live bytes peaked highest "
                   f"(--device cuda:N, or rs.load(path, device='cuda:N'), for another).")
    return out


def reason_lines(d: dict[str, Any]) -> list[str]:
    """The rule behind every byte at the peak, largest first."""
    snap = d.get("snapshot") or {}
    reasons = [r for r in snap.get("reasons") or [] if r["peak_bytes"] > 0]
    if not reasons:
        return []
    out = ["Why (the rule that decided each byte at the peak; docs/snapshot.md lists them):"]
    for r in reasons[:MAX_REASONS]:
        out.append(f"  {r['category']:<16} {format_bytes(r['peak_bytes']):>10}  {r['reason']}  "
                   f"[{r['rule']}, {r.get('evidence', 'none')}, {r['peak_blocks']} block(s)]")
    if len(reasons) > MAX_REASONS:
        rest = sum(r["peak_bytes"] for r in reasons[MAX_REASONS:])
        out.append(f"  ... {len(reasons) - MAX_REASONS} more reason(s) holding {format_bytes(rest)} "
                   "(the JSON report's snapshot.reasons lists all)")
    return out


def inferred_note(d: dict[str, Any], category: str, inferred: int) -> str:
    """What follows a category's bytes in the peak's composition: how much was inferred and, of
    it, what size or lifetime alone decided (the weaker rules)."""
    if not inferred:
        return ""
    conf = (d.get("snapshot") or {}).get("confidence")
    weak = conf["peak_by_evidence"]["weak"].get(category, 0) if conf else 0
    if not weak:
        return f"  ({format_bytes(inferred)} inferred)"
    return f"  ({format_bytes(inferred)} inferred, {format_bytes(weak)} of it by size or lifetime alone)"


def confidence_lines(d: dict[str, Any]) -> list[str]:
    """How the peak's bytes were decided, strongest evidence first (snapshot.confidence)."""
    conf = (d.get("snapshot") or {}).get("confidence")
    total = d["peak"]["bytes"]
    if not conf or not total:
        return []
    text = conf["evidence_text"]
    parts = [f"{100 * n / total:.1f}% {text[k]}" for k, n in conf["peak_bytes_by_evidence"].items()
             if n > 0]
    return [f"  how the peak's bytes were decided: {', '.join(parts)} (size or lifetime alone are the weaker "
            "rules; docs/snapshot.md)"]
