"""The GPU check: ridgescope's CUDA source against PyTorch's own figures on a real GPU.

Run by benchmarks/gpu_check.sh after it built the extension (docs/gpu.md says how). Each check
prints one line, ``PASS name: detail``, ``FAIL name: detail`` or ``SKIP name: why``, and the
script ends with ``GPU_CHECK_SUMMARY {json}`` (also written to OUT/gpu_check_summary.json).
Exit status: 0 when nothing failed.

Checks (issue 3 items 5-8, issue 4 item 6):
  exactness   GPT-style model, bf16 autocast, AdamW, several steps: at every phase boundary the
              ledger's allocated and reserved bytes equal torch.cuda.memory_allocated() /
              memory_reserved() (the session's consistency samples); the report's peak equals
              torch.cuda.max_memory_allocated(); memory_allocated() at each boundary of the loop
              is the same as in an untracked run of the same steps.
  history     the same run with torch's _record_memory_history: every alloc/free/segment entry
              agrees (address, requested size, order, hence lifetime) with ridgescope's events;
              live block sizes agree with torch's snapshot; ridgescope's snapshot export agrees.
  overhead    step time, interleaved rounds: untracked, tracked, _record_memory_history(
              stacks="python"); target: tracked at most 1 % over untracked.
  snapshot    a small real snapshot (torch's _dump_snapshot) and ridgescope's trace of the same
              run, written to OUT for tests/data.
  snapshot_inference (issue 14, unverified: written without a GPU) a snapshot of AdamW steps
              recorded after the model was built: the import ends in torch's state, at most 5 %
              unknown at its peak, and the storages of the parameters, gradients and AdamW state
              (torch's objects) get those categories.
  ooms        seeded OOMs under set_per_process_memory_fraction: an activation peak, a first-step
              optimizer OOM, fragmentation; each verdict; NVML vs memory_reserved() within the
              CUDA context size.

``--dry-run`` runs the plumbing on the CPU (no GPU): the comparison functions on synthetic
input, the overhead loop with a tiny model, the summary. It proves nothing about the GPU.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
# The package gpu_check.sh built and staged, else the source tree's.
sys.path.insert(0, os.environ.get("RIDGESCOPE_PKG_DIR") or str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "examples"))

import torch  # noqa: E402

import models  # noqa: E402
import ridgescope as rs  # noqa: E402
from ridgescope import _C  # noqa: E402

MiB = 1024 * 1024
RESULTS: list[dict[str, Any]] = []
FIGURES: dict[str, Any] = {}


# ---------------------------------------------------------------------------------- reporting
def finish(out: Path, name: str) -> int:
    """Writes OUT/<name>_summary.json (counts, results, figures), prints the
    ``<NAME>_SUMMARY {json}`` line and returns the exit status: 0 when nothing failed."""
    counts = {s: sum(1 for r in RESULTS if r["status"] == s) for s in ("PASS", "FAIL", "SKIP")}
    summary = {"counts": counts, "results": RESULTS, "figures": FIGURES}
    (out / f"{name}_summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"{name.upper()}_SUMMARY " + json.dumps({"counts": counts, "figures": FIGURES}, default=str),
          flush=True)
    return 0 if counts["FAIL"] == 0 else 1


def record(status: str, name: str, detail: str) -> None:
    print(f"{status} {name}: {detail}", flush=True)
    RESULTS.append({"check": name, "status": status, "detail": detail})


def check(name: str, ok: bool, detail: str) -> bool:
    record("PASS" if ok else "FAIL", name, detail)
    return ok


def skip(name: str, why: str) -> None:
    record("SKIP", name, why)


def section(name: str, fn: Callable[[], None]) -> None:
    """Runs one group of checks; an exception is a FAIL of the group, and the script goes on."""
    t0 = time.perf_counter()
    print(f"--- {name}", flush=True)
    try:
        fn()
    except Exception as exc:  # a broken section must not hide the others
        traceback.print_exc()
        record("FAIL", f"{name}.error", f"{type(exc).__name__}: {exc}")
    finally:
        FIGURES.setdefault("section_seconds", {})[name] = round(time.perf_counter() - t0, 2)
        if torch.cuda.is_available():
            torch.cuda.set_per_process_memory_fraction(1.0)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ------------------------------------------------------------------ comparisons (pure, tested)
def torch_sequence(trace: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    """torch's device trace as (action, address, size): allocations and frees with the requested
    size, segments with their bytes (map/unmap named as segment alloc/free)."""
    rename = {"segment_map": "segment_alloc", "segment_unmap": "segment_free"}
    out = []
    for e in trace:
        action = rename.get(e["action"], e["action"])
        if action in ("alloc", "free_requested", "segment_alloc", "segment_free"):
            out.append((action, int(e["addr"]), int(e["size"])))
    return out


def ridgescope_sequence(events: list[dict[str, Any]], device: str = "cuda:0",
                        after_metadata: str = "cuda_source",
                        limit: int | None = None) -> tuple[list[tuple[str, int, int]], dict[int, int]]:
    """ridgescope's events of `device` after the metadata record `after_metadata` (the events
    before it adopt what existed when the session started), in torch's terms: frees carry the
    requested size of their allocation. Also returns the live blocks (addr -> bytes) after the
    first `limit` entries (all when None)."""
    started = after_metadata is None
    live_requested: dict[int, int] = {}
    live_bytes: dict[int, int] = {}
    out: list[tuple[str, int, int]] = []
    for e in events:
        if limit is not None and len(out) >= limit:
            break
        if not started:
            if e["kind"] == "metadata" and e.get("string") == after_metadata:
                started = True
            elif e["kind"] == "alloc" and e.get("device") == device:
                live_requested[e["addr"]] = e.get("requested_bytes", e["bytes"])
                live_bytes[e["addr"]] = e["bytes"]
            elif e["kind"] == "free" and e.get("device") == device:
                live_requested.pop(e["addr"], None)
                live_bytes.pop(e["addr"], None)
            continue
        if e.get("device") != device:
            continue
        kind = e["kind"]
        if kind == "alloc":
            live_requested[e["addr"]] = e.get("requested_bytes", e["bytes"])
            live_bytes[e["addr"]] = e["bytes"]
            out.append(("alloc", e["addr"], live_requested[e["addr"]]))
        elif kind == "free":
            out.append(("free_requested", e["addr"], live_requested.pop(e["addr"], -1)))
            live_bytes.pop(e["addr"], None)
        elif kind in ("segment_alloc", "segment_free"):
            out.append((kind, e["addr"], e["bytes"]))
    return out, live_bytes


def first_difference(a: list[Any], b: list[Any]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"first difference at entry {i}: torch {x} vs ridgescope {y}"
    if len(a) != len(b):
        return f"lengths differ: torch {len(a)} vs ridgescope {len(b)}"
    return "identical"


def snapshot_live_blocks(snapshot: dict[str, Any], device: int = 0) -> dict[int, int]:
    """addr -> block size of every allocated block in a torch snapshot's segments."""
    out = {}
    for seg in snapshot.get("segments", []):
        if seg.get("device", 0) != device:
            continue
        addr = int(seg["address"])
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                out[addr] = int(b["size"])
            addr += int(b["size"])
    return out


