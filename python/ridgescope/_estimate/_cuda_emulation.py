"""A CUDA target on the CPU: the fake tensors of a dry run for a CUDA device run on the CPU
device (the autograd engine cannot run fake CUDA tensors without a GPU), with CUDA's choices
emulated where they change memory: code that names the CUDA device, ``module.to(device)``,
CUDA autocast's float32 op list, and the foreach default of the optimizers."""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

import torch


# CUDA autocast runs these in float32 (torch.amp docs, "CUDA Ops that can autocast to
# float32"); CPU autocast leaves most of them in the input's dtype. Emulated on top of CPU
# autocast with a function mode that upcasts their floating inputs.
_CUDA_FP32_FUNCS = ("softmax", "log_softmax", "layer_norm", "group_norm", "exp", "log", "pow",
                    "rsqrt", "reciprocal", "cumsum", "cumprod", "prod", "sum", "norm",
                    "normalize", "softplus", "mse_loss", "l1_loss", "smooth_l1_loss",
                    "nll_loss", "cross_entropy", "kl_div", "cosine_similarity", "logsumexp")


class _CudaAutocastFp32(torch.overrides.TorchFunctionMode):
    def __init__(self, low: torch.dtype) -> None:
        super().__init__()
        self.low = low
        names = set(_CUDA_FP32_FUNCS)
        self.funcs = set()
        for ns in (torch, torch.nn.functional, torch.Tensor):
            for n in names:
                f = getattr(ns, n, None)
                if f is not None:
                    self.funcs.add(f)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in self.funcs and torch.is_autocast_enabled("cpu"):
            up = lambda a: a.float() if isinstance(a, torch.Tensor) and a.dtype == self.low else a  # noqa: E731
            args = tuple(up(a) for a in args)
            kwargs = {k: up(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


class _CudaOnCpu(torch.overrides.TorchFunctionMode):
    """For a CUDA target: code that names the CUDA device (``torch.randn(..., device="cuda")``,
    ``x.to("cuda")``, ``x.cuda()``, a ``torch.device("cuda")`` context) gets the CPU device the
    fake tensors run on."""

    @staticmethod
    def _cpu(d: Any) -> Any:
        if isinstance(d, torch.device) and d.type == "cuda":
            return torch.device("cpu")
        if isinstance(d, str) and d.startswith("cuda"):
            return "cpu"
        if isinstance(d, int) and not isinstance(d, bool):
            return "cpu"  # a bare CUDA ordinal
        return d

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if "device" in kwargs:
            kwargs["device"] = self._cpu(kwargs["device"])
        if func is torch.Tensor.to and len(args) > 1 and not isinstance(args[1], torch.Tensor) \
                and not isinstance(args[1], torch.dtype):
            args = (args[0], self._cpu(args[1])) + tuple(args[2:])
        return func(*args, **kwargs)


@contextlib.contextmanager
def _device_free_module_moves() -> Iterator[None]:
    """While the model is built: ``module.to(device)`` / ``.cuda()`` keep the (emulated) device
    and apply only a dtype, parameter by parameter (fake parameters cannot be swapped)."""
    nn = torch.nn.Module
    orig_to, orig_cuda = nn.to, nn.cuda

    def convert(module: torch.nn.Module, dtype: torch.dtype | None) -> torch.nn.Module:
        if dtype is None:
            return module
        for m in module.modules():
            for name, p in list(m._parameters.items()):
                if p is not None and p.is_floating_point() and p.dtype != dtype:
                    m._parameters[name] = torch.nn.Parameter(p.detach().to(dtype),
                                                              requires_grad=p.requires_grad)
            for name, b in list(m._buffers.items()):
                if b is not None and b.is_floating_point() and b.dtype != dtype:
                    m._buffers[name] = b.to(dtype)
        return module

    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        _, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        return convert(self, dtype)

    nn.to = to  # type: ignore[method-assign]
    nn.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.to, nn.cuda = orig_to, orig_cuda  # type: ignore[method-assign]



@contextlib.contextmanager
def _cuda_optimizer_defaults(enabled: bool) -> Iterator[None]:
    """On CUDA, Adam/AdamW/SGD default to their foreach implementations (which hold a few
    full-size temporaries); the CPU default is the per-tensor loop. Emulated here."""
    if not enabled:
        yield
        return
    import torch.optim.adam  # noqa: F401  (the modules whose default is patched)
    import torch.optim.optimizer as om
    orig = om._default_to_fused_or_foreach

    def cuda_default(params: Any, differentiable: bool, use_fused: bool = False) -> tuple[bool, bool]:
        if torch.jit.is_scripting() or differentiable:
            return False, False
        return False, not use_fused

    modules = [om] + [m for m in (sys.modules.get(f"torch.optim.{n}") for n in
                                  ("adam", "adamw", "sgd", "_adafactor", "rmsprop", "adagrad",
                                   "nadam", "radam", "adamax", "asgd", "rprop", "adadelta"))
                      if m is not None and hasattr(m, "_default_to_fused_or_foreach")]
    saved = [(m, m._default_to_fused_or_foreach) for m in modules]
    for m in modules:
        m._default_to_fused_or_foreach = cuda_default
    try:
        yield
    finally:
        for m, f in saved:
            m._default_to_fused_or_foreach = f
        om._default_to_fused_or_foreach = orig
