"""Automatic phases and tagging for a tracking session (design.md §3-§4).

Phases come from PyTorch's own hooks: module forward hooks (forward, eval, and recompute when a
module runs inside backward), a wrapper around ``torch.autograd.backward``/``grad``
(backward), the global optimizer step hooks (optimizer_step, and step counting), wrappers
around ``zero_grad`` (zero_grad) and ``torch.save`` (checkpoint). Categories come from the
parameters, buffers and optimizer state of what is tracked, post-accumulate-grad hooks
(gradient), the saved-tensor pack hook (activation; its work is done in C++) and the root
module's arguments (input); what is tagged and how it is named is _tagging.py's. Everything is
installed on start() and removed on stop().

Every hook body runs under ``_guard``: an internal error is reported once, the session stops
recording and the training loop goes on. Errors raised by the user's own code pass through.
"""
from __future__ import annotations

import functools
import sys
import threading
import warnings
import weakref
from typing import Any, Callable

import torch

from . import _compile, _model_info, _module_calls
from ._data import DatasetRegistrar
from ._leaves import leaves as leaves_of
from ._models import Models
from ._saved_hooks import MAX_NEW_SHAPE_STEPS, NEW_SHAPES_MARK, SavedTensorHooks, hook_steps, stack_is_empty
from ._tagging import Tagging
from ._undo import remove_all
from .distributed import DistributedTracking

# Pushed on the module call stack for the outermost call of a model other than the root.
_MODEL_CALL = "model call"

BUILTIN_PHASES = ("forward", "backward", "optimizer_step", "zero_grad", "checkpoint", "eval",
                  "data", "recompute", "compile")


