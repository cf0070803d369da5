"""How far lifetime inference (``activations=False``) is from the saved-tensor hook, block by block.

The default recording tags activations with torch's saved-tensor hook, which is exact and costs
torch's hook machinery a few microseconds per saved tensor (docs/performance.md, issue 25).
``activations=False`` installs no hook and infers activations from lifetimes
(docs/categories.md). This benchmark measures that inference against the hook's exact answer on
the ground-truth workloads (benchmarks/truth_workloads.py): each workload runs twice, from the
same seed, once with the hook and once without, and the two traces are compared.

* The two runs make the same allocations in the same order (the hook allocates no tensor): the
  n-th allocation of both has the same size. Where the orders differ (autocast's casts), the
  allocations are paired along the longest runs of equal sizes, and those left over are
  reported (``unpaired_bytes``), not scored. Every allocation's
  category comes from each trace's snapshot export (``report.to_snapshot``): the hook's is the
  truth, the lifetime run's the inference.
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
  disagreements, ``hook's module -> lifetimes' module: bytes``.
* ``learned``: the same comparison for a design not built: the hook on for the first step only,
  and each later activation labelled with the saver the hook named in that step for the same
  key: site, module made in, and how many allocations of that site and module came before it
  in its step (where that saver was unique; elsewhere the lifetimes' own module). Over the
  activations of the steps after the first; ``covered``: the share of their bytes whose key the
  first step had seen with one saver.

The DDP workload is left out: its ranks start their own sessions in processes of their own.
Prints ONE JSON object; ``--out FILE`` writes a copy.

    python benchmarks/activation_modes.py                 # about 20 s on 2 cores
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
    """The module a user reads for an allocation: for an activation the hook tagged, the module
    its label names as the saver ('' when saved outside the model); for one tagged otherwise
    (the model's output, tagged alike in both modes) its label; else the module that was running
    when it was made ('' outside every module)."""
    label = meta.get("label") or ""
    if category == "activation" and label and not meta.get("category_inferred", False):
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


def learned_labels(pairs: list[tuple[Alloc, Alloc]], learn_steps: int = 1) -> dict[str, Any]:
    """What labels learned from the hook's first steps would give the later steps of a run without
    it (module docstring, ``learned``). An allocation's key: its site, the module it was made in,
    and how many allocations with that site and module came before it in its step (a step
    repeats the same allocations in the same order). The hook run's first ``learn_steps`` steps
    give each key its savers; the lifetime run's activations of the later steps take the saver
    of their key where it was unique, elsewhere the lifetimes' own module."""
    def keyed(records: list[Alloc]) -> list[tuple[str, str, int]]:
        counts: dict[tuple[int, str, str], int] = defaultdict(int)
        keys = []
        for a in records:
            k = (a.step, a.site, a.made)
            keys.append((a.site, a.made, counts[k]))
            counts[k] += 1
        return keys
    hook_keys = keyed([h for h, _ in pairs])
    life_keys = keyed([l for _, l in pairs])
    seen: dict[tuple[str, str, int], set[str]] = defaultdict(set)
    for (h, _), key in zip(pairs, hook_keys):
        if 0 <= h.step < learn_steps and h.category == "activation":
            seen[key].add(h.named)
    both, covered = [], 0
    for (h, l), key in zip(pairs, life_keys):
        if h.step < learn_steps or not h.category == l.category == "activation":
            continue
        savers = seen.get(key)
        if savers is not None and len(savers) == 1:
            covered += h.size
            both.append((h.size, h.named, next(iter(savers))))
        else:
            both.append((h.size, h.named, l.named))
    out = agreement(both)
    out["learn_steps"] = learn_steps
    out["covered"] = round(covered / out["bytes"], 4) if out["bytes"] else None
    return out


def half_l1(a: dict[str, int], b: dict[str, int]) -> int:
    return sum(abs(a.get(c, 0) - b.get(c, 0)) for c in set(a) | set(b)) // 2


def run(name: str, work: Path, steps: int, activations: bool) -> Path:
    truth_workloads.TRACK_OPTIONS = {"activations": activations}
    sub = work / ("hook" if activations else "lifetime")
    sub.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    return truth_workloads.WORKLOADS[name](sub, steps)


def measure(name: str, work: Path, steps: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    hook, hook_peak = allocations(run(name, work, steps, True), work, "hook")
    life, life_peak = allocations(run(name, work, steps, False), work, "lifetime")
    pairs = paired(hook, life)
    total = sum(h.size for h, _ in pairs)
    wrong = sum(h.size for h, l in pairs if h.category != l.category)
    truth, said = defaultdict(int), defaultdict(int)
    confusion: dict[str, int] = defaultdict(int)
    for n, a, b in ((h.size, h.category, l.category) for h, l in pairs):
        truth[a] += n
        said[b] += n
        if a != b:
            confusion[f"{a} -> {b}"] += n
    tp = sum(h.size for h, l in pairs if h.category == l.category == "activation")
    act_truth, act_said = truth.get("activation", 0), said.get("activation", 0)
    peak_l1 = half_l1(hook_peak["by_category"], life_peak["by_category"])
    return {
        "workload": name,
        "allocations": len(hook),
        # allocations of one run with no same-sized counterpart in the other's order (autocast's
        # casts can come in another order): left out of the comparison, their bytes reported
        "unpaired_bytes": sum(a.size for a in hook) + sum(a.size for a in life) - 2 * total,
        "allocated": {"bytes": total, "wrong": round(wrong / total, 5) if total else 0.0,
                      "misattributed": round(half_l1(truth, said) / total, 5) if total else 0.0},
        "peak": {"hook_bytes": hook_peak["bytes"], "lifetime_bytes": life_peak["bytes"],
                 "bytes_equal": hook_peak["bytes"] == life_peak["bytes"],
                 "misattributed": round(peak_l1 / hook_peak["bytes"], 5) if hook_peak["bytes"] else 0.0,
                 "hook_by_category": {c: n for c, n in hook_peak["by_category"].items() if n},
                 "lifetime_by_category": {c: n for c, n in life_peak["by_category"].items() if n}},
        "activation": {"hook_bytes": act_truth, "lifetime_bytes": act_said,
                       "precision": round(tp / act_said, 4) if act_said else None,
                       "recall": round(tp / act_truth, 4) if act_truth else None},
        "confusion": dict(sorted(confusion.items(), key=lambda kv: -kv[1])),
        "labels": label_agreement(pairs),
        "learned": learned_labels(pairs),
        "seconds": round(time.perf_counter() - t0, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names_all = [n for n in truth_workloads.WORKLOADS if n not in SKIPPED]
    p.add_argument("--workloads", default=",".join(names_all), help="comma-separated (default: all but DDP)")
    p.add_argument("--steps", type=int, default=3)
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
            print(f"[activation_modes] {name}: allocated wrong {r['allocated']['wrong']:.2%}, peak "
                  f"misattributed {r['peak']['misattributed']:.2%}, equal bytes {r['peak']['bytes_equal']}, "
                  f"activation modules same/parent/block {r['labels']['same_module']}/"
                  f"{r['labels']['same_parent']}/{r['labels']['same_block']}; learned from step 0: same "
                  f"{r['learned']['same_module']} (covered {r['learned']['covered']})",
                  file=sys.stderr, flush=True)
    out = {"schema_version": 1, "benchmark": "activation_modes", "date": time.strftime("%Y-%m-%d"),
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "python": platform.python_version(),
           "torch": torch.__version__, "ridgescope": rs.__version__, "steps": args.steps,
           "skipped": SKIPPED, "workloads": results}
    emit_json(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
