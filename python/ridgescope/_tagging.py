"""What a tracking session tags, and how it names it (design.md §4): the tracked model's and
every other model's parameters and buffers, gradients (one native scan of the watched
parameters), optimizer state, the storages that existed before the session, and the root module
and optimizer found by discovery when ``rs.track()`` names neither. The run's description
(``run`` metadata) is rewritten whenever the models change.

A mixin of ``Instrumentation`` (_instrument.py), which owns the state it uses (the native
session, the models, the distributed strategies, the labels) and the phase and module hooks
that call it.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Callable

import torch

from . import _model_info
from ._version import __version__
from .distributed import local_tensor


class Tagging:
    """The tagging half of ``Instrumentation``."""

    # ----------------------------------------------------------------------------- tagging
    def tag_once(self, owner: Any, key: str, tensor: torch.Tensor, category: str,
                 label: Callable[[], str]) -> None:
        """Tags a tensor's block unless this (owner, key) was already tagged at this address.
        ``label`` is only called (the string only built) when a tag is written."""
        if not isinstance(tensor, torch.Tensor) or tensor.device.type not in ("cpu", "cuda"):
            return
        tensor = self.distributed.local(tensor)  # a DTensor's local shard
        if tensor is None:
            return
        ptr = tensor.untyped_storage().data_ptr()
        cache_key = (id(owner), key)
        if self._tagged.get(cache_key) == ptr:
            return
        self._tagged[cache_key] = ptr
        self._native.tag(tensor, category, self.label(label()), False)

    def watch_gradients(self) -> None:
        """Hands the trainable parameters to the native gradient scan: of the model and the
        optimizer, and of every other model found (a GAN's discriminator), less those whose .grad
        a strategy keeps inside a buffer of its own (DeepSpeed's reduce bucket: not a gradient's
        block, labelled by the strategy)."""
        unwatched = self.distributed.unwatched
        trainable = [p for p in self._params if p.requires_grad]
        seen = {id(p) for p in trainable}
        trainable += [p for p in self.models.trainable_parameters() if id(p) not in seen]
        trainable = [p for p in trainable if id(p) not in unwatched]
        self._native.watch_parameters(
            trainable, [self.label(f"grad of {self._param_name(p)}") for p in trainable])

    def tag_gradients(self) -> None:
        """Tags the gradients whose block changed since the last scan: one pass in C++ over the
        watched parameters, run when backward ends and before each optimizer step. A gradient is
        a gradient from its allocation on (the analysis applies a tag with hindsight), so tagging
        at the end of backward loses nothing against a per-parameter hook, at a fraction of the
        cost."""
        self._native.tag_gradients()
        self.distributed.after_backward()

    def tag_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        """After an optimizer step: tags its state tensors. The scan is skipped while the state's
        shape (parameters with state, entries per parameter) is unchanged, which after the first
        step is every step; a state tensor replaced in place of another under the same key is
        then not re-tagged, but its allocation is still recorded."""
        state = optimizer.state
        try:  # every step: counted in C (a value that is no dict is counted too: more checks)
            counted = sum(map(len, state.values()))
        except TypeError:  # a value without a length (a 0-d tensor kept as a parameter's state)
            counted = sum([len(s) for s in state.values() if isinstance(s, dict)])
        shape = (id(state), len(state), counted)
        if self._state_shapes.get(id(optimizer)) == shape:
            return
        self._state_shapes[id(optimizer)] = shape
        for p, entries in state.items():
            if not isinstance(entries, dict):
                continue
            for key, value in entries.items():
                if isinstance(value, torch.Tensor):
                    self.tag_once(p, f"state:{key}", value, "optimizer_state",
                                  lambda key=key, p=p: f"{key} of {self._param_name(p)}")

    def _all_params(self) -> list[torch.Tensor]:
        seen: set[int] = set()
        out = []
        sources = []
        if self._model is not None:
            sources.append(self._model.parameters())
        if self._optimizer is not None:
            sources.extend(g["params"] for g in self._optimizer.param_groups)
        for it in sources:
            for p in it:
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def register_existing(self, found: str = "tracked") -> None:
        """Adopts the storages that existed before the session so the ledger starts right, and
        finds the other models the script holds (_models.py)."""
        n = self._native
        self.distributed.on_model(self._model)  # labels shards and buckets its own way
        self.distributed.on_optimizer(self._optimizer)
        local = self.distributed.local  # a DTensor's local shard; None: labelled already
        if self._model is not None:  # its parameters and buffers, by module path
            self.models.set_root(self._model, found)
        for p in self._params:
            if self._model is None and local(p) is not None:
                n.register(local(p), "parameter", self.label(self._param_name(p)))
            if p.grad is not None:
                n.register(local_tensor(p.grad), "gradient",
                           self.label(f"grad of {self._param_name(p)}"))
        if self._optimizer is not None:
            for p, state in self._optimizer.state.items():
                for key, value in (state.items() if isinstance(state, dict) else ()):
                    if isinstance(value, torch.Tensor):
                        n.register(local_tensor(value), "optimizer_state",
                                   self.label(f"{key} of {self._param_name(p)}"))
        self.models.discover(sys._getframe(1))
        self._models_changed()

    def _models_changed(self, describe: bool = True) -> None:
        """After models were found: names for gradients and optimizer state, the gradients to
        watch, and the run's description."""
        self._param_names = {**_model_info.parameter_names(self._model, self._optimizer),
                             **self.models.parameter_names}
        self.watch_gradients()
        if describe:
            self._describe()

    # ------------------------------------------------------------------- discovery (no model)
    # Without a model (``rs.track()``, ``ridgescope run``), the root is the first module called
    # from outside any module, and the optimizer the first one that steps. Their storages are
    # named then; a tag applies to a block from its allocation on, so nothing is lost.
    def _adopt_root(self, module: torch.nn.Module) -> None:
        self._root = module
        self._model = module
        self._param_names = _model_info.parameter_names(module, self._optimizer)
        self._module_labels.clear()
        self._params = self._all_params()
        if self.on_cuda_module is not None and any(p.is_cuda for p in self._params):
            start, self.on_cuda_module = self.on_cuda_module, None
            start()  # before the storages are tagged: the CUDA blocks must be live first
        self.register_existing(found="called")  # describes the run

    def _adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer
        self._param_names = _model_info.parameter_names(self._model, optimizer)
        self.distributed.on_optimizer(optimizer)
        if self._model is None:  # a loop without modules: the optimizer's parameters
            self._params = self._all_params()
            for p in self._params:
                self._native.register(p, "parameter", self.label(self._param_name(p)))
        self._models_changed()

    def _describe(self) -> None:
        """(Re)writes the run's description; the analysis keeps the last one."""
        run = _model_info.describe_run(self._model, self._optimizer, __version__)
        run["models"] = self.models.describe()
        if self.run_extra:
            run.update(self.run_extra)
        self._native.metadata("run", json.dumps(run, sort_keys=True))
        self.distributed.publish()