def self_test_comparisons() -> None:
    """The comparison functions on synthetic input whose answer is known (run in --dry-run)."""
    torch_trace = [
        {"action": "segment_alloc", "addr": 0x1000000, "size": 2 * MiB},
        {"action": "alloc", "addr": 0x1000000, "size": 1000},
        {"action": "snapshot", "addr": 0, "size": 1024},
        {"action": "free_requested", "addr": 0x1000000, "size": 1000},
        {"action": "free_completed", "addr": 0x1000000, "size": 1000},
    ]
    events = [
        {"kind": "alloc", "device": "cuda:0", "addr": 0x5000000, "bytes": 512, "requested_bytes": 10},
        {"kind": "metadata", "string": "cuda_source"},
        {"kind": "segment_alloc", "device": "cuda:0", "addr": 0x1000000, "bytes": 2 * MiB},
        {"kind": "alloc", "device": "cuda:0", "addr": 0x1000000, "bytes": 1024, "requested_bytes": 1000},
        {"kind": "alloc", "device": "cpu", "addr": 0x77, "bytes": 8, "requested_bytes": 8},
        {"kind": "free", "device": "cuda:0", "addr": 0x1000000, "bytes": 1024},
    ]
    ours, live = ridgescope_sequence(events)
    check("selftest.sequences", torch_sequence(torch_trace) == ours,
          first_difference(torch_sequence(torch_trace), ours))
    check("selftest.adopted_blocks_stay_live", live == {0x5000000: 512}, str(live))
    snap = {"segments": [{"device": 0, "address": 0x1000000, "blocks": [
        {"size": 1024, "state": "active_allocated"}, {"size": 2 * MiB - 1024, "state": "inactive"}]}]}
    check("selftest.snapshot_blocks", snapshot_live_blocks(snap) == {0x1000000: 1024},
          str(snapshot_live_blocks(snap)))
    head, live_head = ridgescope_sequence(events, limit=2)
    check("selftest.limit", head == ours[:2] and live_head == {0x5000000: 512, 0x1000000: 1024},
          f"{head} {live_head}")
    bad = ours[:-1] + [("free_requested", 0x1000000, 999)]
    check("selftest.difference_found", "entry 2" in first_difference(torch_sequence(torch_trace), bad),
          first_difference(torch_sequence(torch_trace), bad))


