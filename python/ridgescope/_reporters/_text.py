"""The plain-text report: what held memory at the peak, when, and what to look at."""
from __future__ import annotations

from typing import Any

from .. import _C
from .._format import format_bytes, format_count
from ._ledgers_text import device_ledger_lines, ledger_lines
from ._snapshot_text import confidence_lines, device_summary, inferred_note, reason_lines
from ._distributed_text import text_lines as distributed_text_lines
from ._glance_text import glance_lines

_SHOWN_PHASES = ("forward", "backward", "optimizer_step", "zero_grad", "checkpoint", "eval",
                 "recompute", "data")


def _composition(by_category: dict[str, int], total: int, limit: int = 4) -> str:
    parts = sorted(((v, k) for k, v in by_category.items() if v > 0), reverse=True)[:limit]
    return ", ".join(f"{k} {format_bytes(v)}" for v, k in parts) if parts else "-"


def _model_lines(d: dict[str, Any]) -> list[str]:
    m, o = d["model"], d["optimizer"]
    lines = []
    if m.get("parameters") is not None:
        dtypes = ", ".join(f"{k}" for k in m.get("dtypes", {})) or "?"
        trainable = m.get("trainable_parameters")
        frozen = "" if trainable == m["parameters"] else f", {format_count(trainable)} trainable"
        lines.append(f"Model: {m.get('class') or 'parameters'}: {format_count(m['parameters'])} "
                     f"parameters{frozen} ({dtypes}), {format_bytes(m['parameter_bytes'])}"
                     + (f"; buffers {format_bytes(m['buffer_bytes'])}" if m.get("buffer_bytes") else ""))
    if o.get("type"):
        spp = o.get("states_per_parameter")
        keys = ", ".join(o.get("state_keys") or []) or "none"
        lines.append(f"Optimizer: {o['type']}, "
                     + (f"{spp} state tensor(s) per parameter ({keys})" if spp is not None
                        else "state per parameter not known in advance")
                     + f"; {format_bytes(o['state_bytes'])} of optimizer state measured")
    per = m.get("persistent_bytes_per_trainable_parameter") or {}
    if per.get("expected") is not None or per.get("measured") is not None:
        exp = f"{per['expected']:.1f}" if per.get("expected") is not None else "?"
        mea = f"{per['measured']:.2f}" if per.get("measured") is not None else "not measured (no optimizer step)"
        lines.append(f"Persistent bytes per trainable parameter (parameters + gradients + optimizer "
                     f"state): expected {exp}, measured {mea}")
    return lines


def _models_lines(d: dict[str, Any]) -> list[str]:
    """Every model the run held (docs/report_schema.md, model.models), when there is more than
    the tracked one: its bytes at the peak, whether it trains, where it came from."""
    models = d["model"].get("models") or []
    if len(models) < 2:
        return []
    width = min(32, max(len(m["name"]) for m in models))
    lines = [f"Models: {len(models)}, with their parameters (and buffers) live at the peak:"]
    for m in models:
        at = m["at_peak"]
        notes = [m["class"] or "?", "trainable" if m["trainable"] else "frozen"]
        if m.get("copy_of"):
            notes.append(f"a copy of {m['copy_of']}'s parameters")
        if m.get("created_at"):
            notes.append(f"made at {m['created_at']}")
        buffers = f" + buffers {format_bytes(at['buffer_bytes'])}" if at["buffer_bytes"] else ""
        lines.append(f"  {m['name']:<{width}}  {format_bytes(at['parameter_bytes']):>10}{buffers}  "
                     f"{format_count(m['parameters'])} parameters ({', '.join(notes)})")
    return lines