class Instrumentation(Tagging):
    """Installs and removes the hooks of one session. Owned by ``Session``."""

    def __init__(self, native: Any, model: torch.nn.Module | None,
                 optimizer: torch.optim.Optimizer | None, activations: bool | str = True,
                 other_models: bool = True) -> None:
        self._native = native
        # The session's module calls as plain C functions where it has them (a pybind11 call
        # costs more than the work; the dry run's stand-in native of rs.estimate has methods).
        module_calls = getattr(native, "module_calls", None)
        self._enter_module, self._exit_module = (module_calls() if module_calls is not None
                                                 else (native.enter_module, native.exit_module))
        # A phase boundary's calls (the allocator sample, the marker, the degraded flag) as one.
        phase_calls = getattr(native, "phase_calls", None)
        self._phase_begin, self._phase_end = (phase_calls() if phase_calls is not None
                                              else (self._phase_begin_calls, self._phase_end_calls))
        model = _compile.unwrap_module(model)  # torch.compile(model): the model it compiled
        self._model = model
        self._optimizer = optimizer
        # Steps the saved-tensor hook runs in: None every one, 0 none (_saved_hooks.hook_steps)
        self._hook_steps = hook_steps(activations)
        self._hook_until = self._hook_steps  # the step the hook comes off at (None: never)
        self._input_shapes: set[tuple] = set()  # the root's input shapes and dtypes seen so far
        self._new_shape_steps = 0  # steps the hook came back for (at most MAX_NEW_SHAPE_STEPS)
        self._handles: list[Any] = []
        self._restore: list[Callable[[], None]] = []
        self._saved_hooks: SavedTensorHooks | None = None
        self._local = threading.local()
        self._phase_stack: list[str] = []  # the open phases' names, outermost first
        self._recomputing = False  # a recompute phase is open (module outputs are activations)
        self._phase_lock = threading.Lock()
        self._labels: dict[str, int] = {}
        self._param_names = _model_info.parameter_names(model, optimizer)
        # id(module) -> (activation label, recompute label, name, name's string id)
        self._module_labels: dict[int, tuple[int, int, str, int]] = {}
        self._tagged: dict[tuple[int, str], int] = {}  # (id(tensor owner), key) -> storage ptr
        self._root: torch.nn.Module | None = model
        # outermost module -> whether it holds the root (a DDP wrapper of rs.track(model=inner))
        self._root_wrappers: weakref.WeakKeyDictionary[torch.nn.Module, bool] = \
            weakref.WeakKeyDictionary()
        self._step = 0
        self._counted_optimizer = optimizer
        self._step_phases: dict[int, bool] = {}  # id(optimizer) -> its step opened optimizer_step
        self.run_extra: dict[str, Any] = {}  # more of the run's description (the capacity)
        # Called once when a discovered root module holds CUDA tensors (starts the CUDA source).
        self.on_cuda_module: Callable[[], None] | None = None
        self._params = self._all_params()
        self._state_shapes: dict[int, tuple[int, int, int]] = {}
        # DDP buckets, FSDP shards and gathers, ZeRO (python/ridgescope/distributed)
        self.distributed = DistributedTracking(self)
        self.datasets = DatasetRegistrar(self)  # a DataLoader's dataset is input (_data.py)
        from ._code_roots import _code_roots
        # every model's parameters (_models.py); other_models=False: the given model only
        self.models = Models(self, *_code_roots(), enabled=other_models)
        self.failed = False
        self.error: str | None = None
        # ridgescope's global module and optimizer hooks (out while compiled code runs: _compile.py)
        self.hook_handles: list[Any] = []
        self.module_hook_handles: list[Any] = []
        # Called as listener(name, begun) when a phase begins (before) and ends (after).
        self.phase_listeners: list[Callable[[str, bool], None]] = []
        # Module.__call__'s original for each compilation, the wrapper after it (_compile.py)
        self.module_call_swaps = (_module_calls.hide_for_compile, _module_calls.show_after_compile)
        # Pieces with their own install()/remove(), installed after the hooks, removed first.
        self.compile = _compile.CompileTracking(self)
        self.extensions: list[Any] = [self.compile]

    # ----------------------------------------------------------------------------- labels
    def label(self, text: str) -> int:
        lid = self._labels.get(text)
        if lid is None:
            lid = self._labels[text] = self._native.intern(text)
        return lid

    def _param_name(self, p: torch.Tensor) -> str:
        name = self.distributed.names.get(id(p)) or self._param_names.get(id(p))
        if name is None:
            name = f"parameter {tuple(p.shape)}"
        return name

    # ----------------------------------------------------------------------------- guard
    def _guard(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self.failed:
                return None
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # an internal error must never reach the training loop
                self.internal_error(exc)
                return None
        return guarded

    def internal_error(self, exc: Exception) -> None:
        """``fail`` for an exception caught around the session's own work (the one message
        format; the warning still points where ``fail`` called directly would)."""
        self.fail(f"{type(exc).__name__}: {exc}", stacklevel=4)

    def fail(self, reason: str, stacklevel: int = 3) -> None:
        """Stops recording after an internal error: one warning, training goes on."""
        if self.failed:
            return
        self.failed = True
        self.error = reason
        try:
            self._native.degrade(reason)
        except Exception:
            pass
        warnings.warn(f"ridgescope stopped recording after an internal error ({reason}); "
                      "training continues and the trace keeps what was recorded before it.",
                      RuntimeWarning, stacklevel=stacklevel)
        self.remove()

    def check_native(self) -> None:
        """Surfaces an error the native side hit (a failed trace write) as the one warning."""
        if not self.failed and self._native.degraded:
            self.fail(self._native.error)

    # ----------------------------------------------------------------------------- phases
    def begin_phase(self, name: str, explicit: bool) -> bool:
        """Opens a phase. An automatic phase is skipped while a phase of the same name is open:
        the user's markers win, and a phase inside itself is the outer one (ZeRO's local
        optimizer stepping inside the wrapper's step, autograd's backward inside DeepSpeed's).
        Returns whether a phase was opened."""
        for listener in self.phase_listeners:
            listener(name, True)
        with self._phase_lock:
            stack = self._phase_stack
            if not explicit and name in stack:
                return False
            stack.append(name)
            self._recomputing = "recompute" in stack
        if name == "recompute" and self._saved_hooks is not None:
            self._saved_hooks.push_for_recompute()
        self._phase_begin(self._labels.get(name) or self.label(name))
        return True

    def _phase_begin_calls(self, name_id: int) -> None:  # a native without phase_calls
        self._native.sample_allocator()
        self._native.phase_begin(name_id)

    def _phase_end_calls(self, name_id: int) -> bool:
        self._native.phase_end(name_id)
        self._native.sample_allocator()
        return bool(self._native.degraded)

    def end_phase(self, name: str) -> None:
        with self._phase_lock:
            stack = self._phase_stack
            if stack and stack[-1] == name:  # the innermost: the common case
                stack.pop()
            elif name in stack:  # closes it and every phase opened inside it
                del stack[len(stack) - 1 - stack[::-1].index(name):]
            self._recomputing = "recompute" in stack
        if name == "recompute" and self._saved_hooks is not None:
            self._saved_hooks.pop_after_recompute()
        if self._phase_end(self._labels.get(name) or self.label(name)):
            self.check_native()
        for listener in self.phase_listeners:
            listener(name, False)

    def in_phase(self, name: str) -> bool:
        return name in self._phase_stack

    # ----------------------------------------------------------------------------- modules
    def _module_info(self, module: torch.nn.Module) -> tuple[int, int, str, int]:
        info = self._module_labels.get(id(module))
        if info is None:
            name = None
            if self._model is not None:
                if module is self._model:
                    name = type(module).__name__
                else:
                    for n, m in self._model.named_modules():
                        if m is module:
                            name = n
                            break
            if name is None:  # a module of another model (a teacher's layer), else its class
                name = self.models.module_name(module) or type(module).__name__
            info = (self.label(f"activation saved in {name}"),
                    self.label(f"activation recomputed in {name}"), name, self.label(name))
            self._module_labels[id(module)] = info
        return info

    def _depth(self) -> list[str | None]:
        stack = getattr(self._local, "calls", None)
        if stack is None:
            stack = self._local.calls = []
        return stack

    # Every module call of the process runs through here while tracking (_module_calls.py), so
    # the nested call, the common case, is done inline with its own guard. ``call`` is the
    # original Module.__call__. The native session's module_call_function does the nested case
    # in C and calls this for everything else: the two must agree.
    def module_call(self, call: Callable[..., Any], module: torch.nn.Module, args: tuple,
                    kwargs: dict) -> Any:
        if self.failed:
            return call(module, *args, **kwargs)
        try:
            calls = getattr(self._local, "calls", None)
            if calls:  # a module inside another one on this thread
                info = self._module_labels.get(id(module)) or self._module_info(module)
                calls.append(None)
                self._enter_module(info[0], info[3])
            else:
                self._on_module_pre(module, args, {})
        except Exception as exc:  # an internal error must never reach the training loop
            self.internal_error(exc)
            return call(module, *args, **kwargs)
        try:
            output = call(module, *args, **kwargs)
        except BaseException:
            self._module_exit(module, args, None)
            raise
        # _module_exit's first test, inline (one Python frame less for every nested call)
        if calls and calls[-1] is None and not self._recomputing and not self.failed and len(calls) > 1:
            calls.pop()  # the common case again: nothing opened, nothing to tag
            self._exit_module()
        else:
            self._module_exit(module, args, output)
        return output

    def _module_exit(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if self.failed:
            return
        try:
            calls = self._local.calls
            if len(calls) > 1 and calls[-1] is None and not self._recomputing:
                calls.pop()  # the common case again: nothing opened, nothing to tag
                self._exit_module()
                return
            self._on_module_post(module, args, {}, output)
        except Exception as exc:
            self.internal_error(exc)

    def _on_module_pre(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        calls = self._depth()
        opened = None
        if not calls:  # outermost module call on this thread
            if self.in_phase("backward"):
                opened = "recompute"
            else:
                if self._root is None:
                    if self.models.may_be_root(module):  # not a frozen teacher called first
                        self._adopt_root(module)
                    elif self.models.is_waiting(module):
                        opened = _MODEL_CALL
                elif module is not self._root:
                    if self.models.on_outer_call(module):
                        self._models_changed()  # a second model (a reference model's forward)
                    if self.models.in_other_model(module):
                        opened = _MODEL_CALL
                self.distributed.on_outer_module(module)  # a DDP/FSDP wrapper around the model
                if module is self._root or self._wraps_root(module):
                    opened = "forward" if torch.is_grad_enabled() else "eval"
            if opened not in (None, _MODEL_CALL) and not self.begin_phase(opened, explicit=False):
                opened = None
            if opened == "forward":
                leaves = leaves_of(args) + leaves_of(kwargs) if kwargs else leaves_of(args)
                self._on_forward_inputs(leaves)
                label = self.label("input")
                for t in leaves:
                    if isinstance(t, torch.Tensor):
                        self._native.tag(t, "input", label, True)
        calls.append(opened)
        info = self._module_info(module)
        self._enter_module(info[0], info[3])

    def _wraps_root(self, module: torch.nn.Module) -> bool:
        """Whether an outermost module holds the tracked model (DDP, FSDP or any wrapper around
        ``rs.track(model=inner)``): its forward is the model's forward. Looked up once per
        module."""
        try:
            return self._root_wrappers[module]
        except KeyError:
            pass
        except TypeError:  # not weakly referenceable: not remembered
            return any(m is self._root for m in module.modules())
        holds = self._root is not None and any(m is self._root for m in module.modules())
        try:
            self._root_wrappers[module] = holds
        except TypeError:
            pass
        return holds

    def _on_module_post(self, module: torch.nn.Module, args: tuple, kwargs: dict,
                        output: Any) -> None:
        self._exit_module()
        calls = self._depth()
        opened = calls.pop() if calls else None
        if self._recomputing and output is not None:
            label = self._module_info(module)[1]
            leaves = leaves_of(output)
            for t in leaves:
                if isinstance(t, torch.Tensor):
                    self._native.tag(t, "activation", label, True)
        if opened is _MODEL_CALL:  # another model's output (a teacher's logits) feeds the loss
            if output is not None:
                label = self.label(f"output of {self.models.call_name(module)}")
                leaves = leaves_of(output)
                for t in leaves:
                    if isinstance(t, torch.Tensor):
                        self._native.tag(t, "activation", label, True)
            opened = None
        if opened in ("forward", "eval") and output is not None:
            # The model's output (logits) lives on after forward for the loss: an activation of
            # this forward, not an unexplained block.
            label = self.label(f"output of {self.models.call_name(module)}")
            leaves = leaves_of(output)
            for t in leaves:
                if isinstance(t, torch.Tensor):
                    self._native.tag(t, "activation", label, True)
        if opened is not None:
            if opened == "forward":
                self.distributed.after_forward(module)
            self.end_phase(opened)

    # ----------------------------------------------------------------------------- install
    def _patch(self, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, attr)
        setattr(owner, attr, make(original))
        self._restore.append(lambda: setattr(owner, attr, original))

    def _phase_wrapper(self, phase: str, after: Callable[[], None] | None = None,
                       before: Callable[..., None] | None = None) -> Callable[[Any], Any]:
        instr = self

        def make(original: Any) -> Any:
            # The guard inline, as _guard's: the wrapper runs every step (backward, zero_grad),
            # and each Python frame on its path costs microseconds there (docs/performance.md)
            @functools.wraps(original)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                opened = False
                if not instr.failed:
                    try:
                        opened = instr.begin_phase(phase, False)
                        if opened and before is not None:
                            before(*args, **kwargs)
                    except Exception as exc:  # never into the training loop
                        instr.internal_error(exc)
                try:
                    return original(*args, **kwargs)
                finally:
                    if opened and not instr.failed:
                        try:
                            if after is not None:
                                after()
                            instr.end_phase(phase)
                        except Exception as exc:
                            instr.internal_error(exc)
            # under torch.compile: seen by Dynamo as the original (_compile.py)
            return _compile.transparent(original, wrapper)
        return make

    def install(self) -> None:
        # every module call, through Module.__call__ (_module_calls.py): out in compiled regions
        # (module_call's nested case in C where the native has it: rs.estimate's stand-in has not)
        as_c = getattr(self._native, "module_call_function", None)
        session_call = (as_c(self, self._local, self._module_labels) if as_c is not None
                        else self.module_call)
        self.module_hook_handles = [_module_calls.register(session_call)]
        self._restore.append(_module_calls.release)
        self.hook_handles = list(self.module_hook_handles)
        self._handles.extend(self.module_hook_handles)

        self._patch(torch.autograd, "backward",
                    self._phase_wrapper("backward", self._after_backward, self._before_backward))
        self._patch(torch.autograd, "grad",
                    self._phase_wrapper("backward", self._after_grad, self._before_grad))
        self._patch(torch.optim.Optimizer, "zero_grad",
                    self._phase_wrapper("zero_grad", before=self._before_optimizer_zero_grad))
        self._patch(torch.nn.Module, "zero_grad", self._phase_wrapper("zero_grad"))
        self._patch(torch, "save", self._phase_wrapper("checkpoint"))
        self.datasets.install()

        import torch.optim.optimizer as opt_mod

        # Guarded inline, as _guard's (one Python frame less a step each)
        def step_pre_hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
            if _is_compiling() or self.failed:  # traced inside a compiled train step: nothing to do
                return None
            try:
                return self._on_step_pre(opt, args, kwargs)
            except Exception as exc:
                self.internal_error(exc)
                return None

        def step_post_hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if _is_compiling() or self.failed:
                return
            try:
                self._on_step_post(opt)
            except Exception as exc:
                self.internal_error(exc)
        _compile.run_as_python(step_pre_hook, step_post_hook)
        self.hook_handles += [opt_mod.register_optimizer_step_pre_hook(step_pre_hook),
                              opt_mod.register_optimizer_step_post_hook(step_post_hook)]
        self._handles.extend(self.hook_handles[-2:])

        self.watch_gradients()
        # registration hooks: out of torch's dictionaries while compiled code runs or compiles
        # (Dynamo would break the graph at a module made inside it, ModuleList slicing)
        registration = self.models.install(self._guard)
        self.hook_handles += registration
        self.module_hook_handles += registration

        if self._hook_steps != 0:
            self._install_saved_hooks()
        for extension in self.extensions:
            extension.install()

    def _before_optimizer_zero_grad(self, optimizer: Any = None, *args: Any, **kwargs: Any) -> None:
        """Inside a compiled train step the optimizer's step hooks never run eagerly: the
        optimizer is found at its zero_grad (a graph break Dynamo keeps), as it would be at its
        first step in eager code."""
        if (self._optimizer is None and isinstance(optimizer, torch.optim.Optimizer)
                and self.compile.in_function_region()):
            self._adopt_optimizer(optimizer)

    # Around the outermost backward on a thread: the saved-tensor hooks are off torch's stack
    # while it runs (_saved_hooks.py), unless it builds a graph of its own. create_graph is the
    # 4th parameter of torch.autograd.backward and the 5th of torch.autograd.grad.
    def _before_backward(self, *args: Any, **kwargs: Any) -> None:
        self._tag_loss(*args, **kwargs)
        if self._saved_hooks is not None:
            self._saved_hooks.suspend(args, kwargs, 3)

    def _after_backward(self) -> None:
        self._after_grad()
        self.tag_gradients()

    def _before_grad(self, *args: Any, **kwargs: Any) -> None:
        if self._saved_hooks is not None:
            self._saved_hooks.suspend(args, kwargs, 4)

    def _after_grad(self) -> None:
        if self._saved_hooks is not None:
            self._saved_hooks.restore()

    def _tag_loss(self, tensors: Any = None, *args: Any, **kwargs: Any) -> None:
        """The tensor backward starts from (the loss) is an output of the step's forward."""
        leaves = leaves_of(kwargs.get("tensors", tensors))
        label = self.label("loss")
        for t in leaves:
            if isinstance(t, torch.Tensor):
                self._native.tag(t, "activation", label, True)

    def _on_step_pre(self, optimizer: torch.optim.Optimizer, args: tuple = (),
                     kwargs: dict | None = None) -> tuple[tuple, dict] | None:
        if self._step_phases.pop(id(optimizer), False):  # its last step raised inside the phase
            self.end_phase("optimizer_step")
        if self._counted_optimizer is None:
            self._counted_optimizer = optimizer
        if self._optimizer is None:
            self._adopt_optimizer(optimizer)
        self.tag_gradients()  # gradients made outside loss.backward() (autograd.grad, by hand)
        kwargs = {} if kwargs is None else kwargs
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if callable(closure):
            # step(closure) (Lightning, LBFGS) runs the closure's forward and backward inside the
            # step: the optimizer_step phase opens when the first closure call returns (calls
            # after it, LBFGS's line search, are inside the update).
            wrapped = self._around_closure(closure, optimizer)
            if "closure" in kwargs:
                return args, {**kwargs, "closure": wrapped}
            return (args[0], wrapped, *args[2:]), kwargs
        # Nested in another optimizer's step (ZeRO's local optimizer, DeepSpeed's): not opened,
        # so the outer step is one phase and one step.
        self._step_phases[id(optimizer)] = self.begin_phase("optimizer_step", explicit=False)
        return None

    def _around_closure(self, closure: Callable[..., Any], optimizer: Any) -> Callable[..., Any]:
        begin = self._guard(self.begin_phase)
        calls = [0]

        def run_closure(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] > 1:
                return closure(*args, **kwargs)
            try:
                return closure(*args, **kwargs)
            finally:
                self._step_phases[id(optimizer)] = begin("optimizer_step", False) is True
        return run_closure

    def _on_step_post(self, optimizer: torch.optim.Optimizer) -> None:
        self.tag_optimizer_state(optimizer)
        self.distributed.after_step(optimizer)
        self.discover_models()
        if self._step_phases.pop(id(optimizer), False):
            self.end_phase("optimizer_step")
        if optimizer is self._counted_optimizer:
            self.mark_step()

    def _install_saved_hooks(self) -> None:
        # The native session's hooks are plain C functions (called per saved tensor); a stand-in
        # native (the dry run of rs.estimate) has a pack_saved method instead.
        hooks = getattr(self._native, "saved_tensor_hooks", None)
        pack, unpack = hooks() if hooks is not None else (self._native.pack_saved, _identity)
        self._saved_hooks = SavedTensorHooks(pack, unpack)
        self._saved_hooks.install()

    def _on_forward_inputs(self, leaves: list[Any]) -> None:
        """The root's forward begins with these inputs. Shapes or dtypes it has not seen make
        allocations the hook's steps did not: the hook comes back for this step, to tag them and
        teach their savers (_saved_hooks.py), and a mark keeps the step in a bounded trace."""
        if not self._hook_steps or self._new_shape_steps >= MAX_NEW_SHAPE_STEPS:
            return  # no hook, or one on every step: nothing to bring back
        shapes = tuple((tuple(t.shape), t.dtype) for t in leaves if isinstance(t, torch.Tensor))
        if shapes in self._input_shapes:
            return
        self._input_shapes.add(shapes)
        # Never above the script's own hooks (save_on_cpu around the forward): the top pair is
        # the only one torch calls, so pushing ours would stop theirs.
        if (self._saved_hooks is None and self._hook_until is not None and self._step >= self._hook_until
                and stack_is_empty()):
            self._new_shape_steps += 1
            self._hook_until = self._step + 1
            self._native.mark(self.label(NEW_SHAPES_MARK))
            self._install_saved_hooks()

    def _retire_saved_hooks(self) -> None:
        hooks, self._saved_hooks = self._saved_hooks, None
        if hooks is not None:
            try:
                hooks.remove()
            except Exception:
                pass  # exited on another thread or out of order: nothing left to undo

    def count_steps_at(self, owner: Any) -> None:
        """Steps are counted by ``owner`` (a strategy's wrapper that is no torch optimizer:
        DeepSpeed's ZeRO optimizer calls ``mark_step`` when its step ends), not by the torch
        optimizer that steps inside it."""
        self._counted_optimizer = owner

    def mark_step(self) -> None:
        """One training step ended."""
        self._native.step(self._step)
        self._step += 1
        # The hook's steps are over: from here on activations come from lifetimes, labelled with
        # the savers the hook named for the same allocations (_saved_hooks.py).
        if self._saved_hooks is not None and self._hook_until is not None and self._step >= self._hook_until:
            self._retire_saved_hooks()

    def discover_models(self) -> None:
        """The step's end: models made or changed during the step (_models.py)."""
        if self.models.discover(sys._getframe(1)):
            self._models_changed()

    def remove(self) -> None:
        """Removes every hook and patch; safe to call twice."""
        for extension in reversed(self.extensions):
            try:
                extension.remove()
            except Exception:
                pass
        remove_all(self._handles, self._restore)
        self.models.remove()
        self.distributed.remove()
        self._retire_saved_hooks()


def _identity(x: Any) -> Any:
    return x


_is_compiling = torch.compiler.is_compiling
# The module calls' work, every guarded callback, what the phase wrappers call (guarded
# inline) and the unpack hook may run in a compiled region's eager parts: Dynamo runs them as
# plain Python (_compile.py). _guard(None, ...) only builds the one code object all guarded
# callbacks share.
_compile.run_as_python(Instrumentation._module_exit, Instrumentation._on_module_pre,
                       Instrumentation._module_info, Instrumentation.fail, Instrumentation.internal_error,
                       Instrumentation.begin_phase, Instrumentation.end_phase,
                       Instrumentation._before_backward, Instrumentation._after_backward,
                       Instrumentation._before_grad, Instrumentation._after_grad,
                       Instrumentation._before_optimizer_zero_grad,
                       Instrumentation._guard(None, _identity), _identity)  # type: ignore[arg-type]
# module_call runs the user's module: its own frame only (what it calls is as without it)
_compile.run_frame_as_python(Instrumentation.module_call)