# -------------------------------------------------------------------------------- workloads
class Workload:
    """A GPT-style model trained with bf16 autocast and AdamW, deterministic from a seed."""

    def __init__(self, device: str, vocab: int, d_model: int, heads: int, layers: int, seq: int,
                 batch: int) -> None:
        self.device = device
        self.cfg = dict(vocab=vocab, d_model=d_model, n_heads=heads, layers=layers, seq_len=seq)
        self.batch = batch
        g = torch.Generator().manual_seed(1234)
        self.inputs = [(torch.randint(0, vocab, (batch, seq), generator=g),
                        torch.randint(0, vocab, (batch, seq), generator=g)) for _ in range(4)]

    def make(self, seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(seed)
        model = models.TinyGPT(**self.cfg).to(self.device)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(self, model: torch.nn.Module, opt: torch.optim.Optimizer, i: int,
             marks: list[tuple[str, int, int]] | None = None) -> float:
        x, y = (t.to(self.device, non_blocking=True) for t in self.inputs[i % len(self.inputs)])
        dtype = torch.bfloat16
        with torch.autocast(self.device.split(":")[0], dtype=dtype):
            loss = models.gpt_loss(model, x, y)
        mark(marks, "forward")
        loss.backward()
        mark(marks, "backward")
        opt.step()
        mark(marks, "optimizer_step")
        opt.zero_grad(set_to_none=True)
        mark(marks, "zero_grad")
        return float(loss.detach())


def mark(marks: list[tuple[str, int, int]] | None, where: str) -> None:
    if marks is not None and torch.cuda.is_available():
        marks.append((where, torch.cuda.memory_allocated(), torch.cuda.memory_reserved()))


def fresh() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


# ------------------------------------------------------------------------ issue 3, item 5
def exactness(w: Workload, steps: int, out: Path) -> None:
    # Warm-up (cuBLAS workspaces and kernels are created once, then persist in both runs).
    model, opt = w.make()
    for i in range(2):
        w.step(model, opt, i)
    del model, opt
    fresh()

    untracked: list[tuple[str, int, int]] = []
    model, opt = w.make()
    losses_u = [w.step(model, opt, i, untracked) for i in range(steps)]
    peak_untracked = torch.cuda.max_memory_allocated()
    del model, opt
    fresh()

    tracked: list[tuple[str, int, int]] = []
    model, opt = w.make()
    trace = out / "exactness.rstrace"
    torch.cuda.reset_peak_memory_stats()
    with rs.track(model=model, optimizer=opt, out=trace) as session:
        losses_t = [w.step(model, opt, i, tracked) for i in range(steps)]
        torch.cuda.synchronize()
        max_allocated = torch.cuda.max_memory_allocated()
        end_allocated, end_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    check("exactness.cuda_source_live", session.cuda_status == "",
          f"cuda_status={session.cuda_status!r}, backend {_C._cuda_allocator_backend()!r}")
    report = session.report().to_dict()
    FIGURES["exactness_report_consistency"] = report["consistency"]
    FIGURES["cuda_source_stats"] = json.loads(_C._cuda_source_stats())
    c = report["consistency"]
    boundaries = sum(1 for s in report["steps"] for _ in s["phases"]) * 2
    check("exactness.allocated_and_reserved_at_every_phase_boundary",
          c["samples"] > 0 and c["mismatches"] == 0,
          f"{c['samples']} readings of memory_allocated()/memory_reserved() at phase boundaries "
          f"(~{boundaries} boundaries x 2 figures), {c['mismatches']} mismatches, first difference "
          f"{c['first_difference_bytes']} B")
    check("exactness.peak_equals_max_memory_allocated", report["peak"]["bytes"] == max_allocated,
          f"report peak {report['peak']['bytes']} B, torch.cuda.max_memory_allocated() {max_allocated} B")
    check("exactness.untracked_equals_tracked_memory_allocated",
          [m[:2] for m in untracked] == [m[:2] for m in tracked],
          f"{len(tracked)} boundaries; " + first_difference([m[:2] for m in untracked], [m[:2] for m in tracked]))
    # The first step's loss must be bitwise equal; later ones may differ by the GPU's own
    # nondeterminism (embedding backward uses atomics), the same between two untracked runs.
    check("exactness.tracking_changes_no_loss", losses_u[:1] == losses_t[:1],
          f"losses untracked {losses_u} vs tracked {losses_t} (all equal: {losses_u == losses_t})")
    check("exactness.peak_same_as_untracked", max_allocated == peak_untracked,
          f"tracked {max_allocated} B vs untracked {peak_untracked} B")
    stats = FIGURES["cuda_source_stats"]
    check("exactness.no_unknown_or_unmatched_entries",
          stats.get("unmatched_frees", 1) == 0 and stats.get("internal_errors", 1) == 0,
          json.dumps(stats))
    # The trampoline stamps the running module on every CUDA alloc, as the CPU source does.
    names = {n for n, _ in model.named_modules()} | {type(m).__name__ for m in model.modules()}
    contexts = [e["string"] for e in _C.read_events(str(trace))
                if e["kind"] == "alloc" and e["device"].startswith("cuda")]
    with_context = [s for s in contexts if s]
    check("exactness.cuda_allocs_carry_module_context",
          bool(with_context) and all(s in names for s in with_context),
          f"{len(with_context)} of {len(contexts)} CUDA allocations name a module; names not in "
          f"the model: {sorted(set(with_context) - names)[:5]}")
    totals = report.get("totals", {})
    # Workspace blocks (cuBLAS/cuBLASLt scratch that never backs a tensor) are tagged from
    # torch's workspace maps: at the end, the report's workspace bytes are what torch frees
    # when it drops its workspaces.
    ws_tagged = totals.get("final_by_category", {}).get("workspace", 0)
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is None or not _C._cuda_workspace_tags_compiled():
        skip("exactness.workspace_blocks_tagged",
             "this torch has no _cuda_clearCublasWorkspaces, or this build cannot read the maps")
    else:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        clear()
        torch.cuda.synchronize()
        freed = before - torch.cuda.memory_allocated()
        FIGURES["workspace_bytes"] = {"tagged": ws_tagged, "freed_by_clear": freed}
        check("exactness.workspace_blocks_tagged", freed > 0 and ws_tagged == freed,
              f"report's workspace at the end {ws_tagged} B; torch freed {freed} B of workspaces")
    FIGURES["exactness"] = {"boundaries": len(tracked), "peak_bytes": report["peak"]["bytes"],
                            "end_allocated": end_allocated, "end_reserved": end_reserved,
                            "totals": totals, "unknown_bytes_at_peak": report["peak"]["by_category"].get("unknown")}
    # The driver's view (issue 4 item 6): NVML against memory_reserved().
    dv = report.get("driver_view", {})
    FIGURES["driver_view"] = dv
    ctx = FIGURES.get("cuda_context_bytes")
    if not dv.get("available"):
        skip("nvml.reconciles_with_reserved", f"NVML not available: {dv.get('reason')}")
    elif ctx is None:
        skip("nvml.reconciles_with_reserved", "the CUDA context size could not be measured")
    else:
        slack = 512 * MiB
        check("nvml.reconciles_with_reserved",
              dv.get("samples", 0) > 0 and abs(int(dv.get("max_non_pytorch_bytes", 0)) - ctx) <= slack,
              f"max(NVML used - reserved) {dv.get('max_non_pytorch_bytes')} B vs measured CUDA context "
              f"and libraries {ctx} B (slack {slack} B), {dv.get('samples')} samples")
    del model, opt


# ------------------------------------------------------------------------ issue 3, item 6
def history(w: Workload, steps: int, out: Path) -> None:
    model, opt = w.make()
    fresh()
    trace = out / "history.rstrace"
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    try:
        with rs.track(model=model, optimizer=opt, out=trace) as session:
            for i in range(steps):
                w.step(model, opt, i)
            torch.cuda.synchronize()
            snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    events = _C.read_events(str(trace))
    theirs = torch_sequence(snap["device_traces"][0])
    # ridgescope's trace goes on until the session stops, a little after torch's snapshot: the
    # comparison covers torch's entries, and the live blocks are taken at the same point.
    ours, live = ridgescope_sequence(events, limit=len(theirs))
    check("history.every_entry_agrees", theirs == ours and len(ours) > 0,
          f"{len(theirs)} torch entries (alloc/free/segment), {len(ours)} ridgescope events; "
          + first_difference(theirs, ours))
    torch_live = snapshot_live_blocks(snap)
    diff = {a: (torch_live.get(a), live.get(a)) for a in set(torch_live) | set(live)
            if torch_live.get(a) != live.get(a)}
    check("history.live_block_sizes_agree", not diff and len(live) > 0,
          f"{len(torch_live)} live blocks in torch's snapshot; differences (torch, ridgescope): "
          + (str(dict(list(diff.items())[:5])) if diff else "none"))
    report = session.report()
    export = out / "history_export.pickle"
    wrote = False
    if hasattr(report, "to_snapshot"):
        report.to_snapshot(str(export))
        wrote = True
    elif hasattr(_C, "write_snapshot"):
        _C.write_snapshot(str(trace), str(export), cuda_device=0)
        wrote = True
    if not wrote:
        skip("history.export_agrees", "this build has no snapshot export")
    else:
        with open(export, "rb") as f:
            exported = pickle.load(f)  # our own file, written just now
        traces = exported.get("device_traces") or [[]]
        mine = torch_sequence(traces[0])
        # Our export starts with what existed at the session start; compare the common tail.
        tail = mine[-len(theirs):] if theirs else mine
        check("history.export_agrees", tail == theirs,
              f"{len(mine)} exported entries; " + first_difference(theirs, tail))
        export.unlink()
    del model, opt


# ------------------------------------------------------------------------ issue 3, item 7
def overhead(w: Workload, rounds: int, steps: int, out: Path, cuda: bool) -> None:
    model, opt = w.make()
    for i in range(2):
        w.step(model, opt, i)
    modes = ["untracked", "tracked"] + (["history_python"] if cuda else [])
    times: dict[str, list[float]] = {m: [] for m in modes}

    def timed_steps(mode: str) -> None:
        for i in range(steps):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            w.step(model, opt, i)
            if cuda:
                torch.cuda.synchronize()
            times[mode].append(time.perf_counter() - t0)

    for r in range(rounds):
        order = modes if r % 2 == 0 else list(reversed(modes))
        for mode in order:
            w.step(model, opt, 0)  # one untimed step after each switch
            if mode == "untracked":
                timed_steps(mode)
            elif mode == "tracked":
                with rs.track(model=model, optimizer=opt, out=out / "overhead.rstrace"):
                    timed_steps(mode)
            else:
                torch.cuda.memory._record_memory_history(stacks="python")
                try:
                    timed_steps(mode)
                finally:
                    torch.cuda.memory._record_memory_history(enabled=None)
    med = {m: statistics.median(v) for m, v in times.items()}
    FIGURES["overhead_median_step_ms"] = {m: round(v * 1e3, 3) for m, v in med.items()}
    over = (med["tracked"] / med["untracked"] - 1.0) * 100.0
    FIGURES["overhead_tracked_percent"] = round(over, 2)
    detail = (f"median step {med['untracked'] * 1e3:.2f} ms untracked, {med['tracked'] * 1e3:.2f} ms tracked "
              f"({over:+.2f} %)")
    if "history_python" in med:
        h = (med["history_python"] / med["untracked"] - 1.0) * 100.0
        FIGURES["overhead_history_percent"] = round(h, 2)
        detail += f", {med['history_python'] * 1e3:.2f} ms with _record_memory_history(stacks='python') ({h:+.2f} %)"
    detail += f"; {rounds} interleaved rounds x {steps} steps"
    if cuda:
        check("overhead.tracked_within_1_percent", over <= 1.0, detail)
    else:  # on the CPU every tensor goes through the CPU source: not the GPU's figure
        skip("overhead.tracked_within_1_percent", "dry run on the CPU, not a GPU figure: " + detail)
    (out / "overhead.rstrace").unlink(missing_ok=True)
    del model, opt


# ------------------------------------------------------------------------ issue 3, item 8
def small_snapshot(out: Path) -> None:
    w = Workload("cuda", vocab=512, d_model=128, heads=4, layers=2, seq=64, batch=4)
    model, opt = w.make()
    fresh()
    trace = out / "gpu_small.rstrace"
    torch.cuda.memory._record_memory_history(max_entries=20000, stacks="python")
    try:
        with rs.track(model=model, optimizer=opt, out=trace) as session:
            for i in range(2):
                w.step(model, opt, i)
        snap_path = out / "gpu_small_snapshot.pickle"
        torch.cuda.memory._dump_snapshot(str(snap_path))
        torch_peak = torch.cuda.max_memory_allocated()
        torch_end = torch.cuda.memory_allocated()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    report = session.report()
    # PyTorch's own snapshot, read back by ridgescope's importer (block sizes replayed from
    # the segments under allocator_settings): the same peak and end bytes as torch counted.
    imported = rs.load(snap_path).to_dict()
    imp = imported.get("snapshot", {})
    check("snapshot.import_peak_equals_max_memory_allocated",
          imported["peak"]["bytes"] == torch_peak and imported["totals"]["final_live_bytes"] == torch_end,
          f"imported peak {imported['peak']['bytes']} B vs max_memory_allocated {torch_peak} B; "
          f"end {imported['totals']['final_live_bytes']} B vs memory_allocated {torch_end} B; "
          f"{imp.get('blocks_larger_than_rounded')} of {imp.get('block_sizes_modelled')} blocks unsplit, "
          f"{imp.get('unmatched_entries')} unmatched entries")
    FIGURES["snapshot_import"] = {"peak": imported["peak"]["bytes"], "torch_peak": torch_peak,
                                  "tracked_peak": report.to_dict()["peak"]["bytes"],
                                  "blocks_larger_than_rounded": imp.get("blocks_larger_than_rounded"),
                                  "unmatched_entries": imp.get("unmatched_entries")}
    (out / "gpu_small_report.json").write_text(json.dumps(report.to_dict(), indent=1, sort_keys=True))
    how = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
           "model": "examples/models.py TinyGPT", "config": w.cfg, "batch": w.batch,
           "steps": 2, "optimizer": "AdamW(lr=1e-4)", "autocast": "bf16",
           "history": "_record_memory_history(max_entries=20000, stacks='python')",
           "made_by": "benchmarks/gpu_check.py small_snapshot()"}
    (out / "gpu_small_snapshot.json").write_text(json.dumps(how, indent=1))
    size = snap_path.stat().st_size
    check("snapshot.small_real_snapshot_written", 0 < size <= 4 * MiB,
          f"{snap_path.name} {size} B, {trace.name} {trace.stat().st_size} B (OUT, for tests/data)")
    del model, opt