def _pool_lines(d: dict[str, Any]) -> list[str]:
    """CUDA caching-allocator pools other than the default one (CUDA graphs), if recorded."""
    import json
    try:
        pools = json.loads(d.get("metadata", {}).get("cuda_pools", "{}")).get("pools", [])
    except (ValueError, AttributeError):
        return []
    private = [p for p in pools if p.get("pool_id") != [0, 0]]
    if not private:
        return []
    lines = ["CUDA memory pools when tracking stopped (private pools: CUDA graphs, MemPools):"]
    for p in pools:
        name = "default pool" if p["pool_id"] == [0, 0] else f"pool {tuple(p['pool_id'])}"
        lines.append(f"  cuda:{p['device']} {name:<16} {format_bytes(p['reserved_bytes']):>10} reserved "
                     f"in {p['segments']} segment(s), {format_bytes(p['allocated_bytes'])} allocated")
    return lines + [""]


def render_oom(o: dict[str, Any]) -> list[str]:
    """One failed request: what failed, why (the verdict and its evidence), what to change."""
    v = o.get("verdict") or {}
    lines = [f"  step {o['step']}, {o['phase']}: a request of {format_bytes(o['request_bytes'])} "
             f"failed with {format_bytes(o['live_bytes'])} live and "
             f"{format_bytes(o['device_free_bytes'])} free; live then: "
             f"{_composition(o['by_category'], o['live_bytes'], limit=5)}"]
    if v.get("kind"):
        lines.append(f"    Why ({v['kind']}): {v['summary']}")
        for e in v.get("evidence", []):
            lines.append(f"      - {e}")
        if v.get("remedies"):
            lines.append("    What to change:")
            for r in v["remedies"]:
                lines.append(f"      * {r['action']} (trade-off: {r['trade_off']})")
    return lines


def render_dashboards(d: dict[str, Any]) -> list[str]:
    """What periodic samplers would have drawn, next to the true peak."""
    peak = d["peak"]["bytes"]
    lines = [f"True peak (from the allocator): {format_bytes(peak)}"]
    for s in d.get("dashboards", []):
        lines.append(f"  a dashboard sampling every {s['period_s']} s: {s['samples']} sample(s), highest "
                     f"{format_bytes(s['max_sample_bytes'])}"
                     + ("" if s["max_sample_bytes"] >= peak else
                        f" ({format_bytes(peak - s['max_sample_bytes'])} below the true peak)"))
    if d["ooms"]:
        lines.append("  A failed request is never allocated, so no sampler ever shows it.")
    return lines


SMALL_POOL_REQUEST_BYTES = _C.CUDA_SMALL_POOL_REQUEST_BYTES  # the largest request the small pool serves


def render_free_space(d: dict[str, Any], request: int) -> list[str]:
    """Could `request` bytes be served from the cache at the peak (or at the probed instant)?"""
    probe = d.get("probe")
    where = f"At {probe['time_ns'] / 1e9:.3f} s" if probe else "At the peak"
    state = probe if probe else {"free": d["peak"]["free"], "live_bytes": d["peak"]["bytes"],
                                 "reserved_bytes": d["peak"]["reserved_bytes"]}
    free = state["free"]
    if free["free_blocks"] == 0 and state["reserved_bytes"] == state["live_bytes"]:
        return [f"{where} the allocator held no free memory in a cache (reserved equals live): "
                f"a request of {format_bytes(request)} needs new memory from the device."]
    # A request of at most 1 MiB comes from the small pool, a larger one from the large pool
    # (docs/forensics.md); a free block in one pool never serves the other.
    pool = "small" if request <= SMALL_POOL_REQUEST_BYTES else "large"
    largest = free[f"largest_free_block_{pool}_pool"]
    verdict = "could" if largest >= request else "could not"
    why = "" if verdict == "could" else (
        " although the cache holds enough in total: fragmentation" if free["free_bytes"] >= request else "")
    return [f"{where} the cache held {format_bytes(free['free_bytes'])} free in {free['free_blocks']} "
            f"block(s) ({format_bytes(free['inactive_split_bytes'])} of it inactive split), the "
            f"largest in the {pool} pool {format_bytes(largest)}: a request of "
            f"{format_bytes(request)} {verdict} be served from it{why}."]


