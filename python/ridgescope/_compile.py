"""torch.compile under tracking (docs/compile.md).

Dynamo must see a tracked run exactly as it sees the same run untracked: the same frames, the
same graphs, the same guards. Three mechanisms keep it so, all decided from torch's own code
(torch/_dynamo in 2.11 and 2.14):

* **Compiled regions are hook-free.** A call of a compiled module (an ``OptimizedModule`` from
  ``torch.compile(module)``, a module's ``compile()``) or of a function compiled while tracking
  is a *region*: ridgescope's hooks are taken out of torch's hook dictionaries (and its
  sessions out of the ``Module.__call__`` wrapper's, _module_calls.py) while it runs, so Dynamo
  traces ``forward`` as it would untracked (no hook inlined into the graph, ``_call_impl`` not
  traced), ``OptimizedModule.__call__`` does not warn about global hooks, and the guards Dynamo
  installs at compile time see at run time the same dictionaries.
  The region itself stands in for the hooks: it opens ``forward`` (or ``eval``), tags the inputs
  and the output, and names the module (or function) that allocations inside it come from.
* **Compiling is a phase.** Dynamo's compile callbacks (``torch._dynamo.callback``: start and
  end of a frame's compilation, of a lazily compiled backward, of a CUDA-graph recording; in
  2.11 and 2.14) open and close ``compile``, put the original ``Module.__call__`` back for the
  compilation (Dynamo never sees the wrapper), and take the module hooks out for it
  (nn-module hook dictionaries are not guarded unless
  ``torch._dynamo.config.skip_nnmodule_hook_guards`` is off, in which case they stay and are
  traced as no-ops).
* **ridgescope's own frames are never converted.** Where ridgescope's Python runs inside a
  compiled region's eager parts (after a graph break), its code objects carry a frame
  strategy that tells Dynamo's frame evaluator to run them as plain Python (helpers: the frame
  and everything it calls; wrappers around torch functions: the frame only, so what they call
  is treated as without them). Hooks that Dynamo may still inline (an optimizer hook inside a
  compiled train step) return at once under ``torch.compiler.is_compiling()``.

Nothing here imports ``torch._dynamo`` before the program does: the support is installed when
tracking starts if Dynamo is already loaded, or at the first ``torch.compile`` otherwise.
"""
from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable

import torch

_is_compiling = torch.compiler.is_compiling

# ------------------------------------------------------------------------ frame strategies
try:  # both 2.11 and 2.14 have these (torch/_dynamo/eval_frame.py imports them the same way)
    from torch._C._dynamo.eval_frame import (  # type: ignore[attr-defined]
        _FrameAction, _FrameExecStrategy, set_code_exec_strategy)
    _SKIP_ALL = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    _SKIP_FRAME = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT)
except Exception:  # a torch without Dynamo's frame evaluator: nothing to keep out
    set_code_exec_strategy = None


def _code(fn: Any) -> Any:
    fn = getattr(fn, "__func__", fn)
    return getattr(fn, "__code__", None)


def run_as_python(*fns: Any) -> None:
    """Dynamo's frame evaluator runs these functions, and everything they call, as plain Python:
    never converted, never counted in ``torch._dynamo.utils.counters``. Costs nothing outside
    compiled code (the strategy is read only where Dynamo intercepts a frame)."""
    for fn in fns:
        code = _code(fn)
        if set_code_exec_strategy is not None and code is not None:
            set_code_exec_strategy(code, _SKIP_ALL)


def run_frame_as_python(*fns: Any) -> None:
    """The function's own frame is never converted; what it calls is treated as without it (a
    wrapper around a torch function: the torch function's frames behave as untracked)."""
    for fn in fns:
        code = _code(fn)
        if set_code_exec_strategy is not None and code is not None:
            set_code_exec_strategy(code, _SKIP_FRAME)


def _disabled_code() -> Any:
    try:
        return torch._disable_dynamo(lambda: None).__code__
    except Exception:
        return None


