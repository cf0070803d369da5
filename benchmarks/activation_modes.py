"""How far the default recording and lifetime inference are from the saved-tensor hook on every
step, block by block.

The saved-tensor hook is exact and costs torch's hook machinery a few microseconds per saved
tensor (docs/performance.md, issue 25). ``activations="every_step"`` runs it in every step: the
truth here. The default (``activations=True``) runs it in the first two steps only and labels
the activations lifetimes find later with the savers it named for the same allocations
(docs/categories.md, "Savers learned from the hook's first steps"); ``activations=False`` never
runs it and infers activations from lifetimes, labelled by the module that made them. This
benchmark runs each ground-truth workload (benchmarks/truth_workloads.py) in the three modes
from the same seed and compares the default's and the lifetimes' traces with the truth's.

* A first run of each workload, not compared, warms torch.compile's caches.
* The runs make the same allocations in the same order (the hook allocates no tensor): the
  n-th allocation of both has the same size. Where the orders differ (autocast's casts), the
  allocations are paired along the longest runs of equal sizes, and those left over are
  reported (``unpaired_bytes``), not scored. Every allocation's category and label come from
  each trace's snapshot export (``report.to_snapshot``).
* ``allocated``: over every allocation of the run, each counted once with its bytes: the share
  of bytes in a different category (``wrong``) and half the L1 distance of the two compositions
  (``misattributed``).
* ``peak``: the peak of each report (bytes, and composition by category): ``bytes_equal`` and
  half the L1 distance of the two compositions as a share of the hook run's peak.
* ``confusion``: bytes by (hook's category -> lifetime's category) over the allocations that
  differ.
* ``activation``: precision and recall, by bytes, of the lifetime run's ``activation`` against
  the hook's.
* ``labels``: over the allocations both runs call ``activation``, by bytes, whether the module a
  user reads agrees. The hook names the module that *saved* the tensor ("activation saved in
  layers.0.attn"); lifetimes name the module that was running when it was *made* ("activation
  in layers.0.attn.qkv"). A tensor saved outside every module (the loss's) has no module in the
  hook's label; one made outside every module has none in the lifetimes'; an activation tagged
  alike in both modes (the model's output) is compared by its label. ``same_module``: the
  same module (or none in both); ``same_parent``: the same module or one inside the other
  (``layers.0.attn`` and ``layers.0.attn.qkv``); ``same_block``: the same first two components
  of the path (``layers.0``), the layer a user looks for; ``differ``: the largest
  disagreements, ``truth's module -> the mode's module: bytes``.
* ``later_steps``: ``labels`` over the steps after the hook's (from the third on): where the
  default differs from the truth, if anywhere.
* ``summaries_equal``: whether the per-step summaries (``rs.load(...).to_dict()["at_a_glance"]``
  rows) are the truth's.

The DDP workload is left out: its ranks start their own sessions in processes of their own.
Prints ONE JSON object; ``--out FILE`` writes a copy.

    python benchmarks/activation_modes.py                 # about 40 s on 2 cores
    python benchmarks/activation_modes.py --workloads transformer_adamw,checkpoint_reentrant
"""
from __future__ import annotations

import argparse
import difflib
import os
import pickle
import platform
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import truth_workloads  # noqa: E402
from _emit import emit_json  # noqa: E402

import ridgescope as rs  # noqa: E402

SKIPPED = {"ddp_gloo": "its ranks start their own sessions in processes of their own"}


SAVED_IN = "activation saved in "
SAVED_OUTSIDE = "activation saved outside the model"


def named_module(category: str, meta: dict) -> str:
    """The module a user reads for an allocation: for an activation labelled with its saver (the
    hook's tag, or the saver learned from the hook's steps), that module ('' when saved outside
    the model); for one labelled otherwise (the model's output, tagged alike in every mode) its
    label; else the module that was running when it was made ('' outside every module)."""
    label = meta.get("label") or ""
    if category == "activation" and label:  # the hook's saver (tagged, or learned from its steps)
        if label.startswith(SAVED_IN):
            return label[len(SAVED_IN):]
        if label.startswith(SAVED_OUTSIDE):
            return ""
        return label
    return meta.get("module") or ""


def related(a: str, b: str) -> bool:
    """The same module, or one inside the other (``layers.0.attn`` and ``layers.0.attn.qkv``)."""
    return a == b or (a != "" and b != "" and (b.startswith(a + ".") or a.startswith(b + ".")))


