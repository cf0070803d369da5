"""Ground truth for the categories ridgescope infers from a torch memory snapshot.

Method (issue 23). A CPU run is tracked live, where every category is exact (tags, hooks,
lifetimes), with stacks="python" (benchmarks/truth_workloads.py). Its export
(``report.to_snapshot``) is turned into the file torch itself would have written for that run
on a GPU, with everything ridgescope adds removed:

* no ``category`` keys, no ``user_metadata``, no top-level ``ridgescope`` section, no
  ``block_size`` and no ``trace_index``; ridgescope's pseudo frames (``ridgescope``,
  ``<ridgescope>``) and the frames of ridgescope's own Python wrappers are dropped, and Python
  frames are named by their code object's name as torch names them (``forward``, not
  ``Block.forward``);
* of the annotations only those torch.optim records: ``Optimizer.step#<Class>.step`` and
  ``Optimizer.zero_grad#<Class>.zero_grad`` (no forward/backward phases, no steps);
* blocks that existed before tracking began (the model built before it) get no ``alloc`` entry:
  they are in ``segments`` when still live at the end, and their frees are frees without an
  alloc, as in a snapshot recorded after the model was built;
* addresses, block sizes and segments are those of PyTorch's CUDA caching allocator for the same
  requests (ridgescope's model of it, python/ridgescope/_allocator_model.py): ``segment_alloc``
  entries, and ``segments`` with their active and inactive blocks at the end;
* a free carries the stack torch records for it under the default
  ``_record_memory_history(context="all")``: the Python calls (and in backward the autograd
  node) torch.profiler saw around that free in the same run (benchmarks/truth_workloads.py; a
  Python frame's line there is its function's first line); where the profiler's frees cannot be
  matched to the trace's, the allocation's frames (torch's ``context="alloc"``). The share of
  frees with their own stack is reported (``free_stacks``).

Two forms of the frames. On a GPU, autograd runs the backward on its own device thread, which has
no Python stack (torch/csrc/profiler/python/combined_traceback.cpp gathers frames from
``PyEval_GetFrame()`` of the allocating thread). An allocation is on that thread when its live
stack holds autograd's ``_engine_run_backward``: the frames from there outward (the user's
``loss.backward()`` line and its callers) belong to the main thread and are dropped; Python code
the engine itself runs (a checkpoint's recomputation, a hook) keeps its frames.

* ``all`` (``_record_memory_history(stacks="all")``): the C++ frames are kept: the allocator's
  own frames on every allocation, and on autograd's thread the node being evaluated as torch's
  C++ frame (``torch::autograd::generated::MmBackward0::apply(...)``) and the engine's frames.
* ``python`` (``stacks="python"``, torch's default): Python frames only; an allocation on
  autograd's thread outside Python code has **no frames at all**.

The stripped file is read back (``rs.load``), its report exported again to learn the category
the inference gave every block, and compared block by block with the live categories:

* ``peak.misattributed``: half the L1 distance between the exact composition of the peak (the
  live report's peak) and the inferred composition of the same blocks, as a fraction of the peak;
  ``peak.wrong``: the fraction of the peak's bytes in blocks whose inferred category differs
  (>= misattributed: no cancelling);
* ``allocated.misattributed`` / ``.wrong``: the same over every allocation of the run, each
  counted once with its bytes;
* ``categories``: per category, precision and recall by bytes over every block of the run (the
  allocations and the blocks older than the trace);
* ``weak_share``: the share of the peak that rules on size or lifetime alone decided (the
  report's ``snapshot.confidence``).

Usage: ``.venv/bin/python benchmarks/inference_truth.py [--workloads a,b] [--steps 3]
[--keep DIR] [--reader DIR]``; prints one JSON object (progress on stderr). ``--reader``: the
stripped files are read by the ridgescope package in DIR (another commit's build), so an older
inference is measured against the same truth. The fast subset of
tests/python/test_inference_truth.py runs the same functions."""
from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import torch