_DISABLED_CODE = _disabled_code()


def transparent(original: Callable[..., Any], wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """``wrapper`` (ridgescope's phase wrapper around a torch function) as Dynamo should see it:
    as ``original``. A function torch marks ``_disable_dynamo`` (``Optimizer.zero_grad``) makes
    Dynamo break the graph at its call and run it eagerly; the wrapper is marked the same way,
    under the same name, so the break and its reason stay the same. Any other function is traced
    straight through to ``original`` while compiling."""
    functools.update_wrapper(wrapper, original)
    if _DISABLED_CODE is not None and getattr(original, "__code__", None) is _DISABLED_CODE:
        return torch._disable_dynamo(wrapper)
    if getattr(original, "_torchdynamo_disable", False):
        from torch._dynamo import disable
        return disable(wrapper)

    @functools.wraps(original)
    def traced_as_original(*args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return original(*args, **kwargs)
        return wrapper(*args, **kwargs)
    run_frame_as_python(traced_as_original, wrapper)
    return traced_as_original


def unwrap_module(module: Any) -> Any:
    """The module a user's compiled module stands for (``OptimizedModule._orig_mod``): its
    parameter names carry no ``_orig_mod.`` prefix."""
    seen = 0
    while module is not None and type(module).__name__ == "OptimizedModule" and seen < 8:
        inner = getattr(module, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            break
        module, seen = inner, seen + 1
    return module


# ------------------------------------------------------------------------ hidden hooks
class _HiddenHooks:
    """Takes hooks out of torch's hook dictionaries and puts them back in their order. Nested
    (a compiled block inside a compiled model, a compilation inside a region): the first hide
    takes them out, the last show puts them back. Process-global, as the dictionaries are."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._handles: list[Any] = []
        self._taken: list[tuple[Any, list[Any], Any, Any]] = []  # (dict, keys order, key, value)

    def set_handles(self, handles: list[Any]) -> None:
        self._handles = list(handles)

    def hide(self) -> None:
        with self._lock:
            self._depth += 1
            if self._depth != 1:
                return
            taken = []
            for h in self._handles:
                refs = [h.hooks_dict_ref, *getattr(h, "extra_dict_ref", ())]
                for ref in refs:
                    d = ref()
                    if d is not None and h.id in d:
                        taken.append((d, list(d.keys()), h.id, d.pop(h.id)))
            self._taken = taken

    def show(self) -> None:
        with self._lock:
            if self._depth == 0:
                return
            self._depth -= 1
            if self._depth != 0:
                return
            taken, self._taken = self._taken, []
            for d, order, key, value in reversed(taken):
                d[key] = value
                # back where it was: the keys after it in the old order move behind it again
                after = order[order.index(key) + 1:]
                for k in after:
                    if k in d:
                        d.move_to_end(k)

    @property
    def hidden(self) -> bool:
        return self._depth > 0


# ------------------------------------------------------------------------ the tracker
_current: "CompileTracking | None" = None  # the tracking session's compile support, or None


class CompileTracking:
    """The compile support of one session (an extension of ``Instrumentation``)."""

    def __init__(self, instr: Any) -> None:
        self._instr = instr
        self._hidden = _HiddenHooks()  # every hook, for a region (compile and run alike)
        self._hidden_compile = _HiddenHooks()  # the unguarded module hooks, for a compilation
        self._installed = False  # Dynamo-side pieces (callbacks, OptimizedModule patch)
        self._restore: list[Callable[[], None]] = []
        self._compile_hid: list[bool] = []  # per open compilation: did it hide the hooks
        self._compile_opened: list[bool] = []
        self._compile_ops: list[int | None] = []  # Dynamo's captured-call count at its start
        self._lock = threading.Lock()
        self._regions: list[_FunctionCall] = []  # open calls of compiled functions
        self._in_listener = False
        self._phase_listener: Callable[[str, bool], None] | None = None  # from the first region on

    # ------------------------------------------------------------------ install / remove
    def install(self) -> None:
        global _current
        _current = self
        self._hidden.set_handles(self._instr.hook_handles)
        self._hidden_compile.set_handles(self._instr.module_hook_handles)
        self._patch(torch, "compile", _make_compile(torch.compile))
        self._patch(torch.nn.Module, "compile", _make_module_compile(torch.nn.Module.compile))
        if "torch._dynamo" in sys.modules:
            self._install_dynamo()
        model = getattr(self._instr, "_model", None)
        if model is not None:
            for m in model.modules():
                _wrap_compiled_call_impl(m)

    def remove(self) -> None:
        global _current
        if _current is self:
            _current = None
        self._instr._guard(self._record_cuda_pools)()
        for restore in reversed(self._restore):
            try:
                restore()
            except Exception:
                pass
        self._restore.clear()
        for hidden in (self._hidden, self._hidden_compile):
            while hidden.hidden:
                hidden.show()

    def _record_cuda_pools(self) -> None:
        """CUDA graphs (``mode="reduce-overhead"``) allocate from private pools of the caching
        allocator: when tracking stops, each pool's segments are summed from torch's own
        snapshot into the trace's ``cuda_pools`` metadata (docs/compile.md)."""
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return
        pools = summarize_pools(torch.cuda.memory_snapshot())
        if any(p["pool_id"] != [0, 0] for p in pools):
            import json
            self._instr._native.metadata("cuda_pools", json.dumps(
                {"measured": "when tracking stopped", "pools": pools}, sort_keys=True))

    def _patch(self, owner: Any, attr: str, new: Any) -> None:
        original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        setattr(owner, attr, new)
        self._restore.append(lambda: setattr(owner, attr, original))

    def _install_dynamo(self) -> None:
        """Compile callbacks and the OptimizedModule region; once torch._dynamo is loaded."""
        if self._installed:
            return
        self._installed = True
        try:
            from torch._dynamo.callback import callback_handler
            from torch._dynamo.eval_frame import OptimizedModule
        except Exception:  # a torch without them: compiled code still runs, unmarked
            return
        start, end = self._instr._guard(self._on_compile_start), self._instr._guard(self._on_compile_end)
        run_as_python(start, end)
        # Dynamo traces the original Module.__call__ (_module_calls.py; not guarded: a failed
        # session's compilations must still put the wrapper back)
        hide_call, show_call = self._instr.module_call_swaps
        callback_handler.register_start_callback(hide_call)
        callback_handler.register_start_callback(start)
        callback_handler.register_end_callback(end)
        callback_handler.register_end_callback(show_call)

        def unregister() -> None:
            for remove, cb in ((callback_handler.remove_start_callback, start),
                               (callback_handler.remove_end_callback, end),
                               (callback_handler.remove_start_callback, hide_call),
                               (callback_handler.remove_end_callback, show_call)):
                try:
                    remove(cb)
                except ValueError:  # torch._dynamo.reset() cleared them already
                    pass
        self._restore.append(unregister)
        self._patch(OptimizedModule, "__call__", _make_optimized_call(OptimizedModule.__call__))

    # ------------------------------------------------------------------ compilation
    def _on_compile_start(self, args: Any = None) -> None:
        # Inside a region everything is out already. Elsewhere (code compiled before tracking
        # began) only the module hooks may go: Dynamo guards the optimizer hook dictionaries,
        # which must look the same when the compiled code runs.
        hide = not self._hidden.hidden and _hook_dicts_unguarded()
        if hide:
            self._hidden_compile.hide()
        opened = self._instr.begin_phase("compile", explicit=False)
        with self._lock:
            self._compile_hid.append(hide)
            self._compile_opened.append(opened)
            self._compile_ops.append(_ops_captured())

    def _on_compile_end(self, args: Any = None) -> None:
        with self._lock:
            hid = self._compile_hid.pop() if self._compile_hid else False
            opened = self._compile_opened.pop() if self._compile_opened else False
            ops = self._compile_ops.pop() if self._compile_ops else None
        if opened:
            self._instr.end_phase("compile")
        call = self._regions[-1] if self._regions else None
        if (call is not None and call.owned and call.training and call.resume_forward
                and not call.backward_seen and not call.zero_grad_seen and ops is not None
                and _ops_captured() > ops):
            # the first call's first graph has operations and runs now: that is its forward
            call.resume_forward = False
            self._open(call, "forward")
        if hid:
            self._hidden_compile.show()

    # ------------------------------------------------------------------ regions
    def module_region(self, module: torch.nn.Module, call: Callable[..., Any], args: tuple,
                      kwargs: dict) -> Any:
        """A compiled module's call: hooks hidden, the module's own pre/post hook work done here."""
        instr = self._instr
        self._hidden.hide()
        # a failed pre marks the session failed, and every later guarded call returns at once
        instr._guard(instr._on_module_pre)(module, args, kwargs)
        try:
            out = call(*args, **kwargs)
        except BaseException:
            instr._guard(instr._on_module_post)(module, args, kwargs, None)
            self._hidden.show()
            raise
        instr._guard(instr._on_module_post)(module, args, kwargs, out)
        self._hidden.show()
        return out

    def in_function_region(self) -> bool:
        return bool(self._regions)

    def function_region(self, fn: "_CompiledFunction", call: Callable[..., Any], args: tuple,
                        kwargs: dict) -> Any:
        """A call of a function compiled while tracking (a compiled train step). Dynamo leaves
        eager only what it cannot trace (``zero_grad``, ``backward``); the compiled code between
        them gets its phases here: ``forward`` from the call to the first ``zero_grad`` or
        ``backward``, and ``optimizer_step`` from the end of ``backward`` to the end of the call
        when the call updates the parameters (learnt from the call before; on the first call,
        when an optimizer is known). A call that updated the parameters counts a step."""
        instr = self._instr
        self._hidden.hide()
        region = instr._guard(self._enter_function)(fn, args, kwargs)
        try:
            out = call(*args, **kwargs)
        except BaseException:
            instr._guard(self._exit_function)(region, False)
            self._hidden.show()
            raise
        instr._guard(self._exit_function)(region, True)
        self._hidden.show()
        return out

    def _enter_function(self, fn: "_CompiledFunction", args: tuple,
                        kwargs: dict) -> "_FunctionCall":
        instr = self._instr
        owned = (not self._regions and not instr._depth() and not instr._phase_stack)
        call = _FunctionCall(fn, owned)
        if self._phase_listener is None:
            # Listening from the first compiled call on: an eager run's phases never call it
            # (two Python frames at every phase boundary of every step; docs/performance.md)
            self._phase_listener = instr._guard(self._on_phase)
            instr.phase_listeners.append(self._phase_listener)
        self._regions.append(call)
        if owned:
            call.training = torch.is_grad_enabled()
            if call.training and (fn.zero_grad_first or fn.steps is None):
                # forward starts when its zero_grad ends; on the first call, also when the
                # compiled code before anything eager turns out to hold tensor operations
                call.resume_forward = True
            else:
                self._open(call, "forward" if call.training else "eval")
            if call.training:
                from torch.utils._pytree import tree_leaves
                label = instr.label("input")
                for t in tree_leaves((args, kwargs)):
                    if isinstance(t, torch.Tensor):
                        instr._native.tag(t, "input", label, True)
            call.versions = _versions(instr._params)
        instr._enter_module(instr.label(f"activation saved in {fn.name}"), instr.label(fn.name))
        return call

    def _exit_function(self, call: "_FunctionCall | None", finished: bool) -> None:
        if call is None:
            return
        instr = self._instr
        if self._regions and self._regions[-1] is call:
            self._regions.pop()
        instr._exit_module()
        if not call.owned:
            return
        self._close(call)
        stepped = call.versions is not None and _versions(instr._params) != call.versions
        if finished:
            call.fn.steps = stepped
        if stepped:
            optimizer = instr._optimizer or instr._counted_optimizer
            if optimizer is not None:
                instr.tag_optimizer_state(optimizer)
                if instr._counted_optimizer is None:
                    instr._counted_optimizer = optimizer
            instr.mark_step()

    def _open(self, call: "_FunctionCall", phase: str) -> None:
        self._in_listener = True
        try:
            if self._instr.begin_phase(phase, explicit=False):
                call.phase = phase
                call.forward_opened = call.forward_opened or phase == "forward"
        finally:
            self._in_listener = False

    def _close(self, call: "_FunctionCall") -> None:
        if call.phase is None:
            return
        phase, call.phase = call.phase, None
        self._in_listener = True
        try:
            self._instr.end_phase(phase)
        finally:
            self._in_listener = False

    def _on_phase(self, name: str, begun: bool) -> None:
        """Phases torch runs eagerly inside a compiled train step split its compiled code."""
        if self._in_listener or not self._regions:
            return
        call = self._regions[-1]
        if not call.owned or not call.training:
            return
        if begun and name == "zero_grad":
            call.zero_grad_seen = True
            if call.resume_forward and not call.forward_opened:
                call.fn.zero_grad_first = True  # the call begins with zero_grad
        if begun and name == "backward" and call.resume_forward:
            call.resume_forward = False  # no forward before this backward could be placed
        if begun and name in ("zero_grad", "backward") and call.phase == "forward":
            self._close(call)
            call.resume_forward = name == "zero_grad" and not call.backward_seen
        elif not begun and name == "zero_grad":
            if call.versions is None or not call.versions:
                call.versions = _versions(self._instr._params)  # the optimizer was found now
            if call.resume_forward:
                call.resume_forward = False
                self._open(call, "forward")
        elif not begun and name == "backward":
            call.backward_seen = True
            known = self._instr._optimizer is not None or self._instr._counted_optimizer is not None
            if call.fn.steps or (call.fn.steps is None and known):
                self._open(call, "optimizer_step")


class _CompiledFunction:
    """What ridgescope keeps of one function compiled while tracking."""

    def __init__(self, fn: Any) -> None:
        self.name = f"{getattr(fn, '__qualname__', None) or getattr(fn, '__name__', 'function')} (compiled)"
        self.steps: bool | None = None  # whether its last call updated the parameters
        self.zero_grad_first = False  # whether its calls begin with an optimizer's zero_grad


class _FunctionCall:
    def __init__(self, fn: _CompiledFunction, owned: bool) -> None:
        self.fn = fn
        self.owned = owned  # outermost: its phases are ridgescope's to open
        self.training = False
        self.phase: str | None = None  # the phase this call opened and has not closed
        self.resume_forward = False
        self.backward_seen = False
        self.forward_opened = False
        self.zero_grad_seen = False
        self.versions: list[int] | None = None


def _ops_captured() -> int | None:
    """Dynamo's count of operations put into graphs so far (2.11 and 2.14 keep it)."""
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return int(utils.counters["stats"]["calls_captured"]) if utils is not None else None
    except Exception:
        return None


def _versions(params: list[torch.Tensor]) -> list[int]:
    """The parameters' version counters: an optimizer step (eager or compiled) bumps them."""
    return [p._version for p in params]


def summarize_pools(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """torch.cuda.memory_snapshot()'s segments summed per (device, segment_pool_id): the default
    pool is (0, 0); a CUDA graph's or a MemPool's private pool has its own id. Bytes are the
    segments' total (reserved) and allocated sizes."""
    pools: dict[tuple[int, tuple[int, int]], dict[str, Any]] = {}
    for seg in segments:
        raw = seg.get("segment_pool_id") or (0, 0)
        pool_id = (int(raw[0]), int(raw[1])) if len(raw) == 2 else (0, 0)
        key = (int(seg.get("device", 0)), pool_id)
        p = pools.setdefault(key, {"device": key[0], "pool_id": list(pool_id), "segments": 0,
                                   "reserved_bytes": 0, "allocated_bytes": 0})
        p["segments"] += 1
        p["reserved_bytes"] += int(seg.get("total_size", 0))
        p["allocated_bytes"] += int(seg.get("allocated_size", 0))
    return [pools[k] for k in sorted(pools)]


def _hook_dicts_unguarded() -> bool:
    try:
        import torch._dynamo.config as cfg
        return bool(getattr(cfg, "skip_nnmodule_hook_guards", True))
    except Exception:
        return True


# ------------------------------------------------------------------------ wrappers
def _region_or_call(module: Any, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    tracker = _current
    if tracker is None or _is_compiling():
        return call(*args, **kwargs)
    return tracker.module_region(module, call, args, kwargs)


def _make_optimized_call(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _region_or_call(self._orig_mod, functools.partial(original, self), args, kwargs)
    run_frame_as_python(__call__)
    return __call__


def _wrap_compiled_call_impl(module: torch.nn.Module) -> None:
    """``module.compile()`` stored a compiled ``_call_impl``: its calls become regions (the
    wrapper stays in the module after tracking, and does nothing then)."""
    compiled = module.__dict__.get("_compiled_call_impl")
    if compiled is None or getattr(compiled, "_ridgescope_region", False):
        return
    ref = _module_ref(module)

    @functools.wraps(compiled)
    def compiled_call_impl(*args: Any, **kwargs: Any) -> Any:
        m = ref()
        if m is None:
            return compiled(*args, **kwargs)
        return _region_or_call(m, compiled, args, kwargs)
    compiled_call_impl._ridgescope_region = True  # type: ignore[attr-defined]
    run_frame_as_python(compiled_call_impl)
    module.__dict__["_compiled_call_impl"] = compiled_call_impl


def _module_ref(module: torch.nn.Module) -> Callable[[], Any]:
    import weakref
    try:
        return weakref.ref(module)
    except TypeError:
        return lambda: module


def _make_module_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        tracker = _current
        if tracker is not None:
            tracker._instr._guard(tracker._install_dynamo)()
            tracker._instr._guard(_wrap_compiled_call_impl)(self)
        return result
    return compile


def _make_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        tracker = _current
        if tracker is not None:  # Dynamo is loaded now: its callbacks and regions can be set up
            tracker._instr._guard(tracker._install_dynamo)()
            fn = args[0] if args else kwargs.get("model")
            if _is_plain_function(fn) and callable(result) and result is not fn:
                wrapped = tracker._instr._guard(_function_region_wrapper)(fn, result)
                if wrapped is not None:
                    return wrapped
        return result
    run_frame_as_python(compile)
    return compile


def _is_plain_function(fn: Any) -> bool:
    """A function or method to compile (not a module, not Module.compile's own _call_impl)."""
    import types
    if isinstance(fn, types.MethodType):
        return fn.__func__ is not torch.nn.Module._call_impl
    return isinstance(fn, types.FunctionType)


def _function_region_wrapper(fn: Any, compiled: Callable[..., Any]) -> Callable[..., Any]:
    """The compiled function as the user gets it, its calls regions; after tracking it only
    calls through (Dynamo, inlining it into another compiled function, reads the attributes
    torch set on ``compiled``, copied here)."""
    info = _CompiledFunction(fn)

    @functools.wraps(compiled)
    def compiled_function(*args: Any, **kwargs: Any) -> Any:
        tracker = _current
        if tracker is None or _is_compiling():
            return compiled(*args, **kwargs)
        return tracker.function_region(info, compiled, args, kwargs)
    run_frame_as_python(compiled_function)
    return compiled_function