# ------------------------------------------------------------------------ issue 14
def snapshot_inference(out: Path) -> None:
    """A snapshot torch writes of AdamW training recorded after the model was built (weights with
    no stack, as in most real snapshots), read by ridgescope's inference: it ends in torch's
    state, leaves at most 5 % of its peak unknown, and every block that torch's own objects say
    is a parameter, a gradient or AdamW state (by storage address) gets that category."""
    w = Workload("cuda", vocab=512, d_model=128, heads=4, layers=2, seq=64, batch=4)
    model, opt = w.make()
    fresh()
    path = out / "gpu_inference_snapshot.pickle"
    torch.cuda.memory._record_memory_history(max_entries=100000)  # Python and C++ stacks
    try:
        for i in range(3):
            w.step(model, opt, i)
        x, y = (t.to("cuda") for t in w.inputs[0])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = models.gpt_loss(model, x, y)
        loss.backward()  # the gradients are live when the snapshot is taken
        del loss
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(str(path))
        allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    report = rs.load(path)
    d = report.to_dict()
    peak = d["peak"]
    check("snapshot_inference.end_state_is_torchs",
          d["totals"]["final_live_bytes"] == allocated and d["totals"]["final_reserved_bytes"] == reserved,
          f"end {d['totals']['final_live_bytes']} B live, {d['totals']['final_reserved_bytes']} B reserved vs "
          f"memory_allocated {allocated} B, memory_reserved {reserved} B")
    check("snapshot_inference.unknown_at_most_5_percent", peak["by_category"]["unknown"] <= 0.05 * peak["bytes"],
          f"unknown {peak['by_category']['unknown']} B of a {peak['bytes']} B peak; "
          + ", ".join(f"{r['rule']} {r['peak_bytes']}" for r in d["snapshot"]["reasons"][:8]))
    export = out / "gpu_inference_export.pickle"
    report.to_snapshot(export)
    with open(export, "rb") as f:
        exported = pickle.load(f)  # ridgescope's own export: plain data
    category = {b["address"]: b.get("category") for s in exported["segments"] for b in s["blocks"]
                if b["state"] == "active_allocated"}
    truth = {"parameter": {p.untyped_storage().data_ptr() for p in model.parameters()},
             "gradient": {p.grad.untyped_storage().data_ptr() for p in model.parameters() if p.grad is not None},
             "optimizer_state": {t.untyped_storage().data_ptr() for st in opt.state.values() for t in st.values()
                                 if torch.is_tensor(t) and t.is_cuda}}
    for name, addresses in truth.items():
        wrong = sorted((hex(a), category.get(a)) for a in addresses if category.get(a) != name)
        check(f"snapshot_inference.{name}_blocks", bool(addresses) and not wrong,
              f"{len(addresses)} {name} storages by torch's objects; miscategorised: {wrong[:6]}")
    FIGURES["snapshot_inference"] = {"peak": peak["bytes"], "by_category": peak["by_category"],
                                     "reasons": [(r["rule"], r["peak_bytes"]) for r in d["snapshot"]["reasons"]]}
    export.unlink()
    del model, opt