import ridgescope as rs
from ridgescope._allocator_model import AllocatorModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from truth_workloads import WORKLOADS  # noqa: E402

FORMS = ("all", "python")
GOAL = {"peak": 0.03, "allocated": 0.05}
RIDGESCOPE_DIR = os.path.dirname(rs.__file__)
TORCH_TIME_BASE_US = 1_700_000_000_000_000  # torch writes microseconds since the epoch

# The frames torch's C++ unwinder records above every CUDA allocation (stacks="all").
ALLOCATOR_FRAMES = [
    ("torch::unwind::unwind()", "??"),
    ("torch::CapturedTraceback::gather(bool, bool, bool)", "??"),
    ("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp"),
    ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, "
     "CUstream_st*)", "CUDACachingAllocator.cpp"),
    ("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long, "
     "CUstream_st*)", ""),
    ("at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, "
     "std::optional<c10::MemoryFormat>)", "??"),
]
# The frames torch's C++ unwinder records above every free (stacks="all").
FREE_FRAMES = [
    ("torch::unwind::unwind()", "??"),
    ("torch::CapturedTraceback::gather(bool, bool, bool)", "??"),
    ("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp"),
    ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free(c10::cuda::CUDACachingAllocator::Native::"
     "(anonymous namespace)::Block*)", "CUDACachingAllocator.cpp"),
    ("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::free(void*)", ""),
    ("c10::StorageImpl::~StorageImpl()", "??"),
]
# The engine's frames below a node on autograd's device thread (stacks="all").
ENGINE_FRAMES = [
    ("torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)", ""),
    ("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, "
     "torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)",
     "??"),
    ("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", "??"),
    ("torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)", "??"),
    ("torch::autograd::python::PythonEngine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> "
     "const&, bool)", ""),
    ("__clone", "??"),
]
# Nodes outside torch::autograd::generated (ridgescope names a node by its C++ type without the
# namespace).
PLAIN_NODES = {"AccumulateGrad", "CopyBackwards", "CopySlices", "PyNode", "GraphRoot", "Error", "DelayedError",
               "NotImplemented", "UndefinedGradBackward", "Identity", "SendRpcBackward"}
PHASE_ANNOTATIONS = {"optimizer_step": "Optimizer.step#{0}.step", "zero_grad": "Optimizer.zero_grad#{0}.zero_grad"}


class PlainData(pickle.Unpickler):
    """Reads our own exports: builtin types only."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused: {module}.{name}")


def read_pickle(path: Path) -> dict:
    with open(path, "rb") as f:
        return PlainData(f).load()


# ------------------------------------------------------------------------------ frames
def frame(name: str, filename: str, line: int = 0) -> dict:
    return {"name": name, "filename": filename, "line": line}


def node_frame(node: str) -> dict:
    """An autograd node as torch's C++ unwinder names its apply."""
    cls = node.split(" of ", 1)[0]
    qualified = f"torch::autograd::{cls}" if cls in PLAIN_NODES or "::" in cls else f"torch::autograd::generated::{cls}"
    return frame(f"{qualified}::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)", "??")


def is_engine_entry(f: dict) -> bool:
    return f["name"].endswith("_engine_run_backward") and f["filename"].endswith(os.path.join("autograd", "graph.py"))


def torch_frames(frames: list[dict], form: str, prefix: list[tuple[str, str]] = ALLOCATOR_FRAMES
                 ) -> tuple[list[dict], bool]:
    """The frames torch records for an allocation (or, with the ``FREE_FRAMES`` prefix, a
    free) the live run recorded with ``frames`` (innermost first), in ``form``; and whether it
    happened on autograd's device thread."""
    engine = max((i for i, f in enumerate(frames) if is_engine_entry(f)), default=None)
    on_engine_thread = engine is not None
    kept = frames[:engine] if on_engine_thread else frames
    python, nodes = [], []
    for f in kept:
        if f["filename"] in ("ridgescope", "<ridgescope>"):
            continue
        if f["filename"] == "<autograd>":
            nodes.append(f["name"])
            continue
        if f["filename"].startswith(RIDGESCOPE_DIR):
            continue  # ridgescope's own wrappers: not there in an untracked run
        python.append(frame(f["name"].rsplit(".", 1)[-1] if not f["name"].startswith("<") else f["name"],
                            f["filename"], f["line"]))
    if form == "python":
        return python, on_engine_thread
    out = [frame(n, fn) for n, fn in prefix] + python
    if on_engine_thread:
        out += [node_frame(n) for n in nodes[:1]] + [frame(n, fn) for n, fn in ENGINE_FRAMES]
    return out, on_engine_thread


