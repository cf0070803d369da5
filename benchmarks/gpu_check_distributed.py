"""The distributed part of the GPU check (docs/distributed.md): a world of one rank with NCCL.

Run by benchmarks/gpu_check.sh after gpu_check.py, within the same budget (about 40 s). It
uses gpu_check.py's helpers, so each check prints one line, ``PASS name: detail``,
``FAIL name: detail`` or ``SKIP name: why``; the script ends with
``GPU_CHECK_DISTRIBUTED_SUMMARY {json}`` (also OUT/gpu_check_distributed_summary.json).
Exit status: 0 when nothing failed.

Checks:
  ddp_buckets   DDP (world of 1) on cuda:0 under rs.track: at the end of every backward after
                the first, comm_buffer equals the sum of torch's own block sizes of the
                reducer's buckets (torch.cuda.memory_snapshot(), by address), and the
                distributed section names the NCCL backend.
  nccl_memory   NCCL's own device memory, per rank, as driver-visible bytes minus reserved: this
                process's NVML usage minus torch.cuda.memory_reserved() before the first
                collective and while collectives run (NCCL creates its communicator and
                buffers at the first one); the report's driver_view (NVML sampled every
                100 ms by the session) must see at least that much non-PyTorch memory.

``--dry-run`` runs the same plumbing on the CPU with gloo (no GPU, no NVML: nccl_memory is
skipped). It proves nothing about the GPU. UNVERIFIED: this script has not yet run on a GPU.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check as gc_  # noqa: E402  (the PASS/FAIL/SKIP helpers; it sets up sys.path)
from gpu_check import FIGURES, RESULTS, check, section, skip  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import ridgescope as rs  # noqa: E402

MiB = gc_.MiB


def process_used_bytes() -> int | None:
    """This process's device memory as NVML reports it (None without NVML or a per-process
    figure)."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == os.getpid() and p.usedGpuMemory is not None:
                return int(p.usedGpuMemory)
    except Exception:
        return None
    return None


def non_pytorch_bytes() -> int | None:
    torch.cuda.synchronize()
    used = process_used_bytes()
    return None if used is None else used - torch.cuda.memory_reserved()


def block_sizes(ptrs: list[int]) -> dict[int, int]:
    """torch's own block size at each address (the caching allocator's snapshot)."""
    out = {}
    for seg in torch.cuda.memory_snapshot():
        addr = seg["address"]
        for b in seg["blocks"]:
            if addr in ptrs and b["state"] == "active_allocated":
                out[addr] = b["size"]
            addr += b["size"]
    return out


def ddp_and_nccl(device: torch.device, out: Path) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    cuda = device.type == "cuda"
    if cuda:
        torch.zeros(1, device=device)  # the CUDA context exists before the first reading
    before = non_pytorch_bytes() if cuda else None  # no collective yet: no NCCL communicator
    torch.manual_seed(0)
    width = 1024
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)]).to(device)
    ddp = DDP(model, bucket_cap_mb=4)  # world of 1; the constructor's broadcast is skipped
    opt = torch.optim.AdamW(ddp.parameters())
    during: list[int] = []
    path = out / "ddp_nccl.rstrace"
    with rs.track(model=ddp, optimizer=opt, out=path, driver_view=cuda, cuda=cuda) as session:
        for step in range(4):
            opt.zero_grad(set_to_none=True)
            ddp(torch.randn(64, width, device=device)).sum().backward()
            opt.step()
            big = torch.ones(16 * MiB // 4, device=device)
            dist.all_reduce(big)  # a collective of its own, while NVML is sampled
            if cuda:
                v = non_pytorch_bytes()
                if v is not None:
                    during.append(v)
                time.sleep(0.15)  # at least one NVML sample while the communicator is live
            del big
    report = rs.load(session.path).to_dict()
    buckets = [b.untyped_storage() for _, b, _ in rs._C.ddp_buckets(ddp.reducer)]
    if cuda:
        sizes = block_sizes([s.data_ptr() for s in buckets])
        expected = sum(sizes.get(s.data_ptr(), -1) for s in buckets)
    else:
        expected = sum(s.nbytes() for s in buckets)
    ends = [p["end_by_category"]["comm_buffer"] for s in report["steps"][1:] for p in s["phases"]
            if p["phase"] == "backward"]
    check("ddp_buckets.comm_buffer", bool(ends) and all(e == expected for e in ends),
          f"comm_buffer at the end of backward {ends}, torch's bucket blocks {expected} B")
    d = report.get("distributed", {})
    want = "nccl" if cuda else "gloo"
    check("ddp_buckets.rank_metadata", d.get("backend") == want and d.get("world_size") == 1,
          f"backend {d.get('backend')}, world {d.get('world_size')}, host {d.get('host')}")
    check("ddp_buckets.unknown", report["peak"]["by_category"]["unknown"] < 0.01 * report["peak"]["bytes"],
          f"unknown {report['peak']['by_category']['unknown']} B of a {report['peak']['bytes']} B peak")
    if not cuda:
        skip("nccl_memory", "no GPU (dry run): NCCL device memory needs one")
        return
    if before is None or not during:
        skip("nccl_memory", "NVML gives no per-process usage here")
        return
    nccl = max(during) - before
    FIGURES["nccl_device_bytes"] = nccl
    FIGURES["non_pytorch_before_bytes"] = before
    check("nccl_memory.measured", nccl > 0,
          f"driver-visible minus reserved: {before / MiB:.1f} MiB before the first collective, "
          f"{max(during) / MiB:.1f} MiB while collectives ran: NCCL holds {nccl / MiB:.1f} MiB")
    dv = report["driver_view"]
    check("nccl_memory.report", dv.get("samples", 0) > 0 and dv["max_non_pytorch_bytes"] >= before + nccl // 2,
          f"the report's driver view: {dv.get('samples')} samples, at most "
          f"{dv.get('max_non_pytorch_bytes', 0) / MiB:.1f} MiB beyond reserved (device-wide)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check-out")))
    ap.add_argument("--dry-run", action="store_true", help="CPU (gloo) plumbing check, no GPU")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cuda = torch.cuda.is_available() and not args.dry_run
    FIGURES.update(torch=torch.__version__, dry_run=args.dry_run)
    backend = "nccl" if cuda else "gloo"
    if not dist.is_available() or (cuda and not dist.is_nccl_available()):
        skip("setup", f"torch.distributed with {backend} is not available")
    elif not cuda and not args.dry_run:
        gc_.record("FAIL", "setup", "no CUDA device; use --dry-run for the CPU plumbing check")
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                          WORLD_SIZE="1", LOCAL_RANK="0")
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group(backend, rank=0, world_size=1)
        try:
            section("ddp_nccl", lambda: ddp_and_nccl(device, args.out))
        finally:
            dist.destroy_process_group()
        for p in args.out.glob("ddp_nccl*.rstrace"):
            p.unlink()  # only a few files come back from the device
    FIGURES["seconds"] = round(time.perf_counter() - t0, 1)
    return gc_.finish(args.out, "gpu_check_distributed")


if __name__ == "__main__":
    sys.exit(main())
