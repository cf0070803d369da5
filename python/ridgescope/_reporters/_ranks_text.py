"""The merged multi-rank report as text (docs/distributed.md)."""
from __future__ import annotations

from typing import Any

from .._format import format_bytes

MAX_TABLE_ROWS = 40  # more ranks than this: the highest and lowest peaks are listed


def _composition(by_category: dict[str, int], total: int, limit: int = 3) -> str:
    parts = sorted(((v, k) for k, v in by_category.items() if v), reverse=True)[:limit]
    return ", ".join(f"{k} {100.0 * v / total:.0f}%" for v, k in parts) if total else ""


def _row(r: dict[str, Any]) -> str:
    if r["status"] == "unreadable":
        return f"  {r['rank']:>5}  unreadable: {r['problem']}"
    flag = "  (truncated)" if r["status"] == "truncated" else ""
    return (f"  {r['rank']:>5}  {str(r.get('host') or '-')[:16]:<16} {format_bytes(r['peak_bytes']):>10} "
            f"{format_bytes(r['reserved_bytes']):>10} {r['step']:>5}  {r['phase'][:16]:<16} "
            f"{_composition(r['by_category'], r['peak_bytes'])}{flag}")


def render_ranks_text(merged: dict[str, Any]) -> str:
    s = merged["ranks"]
    where = []
    if s["world_size"] is not None:
        where.append(f"world size {s['world_size']}")
    if s["hosts"]:
        where.append(f"{len(s['hosts'])} host(s)")
    if s["backends"]:
        where.append("backend " + ", ".join(s["backends"]))
    out = [f"ridgescope: {s['merged']} of {s['traces']} rank trace(s) merged"
           + (f" ({'; '.join(where)})" if where else "")]
    if s["missing_rank_count"]:
        listed = ", ".join(str(r) for r in s["missing_ranks"])
        more = s["missing_rank_count"] - len(s["missing_ranks"])
        out.append(f"Missing ranks: {listed}" + (f" and {more} more" if more > 0 else ""))
    hi = s["highest"]
    if hi is not None:
        out += ["", f"Highest peak: rank {hi['rank']}, {format_bytes(hi['peak_bytes'])} in step "
                f"{hi['step']}, {hi['phase']}: {format_bytes(hi['over_lowest_bytes'])} "
                f"({100.0 * hi['over_lowest_fraction']:.1f}%) over the lowest (rank "
                f"{hi['lowest_rank']}, {format_bytes(hi['lowest_peak_bytes'])}); median "
                f"{format_bytes(hi['median_peak_bytes'])}"]
        paths = {r["rank"]: r["path"] for r in s["table"] if r["status"] != "unreadable"}
        if hi["rank"] != hi["lowest_rank"]:
            out.append(f"  compare them: ridgescope diff {paths[hi['lowest_rank']]} {paths[hi['rank']]}")
    rows = s["table"]
    out += ["", f"  {'rank':>5}  {'host':<16} {'peak':>10} {'reserved':>10} {'step':>5}  "
                f"{'phase':<16} composition at the peak"]
    if len(rows) <= MAX_TABLE_ROWS:
        out += [_row(r) for r in rows]
    else:
        ok = [r for r in rows if r["status"] != "unreadable"]
        top = sorted(ok, key=lambda r: (-r["peak_bytes"], r["rank"]))
        out += [_row(r) for r in top[:10]]
        out.append(f"  {'…':>5}  {len(rows) - 15} more rank(s) (the JSON report lists every rank)")
        out += [_row(r) for r in top[-5:]]
    series = s.get("step_summaries") or {}
    if series:
        counts = sorted({v["steps"] for v in series.values()})
        top = max(series.items(), key=lambda kv: (kv[1]["max_peak_bytes"], -int(kv[0])))
        out += ["", f"Per-step summaries: {'/'.join(str(c) for c in counts)} step(s) per rank; the highest "
                    f"step peak is rank {top[0]}'s, {format_bytes(top[1]['max_peak_bytes'])} in step "
                    f"{top[1]['max_peak_step']} (each rank's median step peak: "
                    + ", ".join(f"{k} {format_bytes(v['median_peak_bytes'])}" for k, v in
                                sorted(series.items(), key=lambda kv: int(kv[0]))[:8])
                    + (", ..." if len(series) > 8 else "") + ")"]
    if s["divergent_phases"]:
        out += ["", "Phases where ranks diverge (each phase's highest peak, lowest and highest rank):"]
        for p in s["divergent_phases"]:
            note = "" if p["on_every_rank"] else f"  (on {p['ranks']} of {s['merged']} ranks)"
            out.append(f"  {p['phase'][:28]:<28} {format_bytes(p['min_bytes']):>10} (rank "
                       f"{p['min_rank']}) .. {format_bytes(p['max_bytes']):>10} (rank "
                       f"{p['max_rank']})  +{format_bytes(p['spread_bytes'])} "
                       f"({100.0 * p['spread_fraction']:.1f}%){note}")
    else:
        out += ["", "No phase differs by 1% or more between ranks."]
    if s["problems"]:
        out += ["", "Problems:"] + [f"  {p['message']}" for p in s["problems"]]
    return "\n".join(out) + "\n"