def block_of(name: str) -> str:
    return ".".join(name.split(".")[:2])


class Alloc(NamedTuple):
    """One allocation of a trace, as its snapshot export describes it."""
    size: int
    category: str
    named: str   # the module a user reads (named_module)
    site: str    # the allocation's site ("train.py:42 in Block.forward")
    made: str    # the module running when it was made ('' outside every module)
    step: int


def allocations(trace: Path, work: Path, tag: str) -> tuple[list[Alloc], dict]:
    """Every allocation of the trace, in order, and its report's peak."""
    report = rs.load(trace)
    path = work / f"{trace.stem}.{tag}.pickle"
    report.to_snapshot(path)
    with open(path, "rb") as f:
        snapshot = pickle.load(f)  # noqa: S301 - ridgescope's own export of the run just made
    out = []
    for e in snapshot["device_traces"][0]:
        if e["action"] != "alloc":
            continue
        meta = e.get("user_metadata") or {}
        category = e.get("category", "unknown")
        out.append(Alloc(e["size"], category, named_module(category, meta),
                         meta.get("site") or "", meta.get("module") or "", int(meta.get("step", -1))))
    return out, report.to_dict()["peak"]


def paired(hook: list[Alloc], life: list[Alloc]) -> list[tuple[Alloc, Alloc]]:
    """The allocations the two runs share, (hook's, lifetime's): the same sizes in the same order
    (difflib's longest matching runs of the size sequences)."""
    sizes_hook, sizes_life = [a.size for a in hook], [a.size for a in life]
    if sizes_hook == sizes_life:
        return list(zip(hook, life))
    matcher = difflib.SequenceMatcher(None, sizes_hook, sizes_life, autojunk=False)
    return [(hook[i + k], life[j + k]) for i, j, size in matcher.get_matching_blocks() for k in range(size)]


def agreement(both: list[tuple[int, str, str]]) -> dict[str, Any]:
    """(bytes, the truth's module, the module said) -> the shares, by bytes, that agree."""
    total = sum(n for n, _, _ in both)
    differ: dict[str, int] = defaultdict(int)
    for n, hm, lm in both:
        if hm != lm:
            differ[f"{hm or '(outside the model)'} -> {lm or '(outside every module)'}"] += n

    def share(pred: Any) -> float | None:
        return round(sum(n for n, hm, lm in both if pred(hm, lm)) / total, 4) if total else None
    return {"bytes": total,
            "same_module": share(lambda a, b: a == b),
            "same_parent": share(related),
            "same_block": share(lambda a, b: block_of(a) == block_of(b)),
            "differ": dict(sorted(differ.items(), key=lambda kv: -kv[1])[:6])}


def label_agreement(pairs: list[tuple[Alloc, Alloc]]) -> dict[str, Any]:
    """Over the allocations both runs call activation: how often, by bytes, the module the user
    reads agrees (module docstring, ``labels``)."""
    return agreement([(h.size, h.named, l.named) for h, l in pairs
                      if h.category == l.category == "activation"])


def half_l1(a: dict[str, int], b: dict[str, int]) -> int:
    return sum(abs(a.get(c, 0) - b.get(c, 0)) for c in set(a) | set(b)) // 2


MODES = {"truth": "every_step", "default": True, "lifetimes": False}


def run(name: str, work: Path, steps: int, mode: str) -> Path:
    truth_workloads.TRACK_OPTIONS = {"activations": MODES[mode]}
    sub = work / mode
    sub.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    return truth_workloads.WORKLOADS[name](sub, steps)


def glance_rows(trace: Path) -> Any:
    """The per-step summaries' columns and rows, without the times (which differ run to run)."""
    g = rs.load(trace).to_dict().get("at_a_glance") or {}
    columns = g.get("columns") or []
    keep = [i for i, c in enumerate(columns) if not c.endswith("_ns")]
    return [columns[i] for i in keep], [[row[i] for i in keep] for row in g.get("rows") or []]