# ------------------------------------------------------------------------ issue 4, item 6
def set_capacity(extra_bytes: int) -> int:
    """Lets the allocator reserve `extra_bytes` more than now; returns the limit in bytes."""
    total = torch.cuda.get_device_properties(0).total_memory
    limit = torch.cuda.memory_reserved() + extra_bytes
    torch.cuda.set_per_process_memory_fraction(limit / total, 0)
    return limit


def seeded_oom(name: str, out: Path, body: Callable[[], None], model=None, opt=None,
               want_kind: str = "", want_category: str | None = None) -> None:
    trace = out / f"oom_{name}.rstrace"
    raised = False  # a flag, not the exception: its traceback would keep the tensors alive
    try:
        with rs.track(model=model, optimizer=opt, out=trace):
            body()
    except torch.OutOfMemoryError:
        raised = True
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
    if not check(f"oom.{name}.raised", raised, "torch.OutOfMemoryError reached the caller"
                 if raised else "no OOM happened (the seeding is off)"):
        return
    report = rs.load(trace).to_dict()
    if not check(f"oom.{name}.recorded", bool(report["ooms"]), f"{len(report['ooms'])} OOM records"):
        return
    verdict = report["ooms"][-1]["verdict"]
    ok = verdict["kind"] == want_kind and (want_category is None or verdict.get("dominant_category") == want_category)
    check(f"oom.{name}.verdict", ok,
          f"verdict {verdict['kind']!r} (dominant {verdict.get('dominant_category')!r}), wanted {want_kind!r}"
          + (f"/{want_category!r}" if want_category else "") + f": {verdict.get('summary')}")
    FIGURES.setdefault("ooms", {})[name] = {"verdict": verdict["kind"], "summary": verdict.get("summary"),
                                             "request": report["ooms"][-1].get("request_bytes")}