# ------------------------------------------------------------------------------ strip
class Block:
    __slots__ = ("key", "requested", "bytes", "category", "adopted", "frames", "addr", "alloc_index", "label",
                 "live_label", "rule")

    def __init__(self, key: int, requested: int, nbytes: int, category: str, adopted: bool, frames: list) -> None:
        self.key, self.requested, self.bytes, self.category = key, requested, nbytes, category
        self.adopted, self.frames = adopted, frames
        self.addr = 0
        self.alloc_index = -1
        self.label = self.live_label = ""  # the inference's label (with its rule); the live one
        self.rule = ""  # the rule that decided it (the label's last [id])


def live_label(e: dict) -> str:
    md = e.get("user_metadata", {})
    return f"{md.get('phase')} step {md.get('step')}: {md.get('label')} @ {md.get('site', '')}"


def is_adopted(e: dict) -> bool:
    return any(f["filename"] == "<ridgescope>" and "before tracking" in f["name"] for f in e["frames"])


def strip(export: dict, form: str, optimizer_class: str | None, frees: list | None = None
          ) -> tuple[dict, list[Block], dict]:
    """The snapshot torch would have written for the run of ``export`` (a ridgescope export of a
    CPU run), in ``form``; every block with its exact category; and the truth at the peak
    (``blocks``: the keys live there, ``bytes``; ``free_stacks``: the share of frees that got
    their own stack from ``frees``, the profiler's ``[ptr, bytes, frames]``)."""
    trace = export["device_traces"][0]
    free_queue: dict[int, deque] = defaultdict(deque)
    for ptr, nbytes, frames in frees or []:
        free_queue[ptr].append((nbytes, frames))
    own_stacks = freed = 0
    model = AllocatorModel()
    blocks: list[Block] = []
    live: dict[int, Block] = {}  # export address -> block
    # Blocks older than tracking existed before torch's recording began: made first.
    for e in trace:
        if e["action"] == "alloc" and is_adopted(e):
            b = Block(len(blocks), e["size"], e["block_size"], e["category"], True, [])
            blocks.append(b)
            b.addr = model.malloc(b.key, b.requested)["address"]
            b.live_label = live_label(e)
    adopted = iter(b for b in blocks)
    model.record_segment_events(True)
    entries: list[dict] = []
    seen_events = 0
    live_bytes, peak, peak_blocks = 0, -1, set()
    current: set[int] = set()

    def emit(action: str, addr: int, size: int, t: int, frames: list) -> None:
        entries.append({"action": action, "addr": addr, "size": size, "stream": 0,
                        "time_us": TORCH_TIME_BASE_US + t, "frames": frames})

    for e in trace:
        t = e["time_us"]
        if e["action"] == "alloc":
            if is_adopted(e):
                b = next(adopted)
            else:
                frames, _ = torch_frames(e["frames"], form)
                b = Block(len(blocks), e["size"], e["block_size"], e["category"], False, frames)
                blocks.append(b)
                b.addr = model.malloc(b.key, b.requested)["address"]
                b.live_label = live_label(e)
                events = model.segment_events()
                for s in events[seen_events:]:
                    emit(s["action"], s["address"], s["bytes"], t, frames)
                seen_events = len(events)
                b.alloc_index = len(entries)
                emit("alloc", b.addr, b.requested, t, frames)
            live[e["addr"]] = b
            current.add(b.key)
            live_bytes += b.bytes
            if live_bytes > peak:
                peak, peak_blocks = live_bytes, set(current)
        elif e["action"] == "free_completed" and e["addr"] in live:
            b = live.pop(e["addr"])
            frames = b.frames  # the allocation's context, unless the free's own stack is known
            q = free_queue[e["addr"]]
            while q and q[0][0] != b.bytes:
                q.popleft()  # a free the live trace did not see (ridgescope's own, outside tracking)
            if q:
                frames = torch_frames(q.popleft()[1], form, FREE_FRAMES)[0]
                own_stacks += 1
            freed += 1
            emit("free_requested", b.addr, b.requested, t, frames)
            emit("free_completed", b.addr, b.requested, t, frames)
            model.free(b.key)
            current.discard(b.key)
            live_bytes -= b.bytes
        elif e["action"] == "annotate" and e["addr"] in live and e.get("category"):
            live[e["addr"]].category = e["category"]  # a later strong tag (rare): the latest stands
    segments = []
    for s in model.segments():
        seg = dict(s, device=0, active_size=s["allocated_size"], segment_pool_id=(0, 0), frames=[])
        seg["blocks"] = []
        for blk in s["blocks"]:
            seg["blocks"].append(dict(blk, frames=[]))
        segments.append(seg)
    by_addr = {b.addr: b for b in live.values()}
    for seg in segments:
        for blk in seg["blocks"]:
            if blk["state"] == "active_allocated" and blk["address"] in by_addr:
                blk["frames"] = by_addr[blk["address"]].frames
    annotations = []
    for a in export.get("external_annotations", []):
        fmt = PHASE_ANNOTATIONS.get(a["name"])
        if fmt and optimizer_class:
            annotations.append({"name": fmt.format(optimizer_class), "stage": a["stage"], "device": 0,
                                "time_us": TORCH_TIME_BASE_US + a["time_us"]})
    entries.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0,
                    "time_us": entries[-1]["time_us"] if entries else TORCH_TIME_BASE_US, "frames": []})
    snap = {"segments": segments, "device_traces": [entries],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1,
                                   "garbage_collection_threshold": 0.0, "expandable_segments": False,
                                   "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}},
            "external_annotations": annotations}
    return snap, blocks, {"blocks": peak_blocks, "bytes": peak,
                          "free_stacks": round(own_stacks / freed, 4) if freed else None}


