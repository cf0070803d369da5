"""The device-ledger part of the GPU check (docs/gpu.md, "Memory outside PyTorch"): CUPTI's
itemisation of memory outside PyTorch, reconciled with the driver (NVML).

Run by benchmarks/gpu_check.sh after the other parts, within the same budget (about 30 s, at
most 40). It uses gpu_check.py's helpers, so each check prints one line, ``PASS name: detail``,
``FAIL name: detail`` or ``SKIP name: why``; the script ends with
``GPU_CHECK_OUTSIDE_SUMMARY {json}`` (also OUT/gpu_check_outside_summary.json). Exit status: 0
when nothing failed.

The truth is what this script asks the CUDA runtime and driver for itself, through ctypes
(a library outside PyTorch: its frames are libffi's or _ctypes'), and what the driver says:
  setup            the CUPTI source is compiled in and CUPTI accepted ridgescope's subscriber.
  malloc           cudaMalloc(48 MiB) in a phase of its own, then cudaFree: one group, api
                   cudaMalloc, exactly 48 MiB at most, freed; across the phase the driver's
                   figure (NVML, this process) grew by what the ledger's outside bytes grew,
                   within 2 MiB.
  vmm              cuMemCreate + cuMemAddressReserve + cuMemMap + cuMemSetAccess of 64 MiB (the
                   route NCCL and expandable segments use), then unmap and release: one group,
                   api cuMemCreate, exactly 64 MiB, freed; the driver agrees within 2 MiB.
  async            cudaMallocAsync(32 MiB) and cudaFreeAsync on the default stream: a group of
                   api cudaMallocAsync, exactly 32 MiB.
  pytorch          PyTorch's own allocations are not counted twice: no group from libc10_cuda,
                   no external allocation inside a PyTorch segment, and the ledger's reserved
                   bytes equal torch.cuda.memory_reserved() at every boundary (consistency).
  cublas           a matmul's cuBLAS workspace is PyTorch's (tagged `workspace`, in reserved);
                   what cuBLAS allocates itself (if anything) is attributed to libcublas and is
                   no more than the driver shows beyond reserved.
  nccl             a world of one rank with NCCL and a real all-reduce: NCCL's allocations are
                   attributed to libnccl, and are no more than the driver shows beyond reserved
                   across the first all-reduce (NCCL also loads kernel modules and pins host
                   memory there: the driver's growth is larger, never smaller).
  context          the CUDA context (the first reading: driver - reserved - outside) is between
                   100 MiB and 4 GiB; modules loaded while tracking are counted.
  oom              a 75 % share of the free device memory taken by cudaMalloc (ctypes), then a
                   tensor larger than what is left: torch.OutOfMemoryError; verdict non_pytorch,
                   whose summary names the library and the bytes it holds.

``--dry-run`` runs the plumbing on the CPU (no GPU): a tracked CPU run (the host's three layers),
gloo's all-reduce, no device ledger. It proves nothing about the GPU. UNVERIFIED: this script
has not yet run on a GPU.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check as gc_  # noqa: E402  (the PASS/FAIL/SKIP helpers; it sets up sys.path)
from gpu_check import FIGURES, check, section, skip  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import ridgescope as rs  # noqa: E402
from ridgescope import _C  # noqa: E402

MiB = gc_.MiB


# ------------------------------------------------------------------ CUDA through ctypes
class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class Cuda:
    """The runtime and the driver that torch loaded, called directly (outside PyTorch)."""

    def __init__(self) -> None:
        major = (torch.version.cuda or "13").split(".")[0]
        self.rt = ctypes.CDLL(f"libcudart.so.{major}")
        self.drv = ctypes.CDLL("libcuda.so.1")
        for f in ("cudaMalloc", "cudaMallocAsync"):
            getattr(self.rt, f).restype = ctypes.c_int

    def malloc(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        rc = self.rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(nbytes))
        if rc != 0:
            raise RuntimeError(f"cudaMalloc({nbytes}) returned {rc}")
        return p.value

    def free(self, ptr: int) -> None:
        self.rt.cudaFree(ctypes.c_void_p(ptr))

    def malloc_async(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        rc = self.rt.cudaMallocAsync(ctypes.byref(p), ctypes.c_size_t(nbytes), ctypes.c_void_p(0))
        if rc != 0:
            raise RuntimeError(f"cudaMallocAsync({nbytes}) returned {rc}")
        return p.value

    def free_async(self, ptr: int) -> None:
        self.rt.cudaFreeAsync(ctypes.c_void_p(ptr), ctypes.c_void_p(0))
        self.rt.cudaDeviceSynchronize()

    def vmm_alloc(self, nbytes: int, device: int = 0) -> tuple[int, int, int]:
        prop = _Prop()
        prop.type = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location = _Location(1, device)  # CU_MEM_LOCATION_TYPE_DEVICE
        gran = ctypes.c_size_t()
        self._ok(self.drv.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0), "granularity")
        size = -(-nbytes // gran.value) * gran.value
        handle, ptr = ctypes.c_ulonglong(), ctypes.c_ulonglong()
        self._ok(self.drv.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop),
                                      ctypes.c_ulonglong(0)), "cuMemCreate")
        self._ok(self.drv.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                              ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
        self._ok(self.drv.cuMemMap(ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), handle, ctypes.c_ulonglong(0)),
                 "cuMemMap")
        access = _Access(_Location(1, device), 3)  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._ok(self.drv.cuMemSetAccess(ptr, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1)),
                 "cuMemSetAccess")
        return ptr.value, size, handle.value

    def vmm_free(self, ptr: int, size: int, handle: int) -> None:
        self._ok(self.drv.cuMemUnmap(ctypes.c_ulonglong(ptr), ctypes.c_size_t(size)), "cuMemUnmap")
        self._ok(self.drv.cuMemRelease(ctypes.c_ulonglong(handle)), "cuMemRelease")
        self._ok(self.drv.cuMemAddressFree(ctypes.c_ulonglong(ptr), ctypes.c_size_t(size)), "cuMemAddressFree")

    @staticmethod
    def _ok(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} returned CUresult {rc}")


# ------------------------------------------------------------------------------ helpers
SETTLE_S = 0.05  # the sampler thread takes a boundary's reading at once; this leaves it time


def across(report: dict[str, Any], phase: str) -> tuple[int, int, int]:
    """(driver, outside, reserved) growth between the readings taken for a phase's begin and its
    end: the first boundary reading at or after each (the sampler's thread takes them; the
    script waits SETTLE_S after the begin and after the end, so they land there)."""
    spans = [(p["begin_time_ns"], p["end_time_ns"]) for s in report["steps"] for p in s["phases"] if p["phase"] == phase]
    if not spans:
        raise AssertionError(f"no phase {phase}")
    begin, end = spans[0]
    rows = report["device_ledger"]["rows"]
    a = next((r for r in rows if r["time_ns"] >= begin), None)
    b = next((r for r in rows if r["time_ns"] >= end), None)
    if a is None or b is None or a is b:
        raise AssertionError(f"phase {phase}: no driver reading after its begin and after its end")
    return (b["driver_bytes"] - a["driver_bytes"], b["outside_bytes"] - a["outside_bytes"],
            b["reserved_bytes"] - a["reserved_bytes"])


def group(ledger: dict[str, Any], api: str, phase: str) -> dict[str, Any] | None:
    for g in ledger["groups"]:
        if g["api"] == api and g["first_phase"] == phase:
            return g
    return None


def exact_group(name: str, report: dict[str, Any], api: str, phase: str, nbytes: int) -> None:
    ledger = report["device_ledger"]
    g = group(ledger, api, phase)
    if not check(f"{name}.group", g is not None, f"a group of api {api} made in phase {phase}" if g else
                 f"no group of api {api} in phase {phase}: {[(x['library'], x['api'], x['first_phase']) for x in ledger['groups']]}"):
        return
    FIGURES.setdefault("groups", {})[name] = {k: g[k] for k in ("library", "api", "allocations", "max_bytes", "end_bytes")}
    check(f"{name}.exact", g["max_bytes"] == nbytes and g["allocations"] == 1 and g["end_bytes"] == 0,
          f"{g['library']}: {g['allocations']} allocation(s), at most {g['max_bytes']} B (asked {nbytes} B), "
          f"{g['end_bytes']} B at the end")
    check(f"{name}.attributed", g["library"] not in ("", "unknown") and "c10_cuda" not in g["library"],
          f"library {g['library']!r} (the ctypes caller, outside PyTorch)")
    d_driver, d_outside, d_reserved = across(report, phase)
    check(f"{name}.driver_agrees", abs((d_driver - d_reserved) - d_outside) <= 2 * MiB,
          f"across the phase the driver grew {d_driver / MiB:.2f} MiB, reserved {d_reserved / MiB:.2f} MiB, "
          f"the ledger's outside bytes {d_outside / MiB:.2f} MiB")


# ------------------------------------------------------------------------------ sections
def itemised(out: Path) -> None:
    cuda = Cuda()
    torch.zeros(1, device="cuda")  # the context exists, and the runtime made it current here
    path = out / "outside.rstrace"
    with rs.track(out=path, cuda=True, driver_view=True) as session:
        check("setup.cupti_subscribed", session.cupti_status == "", f"cupti_status {session.cupti_status!r}")
        settle = lambda: time.sleep(SETTLE_S)  # noqa: E731  (let the boundary's reading be taken)
        with rs.phase("malloc"):
            settle()
            p = cuda.malloc(48 * MiB)
        settle()
        cuda.free(p)
        with rs.phase("vmm"):
            settle()
            ptr, size, handle = cuda.vmm_alloc(64 * MiB)
        settle()
        cuda.vmm_free(ptr, size, handle)
        with rs.phase("async"):
            settle()
            q = cuda.malloc_async(32 * MiB)
            torch.cuda.synchronize()
        settle()
        cuda.free_async(q)
        with rs.phase("matmul"):
            settle()
            a = torch.randn(2048, 2048, device="cuda")
            (a @ a).sum().item()
        settle()
        del a
    r = rs.load(path).to_dict()
    led = r["device_ledger"]
    if not check("setup.device_ledger", bool(led and led["available"] and led["itemised"]),
                 f"available {led and led['available']}, itemised {led and led['itemised']}, "
                 f"{led and (led['reason'] or led['itemise_reason'])}"):
        return
    FIGURES.update(driver_source=led["driver_source"], context_bytes=led["context_bytes"],
                   modules_loaded=led["modules_loaded"], module_bytes=led["module_bytes"],
                   other_processes=led["other_processes"])
    if led["driver_source"] != "process":
        skip("nvml.process_listed", "NVML does not list this process (a container's PID namespace): device-wide figures")
    else:
        check("nvml.process_listed", True, "NVML's usage of this process, by PID")
    exact_group("malloc", r, "cudaMalloc", "malloc", 48 * MiB)
    exact_group("vmm", r, "cuMemCreate", "vmm", size)
    g = group(led, "cudaMallocAsync", "async")
    check("async.exact", g is not None and g["max_bytes"] == 32 * MiB and g["end_bytes"] == 0,
          f"{g and g['library']}: at most {g and g['max_bytes']} B (asked {32 * MiB} B), "
          f"{g and g['end_bytes']} B at the end (the pool keeps what it reserved: in the unexplained remainder)")
    libs = sorted({x["library"] for x in led["groups"]})
    check("pytorch.not_counted_twice",
          not any("c10_cuda" in x for x in libs) and led["outside_inside_reserved"] == 0 and
          r["consistency"]["mismatches"] == 0,
          f"libraries {libs}; {led['outside_inside_reserved']} allocations inside PyTorch segments; "
          f"{r['consistency']['samples']} allocator readings, {r['consistency']['mismatches']} mismatches")
    cublas = [x for x in led["groups"] if x["library"].startswith("libcublas")]
    d_driver, d_outside, d_reserved = across(r, "matmul")
    workspace = r["totals"]["final_by_category"]["workspace"]
    check("cublas.workspace_is_pytorchs", bool(workspace) and not any(x["first_phase"] == "matmul" and
                                                                      "c10_cuda" in x["library"] for x in led["groups"]),
          f"workspace {workspace} B in reserved; cuBLAS's own allocations: "
          f"{[(x['library'], x['max_bytes']) for x in cublas]}")
    check("cublas.no_more_than_the_driver", d_outside <= max(0, d_driver - d_reserved) + 2 * MiB,
          f"in the matmul phase: driver +{d_driver / MiB:.1f} MiB, reserved +{d_reserved / MiB:.1f} MiB, "
          f"outside +{d_outside / MiB:.1f} MiB")
    ctx = led["context_bytes"]
    check("context.measured", 100 * MiB <= ctx <= 4096 * MiB,
          f"CUDA context at the first reading {ctx / MiB:.0f} MiB; {led['modules_loaded']} modules loaded "
          f"while tracking ({led['module_bytes'] / MiB:.1f} MiB of code)")
    last = led["last"]
    FIGURES["last_unexplained_bytes"] = last["unexplained_bytes"]
    print(f"info ledger at the end: driver {last['driver_bytes'] / MiB:.0f} MiB = reserved "
          f"{last['reserved_bytes'] / MiB:.0f} + outside {last['outside_bytes'] / MiB:.0f} + context "
          f"{last['context_bytes'] / MiB:.0f} + unexplained {last['unexplained_bytes'] / MiB:.1f} MiB", flush=True)
    summary = rs.load(path).summary()
    check("report.text", "Device ledger at the peak" in summary or "Device ledger at the last reading" in summary,
          "the text report has the device ledger")


def nccl(out: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    torch.cuda.set_device(0)
    path = out / "nccl.rstrace"
    with rs.track(out=path, cuda=True, driver_view=True):
        dist.init_process_group("nccl", rank=0, world_size=1)
        try:
            with rs.phase("allreduce"):
                time.sleep(SETTLE_S)
                x = torch.ones(16 * MiB // 4, device="cuda")
                dist.all_reduce(x)  # the communicator and its buffers are made here
                torch.cuda.synchronize()
            time.sleep(SETTLE_S)
        finally:
            dist.destroy_process_group()
    r = rs.load(path).to_dict()
    led = r["device_ledger"]
    groups = [g for g in led["groups"] if g["library"].startswith("libnccl")]
    nccl_bytes = sum(g["max_bytes"] for g in groups)
    d_driver, d_outside, d_reserved = across(r, "allreduce")
    FIGURES["nccl"] = {"groups": [(g["api"], g["allocations"], g["max_bytes"]) for g in groups],
                       "driver_growth": d_driver, "reserved_growth": d_reserved, "outside_growth": d_outside}
    if not check("nccl.attributed", nccl_bytes > 0,
                 f"NCCL groups {FIGURES['nccl']['groups']} ({nccl_bytes / MiB:.1f} MiB)"):
        return
    check("nccl.no_more_than_the_driver", d_outside <= max(0, d_driver - d_reserved) + 2 * MiB,
          f"across the all-reduce: driver +{d_driver / MiB:.1f} MiB, reserved +{d_reserved / MiB:.1f} MiB, "
          f"outside +{d_outside / MiB:.1f} MiB")


def oom(out: Path) -> None:
    cuda = Cuda()
    torch.cuda.empty_cache()
    free, _total = torch.cuda.mem_get_info()
    held = (int(free * 0.75) // (2 * MiB)) * 2 * MiB
    path = out / "oom.rstrace"
    p = None
    raised = False
    try:
        with rs.track(out=path, cuda=True, driver_view=True):
            p = cuda.malloc(held)
            free_now, _ = torch.cuda.mem_get_info()
            torch.empty(free_now + 1024 * MiB, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        raised = True
    finally:
        if p is not None:
            cuda.free(p)
    if not check("oom.raised", raised, "torch.OutOfMemoryError reached the caller" if raised else "no OOM"):
        return
    r = rs.load(path).to_dict()
    v = r["ooms"][-1]["verdict"] if r["ooms"] else {}
    lib = next((g for g in r["device_ledger"]["groups"] if g["max_bytes"] == held), None)
    FIGURES["oom"] = {"held_bytes": held, "summary": v.get("summary")}
    check("oom.verdict_names_the_holder",
          v.get("kind") == "non_pytorch" and lib is not None and lib["library_name"] in v.get("summary", ""),
          f"verdict {v.get('kind')!r}: {v.get('summary')}")


def dry_run(out: Path) -> None:
    """The CPU plumbing: the host's three layers, gloo's all-reduce, no device ledger."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    path = out / "dry.rstrace"
    with rs.track(out=path) as session:
        dist.init_process_group("gloo", rank=0, world_size=1)
        try:
            with rs.phase("allreduce"):
                x = torch.ones(1 << 20)
                dist.all_reduce(x)
        finally:
            dist.destroy_process_group()
    r = rs.load(path).to_dict()
    h = r["host_memory"]
    check("dry.host_memory", bool(h and h["rows"]) and all(
        row["pytorch_bytes"] + row["allocator_slack_bytes"] + row["outside_bytes"] == row["resident_bytes"]
        for row in h["rows"]), f"{h and h['samples']} host readings")
    check("dry.no_device_ledger", r["device_ledger"] is None and session.cupti_status is None,
          "a CPU run: no device ledger, CUPTI not started")
    check("dry.cupti_compiled", _C._cupti_source_compiled(), "the CUPTI source is in the module")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check-out")))
    ap.add_argument("--dry-run", action="store_true", help="CPU plumbing check, no GPU")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cuda = torch.cuda.is_available() and not args.dry_run
    FIGURES.update(torch=torch.__version__, dry_run=args.dry_run, cupti_source_compiled=_C._cupti_source_compiled())
    if not cuda:
        if args.dry_run:
            section("dry_run", lambda: dry_run(args.out))
        else:
            gc_.record("FAIL", "setup", "no CUDA device; use --dry-run for the CPU plumbing check")
    else:
        check("setup.cupti_source_compiled", _C._cupti_source_compiled(), "the CUPTI source is in the module")
        section("itemised", lambda: itemised(args.out))
        if dist.is_available() and dist.is_nccl_available():
            section("nccl", lambda: nccl(args.out))
        else:
            skip("nccl", "torch.distributed with NCCL is not available")
        section("oom", lambda: oom(args.out))
    for p in args.out.glob("*.rstrace"):
        p.unlink()  # only a few files come back from the device
    FIGURES["seconds"] = round(time.perf_counter() - t0, 1)
    return gc_.finish(args.out, "gpu_check_outside")


if __name__ == "__main__":
    sys.exit(main())