def compare(truth: list[Alloc], truth_peak: dict, other: list[Alloc], other_peak: dict) -> dict[str, Any]:
    """The mode's trace against the truth's (module docstring)."""
    pairs = paired(truth, other)
    total = sum(h.size for h, _ in pairs)
    wrong = sum(h.size for h, l in pairs if h.category != l.category)
    by_truth, said = defaultdict(int), defaultdict(int)
    confusion: dict[str, int] = defaultdict(int)
    for n, a, b in ((h.size, h.category, l.category) for h, l in pairs):
        by_truth[a] += n
        said[b] += n
        if a != b:
            confusion[f"{a} -> {b}"] += n
    tp = sum(h.size for h, l in pairs if h.category == l.category == "activation")
    act_truth, act_said = by_truth.get("activation", 0), said.get("activation", 0)
    peak_l1 = half_l1(truth_peak["by_category"], other_peak["by_category"])
    return {
        # allocations of one run with no same-sized counterpart in the other's order (autocast's
        # casts can come in another order): left out of the comparison, their bytes reported
        "unpaired_bytes": sum(a.size for a in truth) + sum(a.size for a in other) - 2 * total,
        "allocated": {"bytes": total, "wrong": round(wrong / total, 5) if total else 0.0,
                      "misattributed": round(half_l1(by_truth, said) / total, 5) if total else 0.0},
        "peak": {"truth_bytes": truth_peak["bytes"], "bytes": other_peak["bytes"],
                 "bytes_equal": truth_peak["bytes"] == other_peak["bytes"],
                 "misattributed": round(peak_l1 / truth_peak["bytes"], 5) if truth_peak["bytes"] else 0.0,
                 "labels_equal": truth_peak.get("by_label") == other_peak.get("by_label")},
        "activation": {"truth_bytes": act_truth, "bytes": act_said,
                       "precision": round(tp / act_said, 4) if act_said else None,
                       "recall": round(tp / act_truth, 4) if act_truth else None},
        "confusion": dict(sorted(confusion.items(), key=lambda kv: -kv[1])),
        "labels": label_agreement(pairs),
        "later_steps": label_agreement([(h, l) for h, l in pairs if h.step >= 2]),
    }


def measure(name: str, work: Path, steps: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    # A first run warms torch.compile's caches, so that every compared run compiles alike (the
    # first compilation in a process allocates differently from a cached one).
    run(name, work / "warm-up", steps, "truth")
    traces = {mode: run(name, work, steps, mode) for mode in MODES}
    allocs = {mode: allocations(trace, work, mode) for mode, trace in traces.items()}
    truth, truth_peak = allocs["truth"]
    out: dict[str, Any] = {"workload": name, "allocations": len(truth)}
    for mode in ("default", "lifetimes"):
        out[mode] = compare(truth, truth_peak, *allocs[mode])
        out[mode]["summaries_equal"] = glance_rows(traces[mode]) == glance_rows(traces["truth"])
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names_all = [n for n in truth_workloads.WORKLOADS if n not in SKIPPED]
    p.add_argument("--workloads", default=",".join(names_all), help="comma-separated (default: all but DDP)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", default=None, help="also write the JSON to this file")
    args = p.parse_args(argv)
    names = [n for n in args.workloads.split(",") if n]
    unknown = [n for n in names if n not in truth_workloads.WORKLOADS or n in SKIPPED]
    if unknown:
        p.error(f"unknown or skipped workloads {unknown}; known: {', '.join(names_all)}")
    truth_workloads.FREE_STACKS = False  # the frees' stacks are the snapshot benchmark's, not needed here
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    results = []
    with tempfile.TemporaryDirectory(prefix="activation-modes-") as tmp:
        for name in names:
            print(f"[activation_modes] {name} ...", file=sys.stderr, flush=True)
            r = measure(name, Path(tmp) / name, args.steps)
            results.append(r)
            for mode in ("default", "lifetimes"):
                m = r[mode]
                print(f"[activation_modes] {name} {mode}: allocated wrong {m['allocated']['wrong']:.2%}, "
                      f"peak misattributed {m['peak']['misattributed']:.2%}, peak bytes equal "
                      f"{m['peak']['bytes_equal']}, peak labels equal {m['peak']['labels_equal']}, activation "
                      f"modules same/parent/block {m['labels']['same_module']}/{m['labels']['same_parent']}/"
                      f"{m['labels']['same_block']}, summaries equal {m['summaries_equal']}",
                      file=sys.stderr, flush=True)
    out = {"schema_version": 2, "benchmark": "activation_modes", "modes": MODES, "date": time.strftime("%Y-%m-%d"),
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "python": platform.python_version(),
           "torch": torch.__version__, "ridgescope": rs.__version__, "steps": args.steps,
           "skipped": SKIPPED, "workloads": results}
    emit_json(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