# ------------------------------------------------------------------------------ compare
READER = None  # another ridgescope package to read the stripped files with (--reader)

READ_BACK = ("import json, sys; import ridgescope as rs; r = rs.load(sys.argv[1]); r.to_snapshot(sys.argv[2]); "
             "print(json.dumps(r.to_dict()))")


def inferred_categories(snapshot_path: Path, blocks: list[Block], tmp: Path) -> tuple[dict[int, str], dict]:
    """The category the inference gave each block (by its key), and the read-back report. With
    ``READER`` (a folder holding another build's ``ridgescope`` package) that build reads the
    file, in a process of its own: the same truth against another commit's inference."""
    again = tmp / (snapshot_path.stem + ".again.pickle")
    if READER is None:
        report_dict = (report := rs.load(snapshot_path)).to_dict()
        report.to_snapshot(again)
    else:
        env = dict(os.environ, PYTHONPATH=str(READER))
        out = subprocess.run([sys.executable, "-c", READ_BACK, str(snapshot_path), str(again)], env=env,
                             capture_output=True, text=True, check=True).stdout
        report_dict = json.loads(out)
    seen: dict[int, int] = defaultdict(int)
    labels: dict[tuple[int, int], str] = {}
    found: dict[tuple[int, int], str] = {}
    for e in read_pickle(again)["device_traces"][0]:
        if e["action"] == "alloc":
            found[(e["addr"], seen[e["addr"]])] = e["category"]
            md = e.get("user_metadata", {})
            labels[(e["addr"], seen[e["addr"]])] = f"{md.get('phase')} step {md.get('step')}: {md.get('label', '')}"
            seen[e["addr"]] += 1
    occurrence: dict[int, int] = defaultdict(int)
    out = {}
    for b in blocks:  # adopted blocks first (the replay's start state), then in trace order
        key = (b.addr, occurrence[b.addr])
        occurrence[b.addr] += 1
        out[b.key] = found.get(key, "unknown")
        b.label = labels.get(key, "")
        m = re.search(r"\[(\w+)\]$", b.label)
        b.rule = m.group(1) if m else "unknown"
    return out, report_dict