def oom_activation(out: Path) -> None:
    # ~100 M parameters (0.4 GB); a forward saves over 1 GB of activations per layer, so with
    # 4 GiB to spare the OOM comes a few layers in, with activations dominating what is live.
    w = Workload("cuda", vocab=1024, d_model=1024, heads=16, layers=8, seq=1024, batch=8)
    model, opt = w.make()
    fresh()
    set_capacity(4096 * MiB)

    def body() -> None:
        x, y = (t.to("cuda") for t in w.inputs[0])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            models.gpt_loss(model, x, y).backward()

    seeded_oom("activation_peak", out, body, model, opt, want_kind="live_tensors", want_category="activation")
    del model, opt


def oom_first_step(out: Path) -> None:
    # Wide and shallow: ~400 M parameters (1.6 GB fp32), tiny activations, so forward and
    # backward fit and AdamW's two moments (3.2 GB) created lazily by the first step do not.
    w = Workload("cuda", vocab=1024, d_model=2048, heads=16, layers=8, seq=64, batch=1)
    model, opt = w.make()
    fresh()
    x, y = (t.to("cuda") for t in w.inputs[0])
    with torch.autocast("cuda", dtype=torch.bfloat16):
        models.gpt_loss(model, x, y).backward()
    need = torch.cuda.max_memory_reserved()
    opt.zero_grad(set_to_none=True)
    fresh()
    set_capacity(max(0, need - torch.cuda.memory_reserved()) + 256 * MiB)

    def body() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = models.gpt_loss(model, x, y)
        loss.backward()
        opt.step()

    seeded_oom("first_optimizer_step", out, body, model, opt, want_kind="lazy_optimizer_state")
    del model, opt, x, y