def render_explain(d: dict[str, Any], request: int | None = None) -> str:
    """`ridgescope explain`: every OOM's verdict and remedies, and why dashboards disagree."""
    out = [f"ridgescope explain: {d['trace']['path']} ({d['device']}"
           + (f", capacity {format_bytes(d['device_capacity_bytes'])}" if d.get("device_capacity_bytes") else "")
           + ")", ""]
    out.extend(device_summary(d) + [""] if device_summary(d) else [])
    if d["ooms"]:
        out.append(f"Out of memory ({len(d['ooms'])}):")
        for o in d["ooms"]:
            out.extend(render_oom(o))
    else:
        out.append("No out-of-memory error in this trace.")
        p = d["peak"]
        out.append(f"Its peak: {format_bytes(p['bytes'])} in step {p['step']}, {p['phase']}: "
                   f"{_composition(p['by_category'], p['bytes'], limit=5)}")
    retained = render_retained(d)
    if retained:
        out.append("")
        out.extend(retained)
    ledger = device_ledger_lines(d)
    if ledger:
        out.append("")
        out.extend(ledger[:-1])
    if request is not None:
        out.append("")
        out.extend(render_free_space(d, request))
    out.append("")
    out.extend(render_dashboards(d))
    return "\n".join(out).rstrip() + "\n"


def render_sites(peak: dict[str, Any], max_sites: int = 10) -> list[str]:
    """The allocation sites at the peak (docs/sites.md): bytes by site, per category."""
    rows = peak.get("by_site") or []
    if not rows:
        return []
    out = ["Allocation sites at the peak (bytes by site and category):"]
    for s in rows[:max_sites]:
        out.append(f"  {format_bytes(s['bytes']):>10}  {s['category']:<16} {s['site']}"
                   f"  ({s['blocks']} block{'s' if s['blocks'] != 1 else ''})")
    if len(rows) > max_sites:
        out.append(f"  ... {len(rows) - max_sites} more in the JSON report (peak.by_site)")
    out.append("")
    return out


def render_retained(d: dict[str, Any]) -> list[str]:
    """The retained-tensor verdict: bytes kept across steps that grow at every step end."""
    r = d.get("retained")
    if not r:
        return []
    v = r["verdict"]
    lines = [f"Retained tensors ({v['kind']}): {v['summary']}"]
    for e in v.get("evidence", []):
        lines.append(f"  - {e}")
    for rem in v.get("remedies", []):
        lines.append(f"  * {rem['action']}")
    return lines


def _header_and_peak_lines(d: dict[str, Any]) -> list[str]:
    """The report's opening: the trace, the model, the peak and its composition."""
    out: list[str] = []
    t = d["trace"]
    steps = d["steps"]
    out.append(f"ridgescope report: {t['path']}")
    out.append(f"  device {d['device']}, {len(steps)} step(s), {t['events']:,} events, "
               f"{t['duration_ns'] / 1e9:.2f} s recorded")
    snap = d.get("snapshot")
    if snap:  # built from a torch memory snapshot pickle (docs/snapshot.md)
        inferred = [k.replace("_", " ") for k, v in snap["inferred"].items() if v]
        out.append(f"  read from a torch memory snapshot written by {snap['producer']}; inferred: "
                   f"{', '.join(inferred) if inferred else 'nothing'}")
        out.extend(f"  note: {n}" for n in snap["notes"])
        out.extend([""] + device_summary(d) if device_summary(d) else [])
    out.append("")
    out.extend(glance_lines(d))  # a long run's every step, summarised (docs/long-runs.md)
    dist_lines = distributed_text_lines(d)  # the rank and its DDP/FSDP/ZeRO state, if any
    if dist_lines:
        out.extend(dist_lines + [""])
    out.extend(_model_lines(d))
    out.extend(_models_lines(d))
    if d["model"].get("parameters") is not None or d["optimizer"].get("type"):
        out.append("")

    p = d["peak"]
    total = p["bytes"]
    where = " > ".join(p["phase_stack"]) if p["phase_stack"] else "idle (outside any phase)"
    out.append(f"Peak: {format_bytes(total)} live in step {p['step']}, during {where}")
    for name, value in sorted(p["by_category"].items(), key=lambda kv: -kv[1]):
        if value == 0:
            continue
        inferred = p["inferred_by_category"].get(name, 0)
        if snap:  # a snapshot's: by the rules below, the weaker ones' share named
            note = inferred_note(d, name, inferred)
        else:
            note = f"  ({format_bytes(inferred)} inferred from lifetimes)" if inferred else ""
        out.append(f"  {name:<16} {format_bytes(value):>10}  {100 * value / total:5.1f}%{note}")
    unknown = p["by_category"].get("unknown", 0)
    if total and unknown / total >= 0.01:
        out.append(f"  note: {100 * unknown / total:.1f}% of the peak is unattributed (unknown)")
    out.extend(confidence_lines(d))
    out.extend([""] + reason_lines(d) if reason_lines(d) else [])
    out.append("")
    return out