def fractions(pairs: list[tuple[int, str, str]]) -> dict[str, float]:
    """Half the L1 distance of the two compositions and the wrongly decided share, for
    (bytes, truth, inferred) triples."""
    total = sum(n for n, _, _ in pairs)
    if total == 0:
        return {"bytes": 0, "misattributed": 0.0, "wrong": 0.0}
    t, i = defaultdict(int), defaultdict(int)
    wrong = 0
    for n, a, b in pairs:
        t[a] += n
        i[b] += n
        wrong += n if a != b else 0
    l1 = sum(abs(t[c] - i[c]) for c in set(t) | set(i))
    return {"bytes": total, "misattributed": round(l1 / 2 / total, 5), "wrong": round(wrong / total, 5)}


def by_evidence(blocks: list[Block], inferred: dict[int, str], evidence_of: dict[str, str]) -> dict[str, dict]:
    """Per kind of evidence (the report's reasons say which rule has which): the bytes its rules
    decided over every scored block of the run, and the share of them in the wrong category."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for b in blocks:
        if b.category == "unknown":
            continue
        e = out[evidence_of.get(b.rule, "none")]
        e[0] += b.bytes
        e[1] += b.bytes if inferred[b.key] != b.category else 0
    return {k: {"bytes": n, "wrong": round(w / n, 5) if n else 0.0} for k, (n, w) in sorted(out.items())}


def compare(blocks: list[Block], inferred: dict[int, str], peak: dict) -> dict[str, Any]:
    """The figures of one form. Blocks the live run itself left ``unknown`` have no truth to
    score against: they are left out and their bytes reported as ``truth_unknown``."""
    scored = [b for b in blocks if b.category != "unknown"]
    at_peak = [(b.bytes, b.category, inferred[b.key]) for b in scored if b.key in peak["blocks"]]
    allocated = [(b.bytes, b.category, inferred[b.key]) for b in scored if not b.adopted]
    every = [(b.bytes, b.category, inferred[b.key]) for b in scored]
    unknown = {"peak": sum(b.bytes for b in blocks if b.category == "unknown" and b.key in peak["blocks"]),
               "allocated": sum(b.bytes for b in blocks if b.category == "unknown" and not b.adopted)}
    cats: dict[str, dict[str, float]] = {}
    names = sorted({a for _, a, _ in every} | {b for _, _, b in every})
    for c in names:
        tp = sum(n for n, a, b in every if a == c and b == c)
        truth = sum(n for n, a, _ in every if a == c)
        said = sum(n for n, _, b in every if b == c)
        cats[c] = {"truth_bytes": truth, "inferred_bytes": said,
                   "precision": round(tp / said, 4) if said else None, "recall": round(tp / truth, 4) if truth else None}
    confusion: dict[str, int] = defaultdict(int)
    for n, a, b in at_peak:
        if a != b:
            confusion[f"{a} -> {b}"] += n
    return {"peak": fractions(at_peak), "allocated": fractions(allocated), "truth_unknown": unknown,
            "categories": cats,
            "peak_confusion": dict(sorted(confusion.items(), key=lambda kv: -kv[1]))}


def optimizer_class_of(export: dict) -> str | None:
    """The optimizer's class, from the run's metadata (torch names its annotations by it)."""
    run = json.loads(export.get("ridgescope", {}).get("metadata", {}).get("run", "{}"))
    opt = run.get("optimizer") or {}
    return opt.get("type")


def measure(name: str, work: Path, steps: int, forms: tuple[str, ...] = FORMS,
            debug: dict | None = None) -> dict[str, Any]:
    """One workload: run it live, strip its export in each form, read back and compare."""
    t0 = time.perf_counter()
    trace = WORKLOADS[name](work, steps)
    result = measure_trace(name, trace, work, forms, debug)
    result["steps"] = steps
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


def measure_trace(name: str, trace: Path, work: Path, forms: tuple[str, ...] = FORMS,
                  debug: dict | None = None) -> dict[str, Any]:
    """The comparison for a live trace a workload wrote (and its free stacks next to it)."""
    live = rs.load(trace)
    export_path = work / f"{name}.export.pickle"
    live.to_snapshot(export_path)
    export = read_pickle(export_path)
    opt_class = optimizer_class_of(export)
    result: dict[str, Any] = {"workload": name, "optimizer": opt_class, "forms": {}}
    live_peak = live.to_dict()["peak"]
    frees_path = Path(f"{trace}.frees.json")
    frees = json.loads(frees_path.read_text()) if frees_path.exists() else None
    for form in forms:
        snap, blocks, peak = strip(export, form, opt_class, frees)
        exact = defaultdict(int)
        for b in blocks:
            if b.key in peak["blocks"]:
                exact[b.category] += b.bytes
        if peak["bytes"] != live_peak["bytes"] or {c: n for c, n in exact.items() if n} != \
                {c: n for c, n in live_peak["by_category"].items() if n}:
            raise AssertionError(f"{name}: the replayed peak ({peak['bytes']} B, {dict(exact)}) is not the live "
                                 f"report's ({live_peak['live_bytes']} B, {live_peak['by_category']})")
        path = work / f"{name}.{form}.pickle"
        with open(path, "wb") as f:
            pickle.dump(snap, f, protocol=4)
        inferred, report = inferred_categories(path, blocks, work)
        m = compare(blocks, inferred, peak)
        m["free_stacks"] = peak["free_stacks"]
        evidence_of = {r["rule"]: r.get("evidence", "none") for r in report.get("snapshot", {}).get("reasons", [])}
        m["by_evidence"] = by_evidence(blocks, inferred, evidence_of)
        conf = report.get("snapshot", {}).get("confidence")
        if conf is not None:
            m["weak_share"] = conf.get("weak_share_of_peak")
        result["forms"][form] = m
        if debug:
            debug[form] = (blocks, inferred, peak)
    return result


def meets_goal(result: dict[str, Any]) -> bool:
    return all(m["peak"]["misattributed"] <= GOAL["peak"] and m["allocated"]["misattributed"] <= GOAL["allocated"]
               for m in result["forms"].values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated (default: all)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--keep", type=Path, help="keep the traces and stripped snapshots in this folder")
    p.add_argument("--reader", type=Path,
                   help="read the stripped snapshots with the ridgescope package in this folder (another commit's "
                        "build, e.g. to measure the inference before a change against the same truth)")
    args = p.parse_args(argv)
    global READER
    READER = args.reader
    names = [n for n in args.workloads.split(",") if n]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        p.error(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}")
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    results = []
    with tempfile.TemporaryDirectory(prefix="inference-truth-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in names:
            print(f"[inference_truth] {name} ...", file=sys.stderr, flush=True)
            r = measure(name, work, args.steps)
            r["meets_goal"] = meets_goal(r)
            results.append(r)
            print(f"[inference_truth] {name}: " + ", ".join(
                f"{f} peak {m['peak']['misattributed']:.1%} (wrong {m['peak']['wrong']:.1%}) allocated "
                f"{m['allocated']['misattributed']:.1%}" for f, m in r["forms"].items()), file=sys.stderr, flush=True)
    out = {"benchmark": "inference_truth", "date": time.strftime("%Y-%m-%d"),
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "python": platform.python_version(),
           "torch": torch.__version__, "ridgescope": rs.__version__, "reader": str(READER) if READER else None,
           "goal": GOAL, "workloads": results,
           "all_meet_goal": all(r["meets_goal"] for r in results)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