def oom_fragmentation(out: Path) -> None:
    fresh()
    holder: list[torch.Tensor] = []
    # Room for the 1 GiB segment below and 32 MiB more, set before tracking starts so that the
    # session records this capacity.
    set_capacity(1024 * MiB + 32 * MiB)

    def body() -> None:
        big = torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")
        del big  # a cached 1 GiB segment
        blocks = [torch.empty(60 * MiB, dtype=torch.uint8, device="cuda") for _ in range(16)]
        holder.extend(blocks[1::2])  # every other block stays live: 60 MiB holes between them
        del blocks
        torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")  # 544 MiB free, none of 100

    seeded_oom("fragmentation", out, body, want_kind="fragmentation")
    holder.clear()


def measure_context() -> None:
    """The CUDA context and libraries: this process's NVML usage minus memory_reserved()."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        torch.cuda.synchronize()
        used = None
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == os.getpid() and p.usedGpuMemory is not None:
                used = int(p.usedGpuMemory)
        if used is None:  # no per-process figure (containers): the whole device's
            used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        FIGURES["cuda_context_bytes"] = used - torch.cuda.memory_reserved()
        print(f"info CUDA context and libraries: {FIGURES['cuda_context_bytes']} B", flush=True)
    except Exception as exc:
        print(f"info NVML unavailable ({exc})", flush=True)


# ------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check-out")))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dry-run", action="store_true", help="CPU plumbing check, no GPU")
    ap.add_argument("--only", default="", help="comma-separated sections to run")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cuda = torch.cuda.is_available() and not args.dry_run
    FIGURES.update(torch=torch.__version__, cuda=torch.version.cuda, python=sys.version.split()[0],
                   cuda_source_compiled=_C._cuda_source_compiled(), dry_run=args.dry_run)
    only = set(filter(None, args.only.split(",")))
    want = (lambda s: not only or s in only)

    if not cuda:
        if not args.dry_run:
            record("FAIL", "setup", "no CUDA device; use --dry-run for the CPU plumbing check")
        else:
            section("selftest", self_test_comparisons)
            w = Workload("cpu", vocab=64, d_model=32, heads=2, layers=1, seq=16, batch=2)
            section("overhead", lambda: overhead(w, rounds=2, steps=3, out=args.out, cuda=False))
    else:
        FIGURES["device"] = torch.cuda.get_device_name(0)
        check("setup.cuda_source_compiled", _C._cuda_source_compiled(), "the trace tracker is in the module")
        torch.cuda.init()
        measure_context()
        w = Workload("cuda", vocab=8192, d_model=1024, heads=16, layers=8, seq=512, batch=8)
        if want("exactness"):
            section("exactness", lambda: exactness(w, args.steps, args.out))
        if want("history"):
            section("history", lambda: history(w, args.steps, args.out))
        if want("overhead"):
            # A step of realistic size (~20 TFLOP, tens of ms): the CPU work of tracking runs
            # while the GPU executes the step's kernels, as it does in real training.
            big = Workload("cuda", vocab=8192, d_model=1024, heads=16, layers=8, seq=1024, batch=32)
            section("overhead", lambda: overhead(big, rounds=5, steps=10, out=args.out, cuda=True))
        if want("snapshot"):
            section("snapshot", lambda: small_snapshot(args.out))
        if want("snapshot_inference"):
            section("snapshot_inference", lambda: snapshot_inference(args.out))
        if want("ooms"):
            section("oom_activation", lambda: oom_activation(args.out))
            section("oom_first_step", lambda: oom_first_step(args.out))
            section("oom_fragmentation", lambda: oom_fragmentation(args.out))
        for p in args.out.glob("*.rstrace"):
            if p.name != "gpu_small.rstrace":
                p.unlink()  # only a few files come back from the device

    FIGURES["seconds"] = round(time.perf_counter() - t0, 1)
    return finish(args.out, "gpu_check")


if __name__ == "__main__":
    sys.exit(main())