def frame_text(f: dict[str, Any]) -> str:
    """A report frame as a person reads it, with its whole path: the core's spelling
    (``frames[].location``: "/home/me/train.py:10 in main", "MmBackward0 of fc1")."""
    return f["location"]


def user_callers(frames: list[dict[str, Any]], site: int | None) -> list[dict[str, Any]]:
    """The frames of a stack outside its site that a person reads, innermost first: those the
    core did not mark library code (``frames[].library``: torch's, the standard library's and
    native frames are), less markers."""
    outer = frames[site + 1:] if site is not None else frames
    return [f for f in outer if not f["library"] and f["kind"] != "untracked"]


def render_stacks(d: dict[str, Any], max_stacks: int = 20, max_frames: int = 8,
                  library_frames: bool = False) -> list[str]:
    """The peak's live bytes by allocation stack, largest first, with their categories: the
    site and the frames that called it. Library frames (``frames[].library``: torch's, the
    standard library's, the interpreter's and libc's native ones) are folded away unless
    `library_frames`, which prints every frame, innermost first, library ones marked."""
    p = d["peak"]
    rows = p.get("stacks") or []
    frames = d.get("frames") or []
    if not rows:
        return ["No allocation stacks were recorded (a trace made with stacks=None, or a "
                "snapshot without frames)."]
    out = [f"Live bytes at the peak by allocation stack ({len(rows)} stack"
           f"{'s' if len(rows) != 1 else ''}, largest first):"]
    for n, st in enumerate(rows[:max_stacks], 1):
        cats = ", ".join(f"{c} {format_bytes(b)}" for c, b in
                         sorted(st["by_category"].items(), key=lambda kv: -kv[1]) if b)
        out.append(f"  {n:>3}. {format_bytes(st['bytes']):>10} in {st['blocks']} block"
                   f"{'s' if st['blocks'] != 1 else ''}: {cats}")
        fr = [frames[i] for i in st["frames"]]
        if not fr:
            out.append("         (no stack recorded" + (": the smaller stacks, merged)"
                                                       if p.get("stacks_merged") and n == len(rows)
                                                       else ")"))
            continue
        site = st.get("site")
        if library_frames:
            for k, f in enumerate(fr):
                lead = "at" if k == 0 else "from"
                mark = "  <- site" if k == site else ("  [library]" if f["library"] else "")
                out.append(f"         {lead} {frame_text(f)}{mark}")
            continue
        # The site, then the user's frames that led to it (the rest is in the JSON report).
        shown = ([fr[site]] if site is not None else []) + user_callers(fr, site)
        if not shown:  # nothing but library code: its innermost frame
            shown = fr[:1]
        for k, f in enumerate(shown[:max_frames]):
            lead = "at" if k == 0 else "from"
            mark = "  <- site" if k == 0 and site is not None else ""
            out.append(f"         {lead} {frame_text(f)}{mark}")
        hidden = len(fr) - min(len(shown), max_frames)
        if hidden > 0:
            out.append(f"         ({hidden} more frame(s) folded, library code included: --library-frames "
                       "prints every one; the JSON report has them in peak.stacks)")
    if len(rows) > max_stacks:
        rest = sum(st["bytes"] for st in rows[max_stacks:])
        out.append(f"  ... {len(rows) - max_stacks} more stack(s), {format_bytes(rest)}, in the JSON "
                   "report (peak.stacks)")
    return out


