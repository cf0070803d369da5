"""What a dry run predicts: ``Estimate`` (one configuration: peaks, composition, whether it
fits), ``Remedy`` (one way to make it fit) and ``Sweep`` (a grid of dry runs and the fitted
scaling of the activation peak)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .._errors import RidgescopeError
from .._format import format_bytes
from .._report import Report


def activation_peak(report: Report) -> int:
    """The most activation bytes live at any phase's peak or end."""
    return max((max(p["peak_by_category"].get("activation", 0),
                    p["end_by_category"].get("activation", 0))
                for p in report.phases()), default=0)


def _by_phase(report: Report) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in report.phases():
        out[p["phase"]] = max(out.get(p["phase"], 0), p["peak_bytes"])
    return out


@dataclass
class Remedy:
    """One way to make the step fit, with its predicted peak. ``method`` says how it was
    obtained: ``"dry run"`` (the step re-run with the change) or ``"arithmetic"`` (the
    measured composition with one category scaled)."""
    name: str
    description: str
    peak_allocated: int
    fits: bool | None
    method: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Estimate:
    """The prediction for one training-step configuration. Bytes are integers."""
    device: str
    capacity: int | None
    peak_allocated: int
    peak_reserved: int | None
    by_category: dict[str, int]
    by_phase: dict[str, int]
    activation_peak: int
    report: Report
    params: dict[str, Any]
    allocator_stats: dict[str, Any] | None = None
    allocator_oom: bool | None = None
    largest_batch: int | None = None
    largest_batch_method: str | None = None
    largest_seq_len: int | None = None
    largest_seq_len_method: str | None = None
    remedies: list[Remedy] = field(default_factory=list)
    _rerun: Callable[..., "Estimate"] | None = field(default=None, repr=False)

    @property
    def predicted_peak(self) -> int:
        """The figure compared with the capacity: reserved when the allocator model predicted
        it, else allocated."""
        return self.peak_reserved if self.peak_reserved is not None else self.peak_allocated

    @property
    def fits(self) -> bool | None:
        """Whether the step fits in the capacity: with the allocator model, whether the
        modelled allocator served every request (release-and-retry included); else whether
        the predicted peak is at most the capacity. None without a capacity."""
        if self.capacity is None:
            return None
        if self.allocator_oom is not None:
            return not self.allocator_oom
        return self.predicted_peak <= self.capacity

    @property
    def margin(self) -> int | None:
        """Capacity minus the predicted peak (negative when it does not fit)."""
        return None if self.capacity is None else self.capacity - self.predicted_peak

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device, "capacity_bytes": self.capacity, "params": self.params,
            "fits": self.fits, "margin_bytes": self.margin,
            "peak_allocated_bytes": self.peak_allocated,
            "peak_reserved_bytes": self.peak_reserved,
            "reserved_modelled": self.peak_reserved is not None,
            "activation_peak_bytes": self.activation_peak,
            "by_category": self.by_category, "by_phase": self.by_phase,
            "peak_step": self.report.peak.get("step"), "peak_phase": self.report.peak.get("phase"),
            "largest_batch": self.largest_batch, "largest_batch_method": self.largest_batch_method,
            "largest_seq_len": self.largest_seq_len,
            "largest_seq_len_method": self.largest_seq_len_method,
            "remedies": [r.to_dict() for r in self.remedies],
        }

    def summary(self) -> str:
        lines = []
        params = ", ".join(f"{k}={v}" for k, v in self.params.items())
        lines.append(f"ridgescope fit: predicted training step on {self.device}"
                     + (f" ({params})" if params else ""))
        lines.append(f"  peak allocated  {format_bytes(self.peak_allocated):>11}  "
                     f"(step {self.report.peak.get('step')}, {self.report.peak.get('phase')})")
        if self.peak_reserved is not None:
            how = ("on the CPU, reserved is allocated" if self.device == "cpu"
                   else "caching-allocator model")
            lines.append(f"  peak reserved   {format_bytes(self.peak_reserved):>11}  ({how})")
        else:
            lines.append("  peak reserved   not predicted (allocator model not available)")
        if self.capacity is not None:
            verdict = "FITS" if self.fits else "DOES NOT FIT"
            m = self.margin or 0
            lines.append(f"  capacity        {format_bytes(self.capacity):>11}  -> {verdict}, "
                         f"margin {'-' if m < 0 else ''}{format_bytes(abs(m))}")
        lines.append("  at the peak, by category:")
        for cat, b in sorted(self.by_category.items(), key=lambda kv: -kv[1]):
            if b:
                lines.append(f"    {cat:<16} {format_bytes(b):>11}")
        lines.append("  peak by phase:")
        for ph, b in self.by_phase.items():
            lines.append(f"    {ph:<16} {format_bytes(b):>11}")
        if self.largest_batch is not None:
            lines.append(f"  largest batch that fits: {self.largest_batch} "
                         f"({self.largest_batch_method})")
        if self.largest_seq_len is not None:
            lines.append(f"  longest sequence that fits: {self.largest_seq_len} "
                         f"({self.largest_seq_len_method})")
        if self.remedies:
            lines.append("  remedies (predicted peak allocated):")
            for r in self.remedies:
                ok = "" if r.fits is None else ("  fits" if r.fits else "  still too big")
                lines.append(f"    {r.name:<28} {format_bytes(r.peak_allocated):>11}{ok}  "
                             f"[{r.method}] {r.description}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    # ---------------------------------------------------------------- sweep
    def sweep(self, batch_size: Sequence[int] | None = None,
              seq_len: Sequence[int] | None = None, steps: int | None = None) -> "Sweep":
        """Runs the dry run over the grid (``make_batch`` must accept ``batch_size`` and/or
        ``seq_len``) and fits the activation peak's scaling: linear in batch size and
        ``a + b*s + c*s^2`` in sequence length (least squares). ``steps`` defaults to the
        estimate's: at least two are needed for the peaks and ``fits`` (the second step's
        forward and backward hold the optimizer state the first one created); one is enough
        for the activation scaling alone."""
        if self._rerun is None:
            raise RidgescopeError("this estimate cannot be re-run")
        bs = list(batch_size) if batch_size else [None]
        ss = list(seq_len) if seq_len else [None]
        rows = []
        for b, s in itertools.product(bs, ss):
            kw = {}
            if b is not None:
                kw["batch_size"] = b
            if s is not None:
                kw["seq_len"] = s
            est = self._rerun(batch_kwargs=kw, remedies=False,
                              **({"steps": steps} if steps is not None else {}))
            rows.append({"batch_size": est.params.get("batch_size", b),
                         "seq_len": est.params.get("seq_len", s),
                         "peak_allocated": est.peak_allocated,
                         "peak_reserved": est.peak_reserved,
                         "activation_peak": est.activation_peak, "fits": est.fits})
        return Sweep(rows)


def _lstsq(xs: list[float], ys: list[float], degree: int) -> list[float]:
    import numpy as np
    a = np.vander(np.asarray(xs, dtype=float), degree + 1, increasing=True)
    coef, *_ = np.linalg.lstsq(a, np.asarray(ys, dtype=float), rcond=None)
    return [float(c) for c in coef]


@dataclass
class Sweep:
    """A grid of dry runs: ``rows`` and the fitted scaling of the activation peak."""
    rows: list[dict[str, Any]]

    def _groups(self, key: str, other: str) -> dict[Any, list[tuple[int, int]]]:
        g: dict[Any, list[tuple[int, int]]] = {}
        for r in self.rows:
            if r[key] is not None:
                g.setdefault(r[other], []).append((r[key], r["activation_peak"]))
        return g

    @property
    def batch_scaling(self) -> dict[str, Any] | None:
        """Activation peak = a + b * batch_size, fitted over each sequence length; the fit of
        the longest one, with its largest relative residual."""
        for s, pts in sorted(self._groups("batch_size", "seq_len").items(),
                             key=lambda kv: -(kv[0] or 0)):
            if len(pts) < 2:
                continue
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            a, b = _lstsq(xs, ys, 1)
            resid = max(abs(a + b * x - y) / max(y, 1) for x, y in pts)
            return {"seq_len": s, "a": a, "b": b, "model": "linear", "max_rel_residual": resid}
        return None

    @property
    def seq_scaling(self) -> dict[str, Any] | None:
        """Activation peak = a + b*s + c*s^2 (least squares) for the largest batch size;
        ``model`` is "quadratic" when the s^2 term is over 5 % of the peak at the longest
        sequence, else "linear"."""
        for b, pts in sorted(self._groups("seq_len", "batch_size").items(),
                             key=lambda kv: -(kv[0] or 0)):
            if len(pts) < 3:
                continue
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            a, lin, quad = _lstsq(xs, ys, 2)
            smax = max(xs)
            share = quad * smax * smax / max(max(ys), 1)
            return {"batch_size": b, "a": a, "b": lin, "c": quad,
                    "quadratic_share": share,
                    "model": "quadratic" if share > 0.05 else "linear"}
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "batch_scaling": self.batch_scaling,
                "seq_scaling": self.seq_scaling}

    def table(self) -> str:
        lines = [f"{'batch':>6} {'seq':>6} {'activation':>12} {'allocated':>12} {'reserved':>12}  fits"]
        for r in self.rows:
            res = format_bytes(r["peak_reserved"]) if r["peak_reserved"] is not None else "-"
            fits = "-" if r["fits"] is None else ("yes" if r["fits"] else "no")
            lines.append(f"{str(r['batch_size']):>6} {str(r['seq_len']):>6} "
                         f"{format_bytes(r['activation_peak']):>12} "
                         f"{format_bytes(r['peak_allocated']):>12} {res:>12}  {fits}")
        bsc, ssc = self.batch_scaling, self.seq_scaling
        if bsc:
            lines.append(f"activation ~ {bsc['a']:.4g} + {bsc['b']:.4g} * batch  (linear, "
                         f"max residual {bsc['max_rel_residual']:.2%})")
        if ssc:
            lines.append(f"activation ~ {ssc['a']:.4g} + {ssc['b']:.4g} * s + {ssc['c']:.4g} "
                         f"* s^2  ({ssc['model']}; s^2 term {ssc['quadratic_share']:.1%} of "
                         "the peak at the longest s)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()
