"""Where tracking's time goes, piece by piece (docs/performance.md "Where the overhead goes").

bench_training_step.py measures the whole step; this one takes it apart. Everything runs on one
torch thread and is timed with ``time.thread_time()`` (this thread's CPU time), so other
processes on a shared machine disturb it less than wall time would.

  cpu_source      ns per CPU alloc+free pair through the CPU allocator source
                  (``torch.empty(64)`` in a loop, a bare native session vs none)
  module_call     ns per module call: no hooks, torch's slow path with two no-op global hooks,
                  and a tracking session (its Module.__call__ wrapper; a model of 301 trivial
                  modules, under no_grad)
  site_capture    ns per allocation for its site (docs/sites.md): torch.empty(64) in a loop at a
                  Python depth of 25 frames, through a bare native session with stacks "none",
                  "site" and "python" (the difference is the capture's cost), and the same for
                  the allocations of backward (autograd node and module: a chain of 200
                  ``x * w`` ops inside a module, ns per backward node)
  saved_tensor    ns per tensor saved for backward: no hooks, identity Python hooks (torch's
                  machinery alone), ridgescope's pack hook with the identity unpack
                  (``x = x * w`` chains, 2 saved tensors per op; the bare session's CPU source
                  is on in the last, as in a real session)
  model_scan      us per step-end search for the script's other models (Models.discover,
                  docs/categories.md "Parameters of every model"), called from a training
                  loop's frame inside ``rs.track`` on the TinyGPT, with nothing new to find (the
                  steady state) and with a frozen deepcopy held in a variable (found once, then
                  looked up); ``of_step`` is its share of the tracked step measured right after
  phase_reading   µs per phase (its begin and end marker) through a bare native session, with
                  the host-memory reading at its end (docs/forensics.md: /proc/self/status,
                  mallinfo2, mincore over the live CPU blocks not known wholly resident) and
                  without it (set_host_memory(False)), with 0, 100 and 2000 live CPU tensors of
                  1 KiB and with 4 of 64 MiB, made and written before the phases (after the
                  first reading they are known wholly resident: the steady state of a training
                  loop's persistent tensors), and, for "fresh", 100 tensors of 64 KiB made anew
                  in every phase (every reading asks mincore about each)
  step            ms per TinyGPT training step (the bench_training_step.py model, batch 8) in
                  variants run in alternating blocks of steps: untracked; identity
                  saved-tensor hooks (no ridgescope); a bare native session (the CPU source
                  alone: no hooks, no phases, no sites); tracked (default); tracked_nosites
                  (stacks=None); tracked_lifetime (activations=False); tracked_nohost
                  (host_memory=False). ``over_ms`` is the
                  median step minus untracked's.

Prints ONE JSON object (schema_version 1); ``--out FILE`` writes a copy.

    python benchmarks/bench_tracking_pieces.py            # about 2 minutes on 2 cores
    python benchmarks/bench_tracking_pieces.py --blocks 20 --only step
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _emit import emit_json  # noqa: E402
from models import TinyGPT, gpt_batch, gpt_loss  # noqa: E402

import ridgescope as rs  # noqa: E402
from ridgescope import _C  # noqa: E402

SECTIONS = ("cpu_source", "site_capture", "module_call", "saved_tensor", "model_scan", "phase_reading", "step")


def best_of(fn: Callable[[], float], repeats: int = 5) -> float:
    return min(fn() for _ in range(repeats))


@contextlib.contextmanager
def bare_session(tmp: Path, stacks: str = "none") -> Iterator[Any]:
    """The native session alone: the CPU allocator source and the recorder, no Python hooks
    (and by default no allocation sites)."""
    if stacks != "none":
        from ridgescope._session import _configure_sites
        _configure_sites()
    s = _C.Session(str(tmp / "bare.rstrace"), 0, stacks)
    try:
        yield s
    finally:
        s.stop()


def cpu_source(tmp: Path, n: int) -> dict[str, Any]:
    def loop() -> float:
        t0 = time.thread_time()
        for _ in range(n):
            torch.empty(64)
        return (time.thread_time() - t0) / n * 1e9

    untracked, tracked = [], []
    for _ in range(5):
        untracked.append(loop())
        with bare_session(tmp):
            tracked.append(loop())
    u, t = statistics.median(untracked), statistics.median(tracked)
    return {"untracked_ns": round(u, 1), "tracked_ns": round(t, 1),
            "source_ns_per_pair": round(t - u, 1), "iterations": n}


def site_capture(tmp: Path, n: int) -> dict[str, Any]:
    def deep(depth: int, fn: Callable[[], float]) -> float:
        return fn() if depth == 0 else deep(depth - 1, fn)

    def forward_loop() -> float:
        t0 = time.thread_time()
        for _ in range(n):
            torch.empty(64)
        return (time.thread_time() - t0) / n * 1e9

    class Chain(torch.nn.Module):  # a module, so that backward nodes have one
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(200):
                x = x * self.w
            return x

    chain, x0, reps = Chain(), torch.randn(16), 30

    def backward_loop() -> float:
        t = 0.0
        for _ in range(reps):
            y = chain(x0).sum()
            t0 = time.thread_time()
            y.backward()
            t += time.thread_time() - t0
        return t / reps / 200 * 1e9

    modes = ("none", "site", "python")
    fwd: dict[str, list[float]] = {m: [] for m in modes}
    bwd: dict[str, list[float]] = {m: [] for m in modes}
    for rep in range(7):  # interleaved; the fastest of the repetitions, as best_of
        for stacks in modes[rep % 3:] + modes[:rep % 3]:
            with bare_session(tmp, stacks) as s:
                fwd[stacks].append(deep(25, forward_loop))
                # the module hooks' ranges: the bare session has no Python hooks, so enter and
                # exit the module around its forward by hand, as the hooks would
                mod, act = s.intern("chain"), s.intern("activation saved in chain")
                orig = chain.forward

                def forward(x: torch.Tensor) -> torch.Tensor:
                    s.enter_module(act, mod)
                    try:
                        return orig(x)
                    finally:
                        s.exit_module()
                chain.forward = forward
                try:
                    bwd[stacks].append(backward_loop())
                finally:
                    chain.forward = orig
    out: dict[str, Any] = {}
    for stacks in modes:
        out[f"forward_{stacks}_ns"] = round(min(fwd[stacks]), 1)
        out[f"backward_{stacks}_ns"] = round(min(bwd[stacks]), 1)
    out["site_forward_ns_per_alloc"] = round(out["forward_site_ns"] - out["forward_none_ns"], 1)
    out["python_forward_ns_per_alloc"] = round(out["forward_python_ns"] - out["forward_none_ns"], 1)
    out["site_backward_ns_per_node"] = round(out["backward_site_ns"] - out["backward_none_ns"], 1)
    out["python_backward_ns_per_node"] = round(out["backward_python_ns"] - out["backward_none_ns"], 1)
    out["note"] = ("forward: per torch.empty(64) at 25 Python frames below the loop; backward: per "
                   "MulBackward0 node, each allocating its output gradient; the CPU source's own "
                   "cost is in every figure")
    return out


def module_call(tmp: Path) -> dict[str, Any]:
    class Leaf(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    class Mid(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = Leaf(), Leaf()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    class Root(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = torch.nn.ModuleList(Mid() for _ in range(100))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for m in self.m:
                x = m(x)
            return x

    model, x, calls, reps = Root(), torch.zeros(4), 301, 200

    def run() -> float:
        with torch.no_grad():
            t0 = time.thread_time()
            for _ in range(reps):
                model(x)
            return (time.thread_time() - t0) / reps / calls * 1e9

    out = {"none_ns": best_of(run)}
    mm = torch.nn.modules.module
    h1 = mm.register_module_forward_pre_hook(lambda m, a: None)
    h2 = mm.register_module_forward_hook(lambda m, a, o: None, always_call=True)
    try:
        out["noop_global_hooks_ns"] = best_of(run)
    finally:
        h1.remove()
        h2.remove()
    with rs.track(model=model, out=tmp / "modules.rstrace", activations=False):
        out["ridgescope_ns"] = best_of(run)
    out = {k: round(v, 1) for k, v in out.items()}
    # what any global module hook costs every module call (ridgescope registers none: its
    # wrapper around Module.__call__ keeps torch's fast path), and what ridgescope costs one
    out["torch_slow_path_ns"] = round(out["noop_global_hooks_ns"] - out["none_ns"], 1)
    out["ridgescope_over_none_ns"] = round(out["ridgescope_ns"] - out["none_ns"], 1)
    return out


def saved_tensor(tmp: Path) -> dict[str, Any]:
    w = torch.randn(16, requires_grad=True)
    x0 = torch.randn(16)
    ops, reps = 200, 30

    def run() -> float:
        t0 = time.thread_time()
        for _ in range(reps):
            x = x0
            for _ in range(ops):
                x = x * w  # saves x and w
            x.sum().backward()
        return (time.thread_time() - t0) / reps / (2 * ops) * 1e9

    def identity(t: Any) -> Any:
        return t

    out = {"none_ns": best_of(run)}
    with torch.autograd.graph.saved_tensors_hooks(identity, identity):
        out["identity_hooks_ns"] = best_of(run)
    with bare_session(tmp) as s, torch.autograd.graph.saved_tensors_hooks(s.pack_saved, identity):
        out["ridgescope_pack_ns"] = best_of(run)  # the pybind11 pack method and a Python identity
    with bare_session(tmp) as s, torch.autograd.graph.saved_tensors_hooks(*s.saved_tensor_hooks()):
        out["ridgescope_hooks_ns"] = best_of(run)  # what rs.track installs: plain C functions
    with bare_session(tmp):
        out["cpu_source_only_ns"] = best_of(run)
    out = {k: round(v, 1) for k, v in out.items()}
    out["torch_machinery_ns"] = round(out["identity_hooks_ns"] - out["none_ns"], 1)
    out["ridgescope_pack_own_ns"] = round(
        out["ridgescope_pack_ns"] - out["cpu_source_only_ns"] - out["torch_machinery_ns"], 1)
    out["ridgescope_hooks_own_ns"] = round(
        out["ridgescope_hooks_ns"] - out["cpu_source_only_ns"] - out["torch_machinery_ns"], 1)
    out["note"] = "per saved tensor, the op and its share of backward included in every figure"
    return out


def phase_reading(tmp: Path, phases: int = 200) -> dict[str, Any]:
    def run(session: Any, fresh: int) -> float:
        name = session.intern("p")
        t, made = 0.0, []
        for _ in range(phases):
            made = [torch.ones(16384) for _ in range(fresh)]  # untimed: new blocks for this phase
            t0 = time.thread_time()
            session.phase_begin(name)
            session.phase_end(name)
            t += time.thread_time() - t0
        del made
        return t / phases * 1e6

    out: dict[str, Any] = {}
    for label, count, numel, fresh in (("0", 0, 0, 0), ("100x1KiB", 100, 256, 0), ("2000x1KiB", 2000, 256, 0),
                                       ("4x64MiB", 4, 16 << 20, 0), ("fresh_100x64KiB", 0, 0, 100)):
        times: dict[bool, list[float]] = {True: [], False: []}
        for rep in range(6):
            for host in ((True, False) if rep % 2 == 0 else (False, True)):
                with bare_session(tmp) as s:
                    s.set_host_memory(host)
                    keep = [torch.ones(numel) for _ in range(count)]  # live, tracked, written
                    times[host].append(run(s, fresh))
                    del keep
        on, off = min(times[True]), min(times[False])
        out[label] = {"with_host_us": round(on, 1), "without_us": round(off, 1),
                      "host_reading_us": round(on - off, 1)}
    out["note"] = "per phase: two markers and one host reading (at its end)"
    return out


class Trainer:
    def __init__(self, batch: int) -> None:
        torch.manual_seed(0)
        self.model = TinyGPT(vocab=512, d_model=128, n_heads=4, layers=3, seq_len=64)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4)
        self.batches = [gpt_batch(batch, 64, vocab=512, seed=i) for i in range(4)]
        self.n = 0

    def step(self) -> None:
        x, y = self.batches[self.n % len(self.batches)]
        self.n += 1
        self.optimizer.zero_grad(set_to_none=True)
        loss = gpt_loss(self.model, x, y)
        loss.backward()
        self.optimizer.step()


STEP_VARIANTS = ("untracked", "identity_saved", "cpu_source_only", "tracked", "tracked_nosites",
                 "tracked_lifetime", "tracked_nohost")


def model_scan(tmp: Path, calls: int = 5000) -> dict[str, Any]:
    import copy
    torch.manual_seed(0)
    model = TinyGPT(vocab=512, d_model=128, n_heads=4, layers=3, seq_len=64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = gpt_batch(8, 64, 512, seed=0)

    def loop(session: Any, ref: Any) -> tuple[float, float]:  # the training loop's frame
        models, frame = session._instr.models, sys._getframe()
        for _ in range(200):
            models.discover(frame)
        t = time.thread_time()
        for _ in range(calls):
            models.discover(frame)
        scan = (time.thread_time() - t) / calls
        t = time.thread_time()
        for _ in range(10):
            loss = gpt_loss(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return scan, (time.thread_time() - t) / 10

    out: dict[str, Any] = {}
    for name, make_ref in (("nothing_new", lambda: None),
                           ("frozen_copy_held", lambda: copy.deepcopy(model).requires_grad_(False))):
        with rs.track(model=model, optimizer=opt, out=tmp / "scan.rstrace") as session:
            ref = make_ref()
            scan, step_s = loop(session, ref)
            models = len(session._instr.models.entries)
        out[name] = {"us": round(scan * 1e6, 2), "of_step": round(scan / step_s, 5),
                     "step_ms": round(step_s * 1e3, 2), "models": models}
    return out


def step(tmp: Path, blocks: int, block: int, batch: int) -> dict[str, Any]:
    def identity(t: Any) -> Any:
        return t

    def context(v: str, t: Trainer) -> Any:
        if v == "untracked":
            return contextlib.nullcontext()
        if v == "identity_saved":
            return torch.autograd.graph.saved_tensors_hooks(identity, identity)
        if v == "cpu_source_only":
            return bare_session(tmp)
        return rs.track(model=t.model, optimizer=t.optimizer, out=tmp / f"{v}.rstrace",
                        activations=v != "tracked_lifetime", stacks=None if v == "tracked_nosites" else "site",
                        host_memory=v != "tracked_nohost")

    trainers = {v: Trainer(batch) for v in STEP_VARIANTS}
    times: dict[str, list[float]] = {v: [] for v in STEP_VARIANTS}
    for v in STEP_VARIANTS:  # warm-up: optimizer state exists before anything is timed
        with context(v, trainers[v]):
            for _ in range(3):
                trainers[v].step()
    for b in range(blocks):
        order = STEP_VARIANTS if b % 2 == 0 else STEP_VARIANTS[::-1]
        for v in order:
            t = trainers[v]
            with context(v, t):
                t.step()  # untimed: the first step after a switch
                for _ in range(block):
                    t0 = time.thread_time()
                    t.step()
                    times[v].append(time.thread_time() - t0)
    base = statistics.median(times["untracked"])
    return {v: {"median_ms": round(statistics.median(times[v]) * 1e3, 3),
                "over_ms": round((statistics.median(times[v]) - base) * 1e3, 3),
                "ratio": round(statistics.median(times[v]) / base, 4),
                "steps": len(times[v])} for v in STEP_VARIANTS} | {
        "config": {"model": "TinyGPT", "batch": batch, "layers": 3, "d_model": 128,
                   "blocks": blocks, "steps_per_block": block}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    ap.add_argument("--blocks", type=int, default=30, help="step: alternating blocks per variant")
    ap.add_argument("--block", type=int, default=5, help="step: timed steps per block")
    ap.add_argument("--batch", type=int, default=8, help="step: batch size")
    ap.add_argument("--alloc-iterations", type=int, default=200_000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    if any(s not in SECTIONS for s in only):
        ap.error(f"--only: choose from {', '.join(SECTIONS)}")
    torch.set_num_threads(1)
    out: dict[str, Any] = {
        "schema_version": 1, "benchmark": "tracking_pieces", "date": time.strftime("%Y-%m-%d"),
        "torch_version": torch.__version__, "ridgescope_version": rs.__version__,
        "python_version": platform.python_version(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "clock": "time.thread_time"}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rs-pieces-") as d:
        tmp = Path(d)
        if "cpu_source" in only:
            out["cpu_source"] = cpu_source(tmp, args.alloc_iterations)
        if "site_capture" in only:
            out["site_capture"] = site_capture(tmp, args.alloc_iterations // 2)
        if "module_call" in only:
            out["module_call"] = module_call(tmp)
        if "saved_tensor" in only:
            out["saved_tensor"] = saved_tensor(tmp)
        if "model_scan" in only:
            out["model_scan"] = model_scan(tmp)
        if "phase_reading" in only:
            out["phase_reading"] = phase_reading(tmp)
        if "step" in only:
            out["step"] = step(tmp, args.blocks, args.block, args.batch)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    emit_json(out, args.out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
