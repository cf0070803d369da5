"""ridgescope for Lightning's ``Trainer`` (the ``lightning`` package, and ``pytorch_lightning``)::

    import lightning as L
    from ridgescope.integrations.lightning import RidgescopeCallback
    trainer = L.Trainer(max_steps=100, callbacks=[RidgescopeCallback()])
    trainer.fit(model, loader)   # -> trainer.log_dir/ridgescope.rstrace and ridgescope.html

From ``on_fit_start`` (the sanity-check validation included) to ``on_train_end`` the run is
tracked with ``rs.track``, with the LightningModule as the model and the Trainer's first
optimizer. Phases come from the hooks and from Lightning's events: ``training_step`` is the
``forward`` phase (from ``on_train_batch_start`` to the zero_grad or backward that follows it),
so it is one even when the step calls a submodule rather than the module itself; each
validation is one ``eval`` phase; under Lightning's automatic optimisation the optimizer step
receives a closure that runs forward and backward, and the ``optimizer_step`` phase is the
update that follows the closure. The batch Lightning hands the step is ``input``, and so is what
the training DataLoader's dataset holds (``TensorDataset`` tensors, made before training).

At the end the trace and its HTML report are in ``trainer.log_dir`` (one per rank under DDP:
``ridgescope.rank<N>.rstrace``), ``callback.report`` holds the ``rs.Report``, and the peak with
its composition goes to every logger of the Trainer (``ridgescope/peak_bytes``,
``ridgescope/peak_step``, ``ridgescope/peak/<category>``; Lightning's loggers write on rank 0).
``tensorboard=True`` also writes the per-step scalars of ``ridgescope report --tensorboard`` into
``trainer.log_dir``, at Lightning's logging steps (the report's step numbers).

The callback class derives from the ``Callback`` of each Lightning package installed, so one
class works with ``lightning.Trainer`` and ``pytorch_lightning.Trainer`` alike."""
from __future__ import annotations

import importlib.util
import os
from typing import Any

from ._run import RunResults, TrackedRun, guarded_event


def _callback_bases() -> tuple[type, ...]:
    bases: list[type] = []
    if importlib.util.find_spec("lightning") is not None:
        from lightning.pytorch import Callback
        bases.append(Callback)
    if importlib.util.find_spec("pytorch_lightning") is not None:
        from pytorch_lightning import Callback as PLCallback
        bases.append(PLCallback)
    if not bases:
        raise ImportError("ridgescope.integrations.lightning needs lightning or pytorch_lightning: "
                          "pip install 'ridgescope[lightning]'")
    return tuple(bases)


class _Adapter(RunResults):
    """The callback's behaviour; ``RidgescopeCallback`` adds Lightning's Callback base(s)."""

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, *, activations: bool | str = True,
                 capacity: int | str | None = None,
                 tensorboard: bool | str | os.PathLike[str] = False, html: bool = True,
                 keep_steps: int | str | None = None) -> None:
        super().__init__()
        self._run = TrackedRun(dirpath=dirpath, activations=activations, capacity=capacity,
                               tensorboard=tensorboard, html=html, step_offset=0,
                               framework="lightning", keep_steps=keep_steps)

    # report, trace and error come from RunResults (_run.py)

    def finish(self) -> Any:
        """Stops tracking now and returns the report (None if nothing was tracked), for a fit
        that left Lightning's events behind; a fit that ends, or raises, needs no call."""
        self._run.call(self._run.finish)
        return self._run.report

    @guarded_event
    def _open(self, name: str) -> None:
        self._run.open_phase(name)

    @guarded_event
    def _close(self, name: str) -> None:
        self._run.close_phase(name)

    # ----------------------------------------------------------------------- events
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._begin(trainer, pl_module)

    @guarded_event
    def _begin(self, trainer: Any, pl_module: Any) -> None:
        optimizers = list(getattr(trainer, "optimizers", None) or [])
        log_dir = trainer.log_dir or trainer.default_root_dir
        self._run.start(pl_module, optimizers[0] if optimizers else None, log_dir,
                        rank=trainer.global_rank, world_size=trainer.world_size,
                        tensorboard_dir=log_dir)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._open("eval")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._close("eval")

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int, *args: Any) -> None:
        self._batch_start(batch)

    @guarded_event
    def _batch_start(self, batch: Any) -> None:
        self._run.tag_batch(batch)
        self._run.open_phase("forward")

    def on_before_zero_grad(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._close("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._close("forward")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        self._close("forward")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish(trainer)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish(trainer)  # a fit that ran no training batch (max_steps=0)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._finish(None)  # the trace and report of what ran, kept for `ridgescope explain`
        # An out-of-memory error is explained now: after one in its data set-up, Lightning's
        # teardown raises another error ("Please call `iter(combined_loader)` first") that
        # hides it; the explanation is printed and rides on the error as a note.
        self._run.call(self._run.explain_oom, exception)

    @guarded_event
    def _finish(self, trainer: Any) -> None:
        figures = self._run.finish()
        if figures is None or trainer is None:
            return
        for logger in trainer.loggers:
            logger.log_metrics(dict(figures), step=trainer.global_step)


class RidgescopeCallback(_Adapter, *_callback_bases()):  # type: ignore[misc]
    """Tracks a Lightning ``Trainer``'s fit with ridgescope (see the module docstring).

    ``dirpath``: where the trace and HTML report go (default: ``trainer.log_dir``).
    ``activations``, ``capacity``: as for ``rs.track``. ``tensorboard``: False, True
    (``trainer.log_dir``) or a directory. ``html``: write the HTML report beside the trace."""