def render_grouped(d: dict[str, Any], by: str, limit: int = 20, library_frames: bool = False) -> str:
    """The report's opening, then the peak's live bytes grouped by allocation `site` or `stack`
    (ridgescope report --group-by; `library_frames`: every frame of each stack, --library-frames)."""
    out = _header_and_peak_lines(d)
    if by == "site":
        lines = render_sites(d["peak"], max_sites=limit)
        out.extend(lines or ["No allocation sites were recorded (a trace made with stacks=None, "
                             "or a snapshot without frames)."])
    else:
        out.extend(render_stacks(d, max_stacks=limit, library_frames=library_frames))
    return "\n".join(out).rstrip() + "\n"


def render_text(d: dict[str, Any], max_blocks: int = 10, max_steps: int = 6) -> str:
    out = _header_and_peak_lines(d)
    p = d["peak"]
    steps = d["steps"]

    if p["top_blocks"]:
        out.append("Largest blocks live at the peak:")
        for b in p["top_blocks"][:max_blocks]:
            site = f"; site {b['site']}" if b.get("site") else ""
            out.append(f"  {format_bytes(b['bytes']):>10}  {b['category']:<16} {b['label']}"
                       f"  [allocated in {b['phase_allocated']}, step {b['step_allocated']}{site}]")
        out.append("")

    out.extend(render_sites(p, max_sites=max_blocks))

    if steps:
        out.append("Per step and phase (bytes at start -> end, own peak, composition at that peak):")
        shown = steps if len(steps) <= max_steps else steps[:max_steps - 1] + steps[-1:]
        for s in shown:
            if s is shown[-1] and len(steps) > max_steps:
                out.append(f"  ... {len(steps) - max_steps + 1} step(s) not shown (see the JSON report)")
            out.append(f"  step {s['step']}{'' if s['complete'] else ' (incomplete)'}: peak "
                       f"{format_bytes(s['peak_bytes'])}")
            for ph in s["phases"]:
                indent = "  " * ph["depth"]
                idx = f"#{ph['index']}" if ph["index"] else ""
                out.append(f"    {indent}{ph['phase'] + idx:<18} {format_bytes(ph['start_bytes']):>10} -> "
                           f"{format_bytes(ph['end_bytes']):>10}  peak {format_bytes(ph['peak_bytes']):>10}  "
                           f"{_composition(ph['peak_by_category'], ph['peak_bytes'])}")
        out.append("")

    out.extend(_pool_lines(d))
    out.extend(ledger_lines(d))  # the device ledger and the host's resident set

    if d["ooms"]:
        cap = d.get("device_capacity_bytes")
        out.append(f"Out of memory ({len(d['ooms'])}):" + (f" device capacity {format_bytes(cap)}" if cap else ""))
        for o in d["ooms"]:
            out.extend(render_oom(o))
        out.append("")

    if d["warnings"]:
        out.append("Warnings:")
        for w in d["warnings"]:
            out.append(f"  ! {w['message']}")
        out.append("")
    c = d["consistency"]
    if c["samples"]:
        verdict = "all agree" if c["mismatches"] == 0 else f"{c['mismatches']} disagree"
        out.append(f"Checked against the allocator's own count at {c['samples']} phase boundaries: {verdict}.")
    rec = d.get("recorder")
    if rec:
        dropped = f", {rec['dropped_events']:,} dropped" if rec.get("dropped_events") else ""
        out.append(f"ridgescope's own cost: {rec['events']:,} events{dropped}, a "
                   f"{format_bytes(rec['bytes_written'])} trace, at most "
                   f"{format_bytes(rec['buffer_bytes_peak'])} of recording buffer.")
    return "\n".join(out).rstrip() + "\n"
