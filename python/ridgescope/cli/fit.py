"""``ridgescope fit SPEC --capacity 80GiB``: will this training step fit? A dry run under fake
tensors (rs.estimate), with no GPU and no real memory. docs/fit.md."""
from __future__ import annotations

import argparse
import json
import runpy
from pathlib import Path
from typing import Any

from ._output import emit

HELP = ("Predict a training step's peak memory without a GPU: a dry run under fake tensors. "
        "SPEC is a built-in spec (llama-7b, gpt2-small, tiny-gpt, ... ; --list) or a Python file "
        "defining make_model(), make_optimizer(model) and make_batch(batch_size=, seq_len=).")


def _workspace(value: "str | None") -> "int | None":
    if value is None:
        return None
    from .._errors import RidgescopeError
    from .._format import parse_bytes
    try:
        return parse_bytes(value)
    except ValueError as exc:
        raise RidgescopeError(f"--cublas-workspace: {exc}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", nargs="?", help="a built-in spec name or a Python spec file")
    parser.add_argument("--list", action="store_true", help="list the built-in specs and exit")
    parser.add_argument("--capacity", default="80GiB", metavar="SIZE",
                        help="device memory to fit in (default 80GiB)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="the device the step would run on (default cuda)")
    parser.add_argument("--batch-size", type=int, default=None, metavar="N",
                        help="micro-batch size passed to make_batch (default: the spec's)")
    parser.add_argument("--seq-len", type=int, default=None, metavar="N",
                        help="sequence length passed to make_batch (default: the spec's)")
    parser.add_argument("--dtype-policy", default=None,
                        choices=("fp32", "bf16", "fp16", "bf16-autocast", "fp16-autocast"),
                        help="override the spec's dtype policy")
    parser.add_argument("--alloc-conf", default="", metavar="CONF",
                        help="PYTORCH_CUDA_ALLOC_CONF settings for the allocator model, e.g. "
                             "expandable_segments:True")
    parser.add_argument("--cublas-workspace", default=None, metavar="SIZE",
                        help="bytes of each cuBLAS workspace (one per thread: forward's and "
                             "autograd's). Default: CUBLAS_WORKSPACE_CONFIG if set, else 32MiB, "
                             "torch's default on Hopper (H100, H200); torch's default on other "
                             "GPUs is 8519680")
    parser.add_argument("--steps", type=int, default=2,
                        help="training steps to run (default 2: the first creates the "
                             "optimizer state)")
    parser.add_argument("--sweep-batch", default=None, metavar="N,N,...",
                        help="also sweep these batch sizes and fit the activation scaling")
    parser.add_argument("--sweep-seq", default=None, metavar="N,N,...",
                        help="also sweep these sequence lengths")
    parser.add_argument("--no-remedies", action="store_true",
                        help="when it does not fit, skip the search for remedies")
    parser.add_argument("--trace", type=Path, default=None,
                        help="keep the dry run's trace here (readable by ridgescope report)")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="plain-language text (default) or the estimate as JSON")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="write to this file instead of standard output")


def load_spec(name_or_path: str) -> Any:
    """A built-in spec by name, or one read from a Python file (run with __name__ set to
    "ridgescope_fit", so a training script's ``if __name__ == "__main__":`` part does not run)."""
    from .._errors import RidgescopeError
    from .._zoo import SPECS, Spec

    if name_or_path in SPECS:
        return SPECS[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise RidgescopeError(f"{name_or_path!r} is neither a built-in spec "
                              f"({', '.join(SPECS)}) nor a file")
    try:
        ns = runpy.run_path(str(path), run_name="ridgescope_fit")
    except SystemExit:
        raise RidgescopeError(f"{path} called sys.exit() while being loaded") from None
    except Exception as exc:
        raise RidgescopeError(f"could not load {path}: {type(exc).__name__}: {exc}") from None
    missing = [n for n in ("make_model", "make_optimizer", "make_batch") if not callable(ns.get(n))]
    if missing:
        raise RidgescopeError(f"{path} does not define {', '.join(missing)} (a spec file "
                              "defines make_model(), make_optimizer(model) and make_batch(); "
                              "see docs/fit.md)")
    return Spec(path.stem, f"spec file {path}", ns["make_model"], ns["make_optimizer"],
                ns["make_batch"], ns.get("DTYPE_POLICY"), ns.get("BATCH_SIZE"),
                ns.get("SEQ_LEN"), ns.get("loss_fn"))


def _ints(text: str | None) -> list[int] | None:
    from .._errors import RidgescopeError
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise RidgescopeError(f"not a comma-separated list of integers: {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from .._errors import RidgescopeError
    from .._estimate import estimate
    from .._estimate._dry_run import _accepts
    from .._zoo import SPECS

    if args.list:
        emit("".join(f"{n:<12} {s.description}\n" for n, s in SPECS.items()), args.output)
        return 0
    if not args.spec:
        raise RidgescopeError("give a spec (a built-in name or a Python file); --list lists them")
    spec = load_spec(args.spec)
    batch = args.batch_size if args.batch_size is not None else spec.batch_size
    seq = args.seq_len if args.seq_len is not None else spec.seq_len
    if batch is not None and not _accepts(spec.make_batch, "batch_size"):
        if args.batch_size is not None:
            raise RidgescopeError("--batch-size given but make_batch takes no batch_size")
        batch = None
    if seq is not None and not _accepts(spec.make_batch, "seq_len"):
        if args.seq_len is not None:
            raise RidgescopeError("--seq-len given but make_batch takes no seq_len")
        seq = None
    policy = args.dtype_policy or spec.dtype_policy
    if policy == "fp32":
        policy = None
    try:
        est = estimate(spec.make_model, spec.make_optimizer, spec.make_batch, device=args.device,
                       capacity=args.capacity, dtype_policy=policy, steps=args.steps,
                       loss_fn=spec.loss_fn, alloc_conf=args.alloc_conf, batch_size=batch,
                       seq_len=seq, remedies=not args.no_remedies, trace=args.trace,
                       workspace_bytes=_workspace(args.cublas_workspace))
    except ValueError as exc:
        raise RidgescopeError(str(exc)) from None
    sweep = None
    sb, ss = _ints(args.sweep_batch), _ints(args.sweep_seq)
    if sb or ss:
        sweep = est.sweep(batch_size=sb, seq_len=ss)
    if args.format == "json":
        data = {"spec": spec.name, "dtype_policy": policy or "fp32", **est.to_dict()}
        if sweep is not None:
            data["sweep"] = sweep.to_dict()
        text = json.dumps(data, indent=2) + "\n"
    else:
        text = f"spec: {spec.name} ({spec.description})\n" + est.summary() + "\n"
        if sweep is not None:
            text += "\nsweep:\n" + sweep.table() + "\n"
        if args.trace is not None:
            text += f"trace: {args.trace} (ridgescope report {args.trace})\n"
    emit(text, args.output)
    return 0 if est.fits is not False else 2
