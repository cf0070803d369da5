"""ridgescope for the Hugging Face ``Trainer``::

    from ridgescope.integrations.transformers import RidgescopeCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[RidgescopeCallback()])
    trainer.train()   # -> output_dir/ridgescope.rstrace and ridgescope.html

From ``on_train_begin`` to the end of training the run is tracked with ``rs.track``: the model
and the optimizer are the Trainer's own, taken out of accelerate's wrappers (the
``AcceleratedOptimizer`` around the torch optimizer, DDP or DataParallel around the model), so
parameters, gradients and optimizer state carry their names and steps are counted at the real
optimizer's steps. Phases come from the hooks (forward, backward, recompute under activation
checkpointing — ``activation_checkpointing=True`` in transformers 5, whose ``gradient_checkpointing``
is a deprecated alias of it; with ``every_n_layers`` only the checkpointed layers recompute —,
optimizer_step, zero_grad, checkpoint at ``torch.save``) and from the Trainer's
events: an evaluation during training is one ``eval`` phase and a checkpoint save (the
model's safetensors too, which ``torch.save`` does not see) one ``checkpoint`` phase.

When training ends, the trace and its HTML report are in ``output_dir`` (per rank under a
distributed launch), ``callback.report`` holds the ``rs.Report``, and the peak with its
composition goes to the Trainer's logs as one more log record (``ridgescope/peak_bytes``,
``ridgescope/peak_step``, ``ridgescope/peak/<category>``), so it reaches whatever ``report_to``
is configured and ``trainer.state.log_history``. ``tensorboard=True`` also writes the per-step
scalars of ``ridgescope report --tensorboard`` into ``output_dir/runs/ridgescope``, at the
Trainer's step numbers (its step *n* is the report's step *n* - 1)."""
from __future__ import annotations

import os
import sys
import weakref
from typing import Any

import torch
from transformers import TrainerCallback

from ._run import RunResults, TrackedRun, guarded_event

# The Trainer counts global_step from 1 after the first optimizer step; the report's step 0 is
# the first training iteration, which the Trainer logs at global_step 1.
STEP_OFFSET = 1


def unwrap_model(model: Any) -> torch.nn.Module | None:
    """The user's model inside accelerate's and torch's containers (DDP, DataParallel,
    torch.compile's wrapper)."""
    if model is None:
        return None
    try:
        from accelerate.utils import extract_model_from_parallel
        model = extract_model_from_parallel(model, keep_torch_compile=False)
    except ImportError:
        while isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
    return model if isinstance(model, torch.nn.Module) else None


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer inside accelerate's ``AcceleratedOptimizer`` (which delegates its
    step, so the step hooks fire on the inner one)."""
    for _ in range(8):
        inner = getattr(optimizer, "optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer):
            break
        optimizer = inner
    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None


def _dispatching_trainer() -> Any:
    """The Trainer whose event is being dispatched to this callback, or None.

    The figures must reach the ``report_to`` integrations, which the Trainer calls before any
    user callback; only ``Trainer.log`` (public) sends one record to all of them, and a
    callback is handed no reference to its Trainer. So it is looked up once, at
    ``on_train_begin``, as the ``self`` of the calling frames (the Trainer's training loop calls
    its CallbackHandler, which calls this callback). Without it the figures still go to
    ``state.log_history`` and to the callbacks after this one."""
    from transformers import Trainer

    frame = sys._getframe(1)
    for _ in range(16):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None


class RidgescopeCallback(RunResults, TrainerCallback):
    """Tracks a Hugging Face ``Trainer`` run with ridgescope (see the module docstring).

    ``output_dir``: where the trace and HTML report go (default: the Trainer's
    ``args.output_dir``). ``activations``, ``capacity``: as for ``rs.track``.
    ``tensorboard``: False, True (``output_dir/runs/ridgescope``) or a directory.
    ``html``: write the HTML report beside the trace."""

    def __init__(self, output_dir: str | os.PathLike[str] | None = None, *,
                 activations: bool | str = True, capacity: int | str | None = None,
                 tensorboard: bool | str | os.PathLike[str] = False, html: bool = True,
                 keep_steps: int | str | None = None) -> None:
        self._run = TrackedRun(dirpath=output_dir, activations=activations, capacity=capacity,
                               tensorboard=tensorboard, html=html, step_offset=STEP_OFFSET,
                               framework="transformers", keep_steps=keep_steps)
        self._trainer: Any = None
        self._pending: list[str] = []  # phases the Trainer's flags announce after this step

    # report, trace and error come from RunResults (_run.py)

    def finish(self) -> Any:
        """Stops tracking now and returns the report (None if nothing was tracked): after a
        training that raised (the Trainer has no event for it; the next training's start also
        closes it). A training that ends normally needs no call."""
        self._run.call(self._run.finish)
        return self._run.report

    # ----------------------------------------------------------------------- events
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, **kwargs: Any) -> None:
        self._begin(args, model, optimizer)

    @guarded_event
    def _begin(self, args: Any, model: Any, optimizer: Any) -> None:
        trainer = _dispatching_trainer()
        self._trainer = weakref.ref(trainer) if trainer is not None else None
        self._run.start(unwrap_model(model), unwrap_optimizer(optimizer), args.output_dir,
                        rank=args.process_index, world_size=args.world_size,
                        tensorboard_dir=os.path.join(args.output_dir, "runs", "ridgescope"))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._pending = []
        self._closing("eval", "checkpoint")  # left open only if their closing event never came

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._after_step(control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._after_step(control)

    @guarded_event
    def _after_step(self, control: Any) -> None:
        """The Trainer's flow callback has decided what follows this step (it runs first): an
        evaluation, then a save. Each becomes one explicit phase, closed by its own event."""
        self._pending = [name for name, flag in (("eval", control.should_evaluate),
                                                 ("checkpoint", control.should_save)) if flag]
        if self._pending:
            self._run.open_phase(self._pending.pop(0))

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._closing("eval")

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._closing("checkpoint")

    @guarded_event
    def _closing(self, *names: str) -> None:
        for name in names:
            self._run.close_phase(name)
            if name == "eval" and self._pending:
                self._run.open_phase(self._pending.pop(0))

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
               **kwargs: Any) -> None:
        # The Trainer's last record of a training run carries its speed metrics: the training
        # is over, and the report_to integrations are still open to take one more record.
        if isinstance(logs, dict) and "train_runtime" in logs:
            self._finish(state, logs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._finish(state, None)

    @guarded_event
    def _finish(self, state: Any, logs: dict[str, Any] | None) -> None:
        figures = self._run.finish()
        if figures is None:
            return
        trainer = self._trainer() if self._trainer is not None else None
        if trainer is not None and getattr(trainer, "state", None) is state:
            trainer.log(dict(figures))  # one record, to every callback and the log history
            return
        state.log_history.append({**figures, "step": state.global_step})
        if logs is not None:
            logs.update(figures)  # the callbacks after this one see them in the last record
