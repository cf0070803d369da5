"""The GPU check of allocation sites (docs/sites.md): sites on CUDA caching-allocator blocks.

Run by benchmarks/gpu_check.sh after benchmarks/gpu_check.py, within the same budget (about
30 s on an H200), with gpu_check.py's helpers (PASS/FAIL/SKIP lines, Workload). Ends with a
``GPU_CHECK_SITES_SUMMARY {json}`` line (also written to OUT/gpu_check_sites_summary.json).
Exit status: 0 when nothing failed.

Checks:
  sites.forward_line      a tensor made at a known line of this file, live at the peak, has that
                          file, line and function as its site (the CUDA trampoline reads the
                          allocating thread's own Python frames, without the GIL)
  sites.backward_nodes    every gradient at the peak was made on autograd's device thread, which
                          has no Python frames: its site is an autograd node and the module that
                          owns the parameter
  sites.python_stacks     with stacks="python" the marker's stack runs through this file's
                          frames, its site the marker's line
  sites.retained          a 1 MiB CUDA tensor appended to a list every step: the retained-tensor
                          verdict, growth 1 MiB a step exactly, naming the line
  sites.overhead          step time with sites (default) against stacks=None and untracked,
                          interleaved; figures, and site capture within 1 % of stacks=None

``--dry-run`` runs the same checks on the CPU with a tiny model (the plumbing only; it proves
nothing about CUDA). Not yet run on a GPU.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check as g  # noqa: E402  (sets sys.path for the staged package and examples)
from gpu_check import FIGURES, RESULTS, Workload, check, record, section  # noqa: E402

import torch  # noqa: E402

import ridgescope as rs  # noqa: E402

MiB = 1024 * 1024


def line_here() -> int:
    return inspect.currentframe().f_back.f_lineno


def run(w: Workload, path: Path, steps: int, stacks, marker_bytes: int, after_backward=None):
    """Tracked steps with a marker tensor made at a known line and kept live to the end."""
    model, opt = w.make()
    with rs.track(model=model, optimizer=opt, out=path, stacks=stacks, cuda=w.device != "cpu"):
        marker = torch.empty(marker_bytes, dtype=torch.uint8, device=w.device); line = line_here()  # noqa: E702
        for i in range(steps):
            x, y = (t.to(w.device) for t in w.inputs[i % len(w.inputs)])
            with torch.autocast(w.device.split(":")[0], dtype=torch.bfloat16):
                loss = g.models.gpt_loss(model, x, y)
            loss.backward()
            if after_backward is not None:
                after_backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    report = rs.Report.from_trace(path, top_blocks=100000).to_dict()
    return model, report, line, marker.data_ptr()


def forward_and_backward(w: Workload, out: Path) -> None:
    held = []
    model, r, line, addr = run(w, out / "sites.rstrace", 2, "site", 64 * MiB,
                               after_backward=lambda: held.append(torch.empty(32 * MiB, dtype=torch.uint8, device=w.device)))
    blocks = {b["address"]: b for b in r["peak"]["top_blocks"]}
    b = blocks.get(addr)
    frame = r["frames"][b["site_frame"]] if b and b["site_frame"] is not None else {}
    check("sites.forward_line", (frame.get("file"), frame.get("line"), frame.get("function")) == (__file__, line, "run"),
          f"marker block {b['site'] if b else 'not live at the peak'}; expected {os.path.basename(__file__)}:{line} in run")
    owners = {f"grad of {n}": n.rsplit(".", 1)[0] for n, _ in model.named_parameters()}
    grads = [x for x in r["peak"]["top_blocks"] if x["label"] in owners]
    bad = [x for x in grads if x["site_frame"] is None
           or r["frames"][x["site_frame"]]["kind"] != "autograd"
           or r["frames"][x["site_frame"]]["module"] != owners[x["label"]]]
    check("sites.backward_nodes", len(grads) == len(owners) and not bad,
          f"{len(grads)} of {len(owners)} gradients at the peak, {len(bad)} without their node and module"
          + (f"; first: {bad[0]['label']} at {bad[0]['site']!r}" if bad else ""))
    FIGURES["sites_examples"] = sorted({x["site"] for x in grads})[:6]


def python_stacks(w: Workload, out: Path) -> None:
    _, r, line, _ = run(w, out / "sites_python.rstrace", 1, "python", 48 * MiB)
    frames = r["frames"]
    hits = [s for s in r["peak"]["stacks"] if s["site"] is not None
            and (frames[s["frames"][s["site"]]]["file"], frames[s["frames"][s["site"]]]["line"]) == (__file__, line)]
    ok = bool(hits) and any(frames[i]["function"] == "python_stacks" for i in hits[0]["frames"])
    check("sites.python_stacks", ok, f"{len(hits)} stack(s) with the marker's site; "
          f"{len(hits[0]['frames']) if hits else 0} frames in the first")


def retained(w: Workload, out: Path) -> None:
    model, opt = w.make()
    path = out / "sites_retained.rstrace"
    kept = []
    with rs.track(model=model, optimizer=opt, out=path, cuda=w.device != "cpu"):
        for i in range(5):
            x, y = (t.to(w.device) for t in w.inputs[i % len(w.inputs)])
            loss = g.models.gpt_loss(model, x, y)
            kept.append(torch.empty(MiB, dtype=torch.uint8, device=w.device)); line = line_here()  # noqa: E702
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    r = rs.load(path).to_dict()["retained"]
    site = f"{os.path.basename(__file__)}:{line} in retained"
    check("sites.retained", r is not None and r["growth_per_step_bytes"] == MiB and r["growth_constant"]
          and r["sites"][r["latest"]]["site"] == site,
          f"verdict: {r['verdict']['summary'] if r else None}")


def overhead(w: Workload, rounds: int, steps: int) -> None:
    """Step time (wall, synchronised) in interleaved rounds: untracked, stacks=None, default."""
    times = {"untracked": [], "none": [], "site": []}
    cuda = w.device != "cpu"
    models = {k: w.make() for k in times}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(rounds):
            order = list(times)[rnd % 3:] + list(times)[:rnd % 3]
            for k in order:
                model, opt = models[k]
                ctx = rs.track(model=model, optimizer=opt, out=Path(tmp) / f"{k}.rstrace",
                               stacks=None if k == "none" else "site", cuda=cuda) if k != "untracked" else None
                if ctx is not None:
                    ctx.start()
                for i in range(steps + 1):
                    if cuda:
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    w.step(model, opt, i)
                    if cuda:
                        torch.cuda.synchronize()
                    if i > 0:  # the first step of a block is a warm-up
                        times[k].append(time.perf_counter() - t0)
                if ctx is not None:
                    ctx.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    FIGURES["sites_overhead_ms"] = {k: round(v * 1e3, 3) for k, v in med.items()}
    ratio = med["site"] / med["none"]
    FIGURES["sites_over_nosites"] = round(ratio, 4)
    FIGURES["sites_over_untracked"] = round(med["site"] / med["untracked"], 4)
    check("sites.overhead", ratio <= 1.01 or not cuda,
          f"median step {med['untracked'] * 1e3:.2f} ms untracked, {med['none'] * 1e3:.2f} ms stacks=None, "
          f"{med['site'] * 1e3:.2f} ms with sites: {ratio:.4f}x stacks=None" + ("" if cuda else " (CPU dry run: not judged)"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check-out")))
    ap.add_argument("--dry-run", action="store_true", help="the same checks on the CPU, tiny model")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        record("FAIL", "sites.setup", "no CUDA device; use --dry-run for the CPU plumbing check")
    else:
        if cuda:
            w = Workload("cuda", vocab=8192, d_model=512, heads=8, layers=2, seq=256, batch=4)
        else:
            w = Workload("cpu", vocab=64, d_model=32, heads=2, layers=1, seq=16, batch=2)
        section("sites", lambda: forward_and_backward(w, args.out))
        section("sites_python", lambda: python_stacks(w, args.out))
        section("sites_retained", lambda: retained(w, args.out))
        section("sites_overhead", lambda: overhead(w, rounds=3 if cuda else 2, steps=5 if cuda else 2))
        for p in args.out.glob("sites*.rstrace"):
            p.unlink()
    FIGURES["sites_seconds"] = round(time.perf_counter() - t0, 1)
    return g.finish(args.out, "gpu_check_sites")


if __name__ == "__main__":
    sys.exit(main())
