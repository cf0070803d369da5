"""Every model of the run, not only the tracked one (docs/categories.md, "Parameters of every
model").

A training script often holds more than the model it trains: an EMA copy of its weights, the
frozen reference model of DPO, a distillation teacher, the frozen VAE and text encoder of a
diffusion fine-tune. Their parameters and buffers hold memory for the whole run, so each is a
*model* here, with its parameters tagged ``parameter`` (and buffers ``buffer``) and labelled
``<model>: <module path>``; the tracked (or first trained) model keeps plain module paths.
Parameters that do not require a gradient say so: ``… (frozen)``.

How models are found (none of it on the allocation hot path):

* the tracked model, or without one the first module with a trainable parameter called from
  outside any module (a frozen module called first — a teacher, a reference model — waits; it
  becomes the root only when it is called again before any trainable module was);
* a module not yet known called from outside any module (a reference model's forward);
* at the end of each step (the optimizer step's post-hook, ``Session.mark_step``), when
  tracking starts and when it stops: the modules made while tracking that sit inside no other
  module (PyTorch's registration hooks see construction and ``load_state_dict(assign=True)``;
  ``copy.deepcopy`` and unpickling go through ``Module.__setstate__``, which is wrapped while
  tracking), and the modules the script's frames hold (``_model_frames.py``), which name them;
  a list, tuple or dict of tensors shaped exactly like a known model's parameters is a copy of
  its weights (diffusers' ``EMAModel.shadow_params``, ``{k: v.clone() for k, v in ...}``).
  The frames are scanned at every step end for the session's first 64 steps and for 16 after
  a model was found or changed, then at every 8th step end and at the next one after a module
  was made: a steady run pays for one scan in eight, and a weight copy made late in the run
  (nothing signals it) is found within 8 steps, attributed from its allocation on;
* a known model whose storages may have changed (``Module._apply``: ``.to()``, ``.half()``,
  ``to_empty()``; a parameter, buffer or submodule registered in it) is walked again at the
  next of those points. A tag applies to a block from its allocation on, so a model found at
  the step's end is attributed for the whole step.

A model is named by the variable or attribute that holds it (innermost frame first), else by
its class and the line that made it (``UNet2DModel created at train.py:9``). Models are held
weakly: tracking never keeps one alive."""
from __future__ import annotations

import sys
import weakref
from collections import Counter
from typing import Any, Callable

import torch

from . import _compile
from ._model_frames import FrameScanner, Found
from ._undo import remove_all

MAX_MODELS = 64
# The frame scan at step ends (about 20-100 us on a small script): at each of the session's first
# EAGER_SCANS step ends and of the EAGER_SCANS_AFTER_CHANGE after a model was found or changed;
# then at every SCAN_EVERY-th, and at the next one after a module was made (registration hooks).
EAGER_SCANS = 8
EAGER_SCANS_AFTER_CHANGE = 16
SCAN_EVERY = 8


class ModelEntry:
    """One model: a module, or a collection of tensors copying another model's parameters."""

    def __init__(self, name: str, cls: str, found: str, created_at: str | None, prefix: str,
                 ref: Any, copy_of: "ModelEntry | None" = None) -> None:
        self.name, self.cls, self.found, self.created_at = name, cls, found, created_at
        self.prefix = prefix        # label prefix: "" for the root, "<name>: " otherwise
        self.ref = ref              # weakref to the module (or the collection's holder), or None
        self.copy_of = copy_of
        self.description: dict[str, Any] = {}
        # parameter path -> shape, for matching a copy of the weights (set by each walk)
        self.shapes: dict[str, torch.Size] = {}
        self.buffer_shapes: dict[str, torch.Size] = {}
        self.paths: dict[int, str] | None = None  # id(submodule) -> path, made when first asked

    def module(self) -> torch.nn.Module | None:
        return self.ref() if self.ref is not None and self.copy_of is None else None


class Models:
    """The models of one session. Owned by ``Instrumentation``; every entry point runs under
    its guard."""

    def __init__(self, instr: Any, library_roots: list[str], stdlib_roots: list[str],
                 enabled: bool = True) -> None:
        self._instr = instr
        self.enabled = enabled  # False: the root only (the dry run of rs.estimate)
        self.entries: list[ModelEntry] = []
        self._members: "weakref.WeakKeyDictionary[torch.nn.Module, ModelEntry]" = weakref.WeakKeyDictionary()
        self._created: "weakref.WeakKeyDictionary[torch.nn.Module, str | None]" = weakref.WeakKeyDictionary()
        self._made = False                      # a module was made since the last scan
        # Step ends left at which the frames are scanned whatever happened; after them, every
        # SCAN_EVERY-th step end, or the next one after a module was made or a model changed.
        self._eager_scans = EAGER_SCANS
        self._ends_since_scan = 0
        self._changed: list[ModelEntry] = []    # models to walk again
        self._tagged: dict[tuple[int, str], int] = {}   # (id(entry), key) -> storage address
        # storage address -> (the model that tagged it, the tensor it tagged, held weakly)
        self._owner: dict[int, tuple[ModelEntry, Any]] = {}
        self._collections: dict[int, tuple[int, ModelEntry | None]] = {}  # id -> (len, copy)
        self._waiting: set[int] = set()         # id(frozen module) called first, not yet root
        self._waiting_names: dict[int, str] = {}
        self._empty: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # called, no tensors
        self._scanner = FrameScanner(library_roots, stdlib_roots)
        self._restore: list[Callable[[], None]] = []
        self._handles: list[Any] = []
        self.parameter_names: dict[int, str] = {}  # id(parameter) -> label without "(frozen)"

    @property
    def locals_status(self) -> str:
        return self._scanner.locals_status

    # ------------------------------------------------------------------------- the root
    def may_be_root(self, module: torch.nn.Module) -> bool:
        """Whether an outermost module called while no root is known becomes the root: one with
        a trainable parameter called with gradients enabled. A module called frozen or under
        no_grad (a teacher, a reference model) waits, and becomes the root when it is called
        again before any module was trained (an evaluation-only script); one without
        parameters (a loss function) never does."""
        params = list(module.parameters())
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            return True
        if not params or id(module) not in self._waiting:
            if params:
                self._waiting.add(id(module))
            return False
        return True

    def is_waiting(self, module: torch.nn.Module) -> bool:
        """A frozen module called first, not (yet) the root."""
        return id(module) in self._waiting

    def call_name(self, module: torch.nn.Module) -> str:
        """The name of a model being called: its listed name, else (a frozen module called
        before the root was known) the variable holding it, else its class."""
        name = self.module_name(module)
        if name is None:
            name = self._waiting_names.get(id(module))
            if name is None:
                name = self._names_of(sys._getframe(1)).get(id(module)) or type(module).__name__
                self._waiting_names[id(module)] = name
        return name

    def set_root(self, module: torch.nn.Module, found: str) -> ModelEntry:
        names = self._names_of(sys._getframe(1)) if self.enabled else {}
        entry = self._add(module, names.get(id(module)), found, prefix="")
        self.entries.remove(entry)
        self.entries.insert(0, entry)
        return entry

    # ------------------------------------------------------------------------- discovery
    def on_outer_call(self, module: torch.nn.Module) -> bool:
        """A module called from outside any module that is not the root. Returns whether a model
        was added."""
        if not self.enabled or module in self._members or module in self._empty:
            return False
        if not _holds_tensors(module):  # a loss function, an activation: not a model
            self._empty.add(module)
            return False
        added = self.discover(sys._getframe(1))
        if module not in self._members and not self._full():
            names = self._names_of(sys._getframe(1))
            self._add(module, names.get(id(module)), "called")
            added = True
        return added

    def discover(self, frame: Any = None) -> bool:
        """The step-end work: walks changed models again, adopts the modules made since the last
        scan that sit in no other module, and the modules and weight copies the script's frames
        hold. Returns whether a model was added (or changed)."""
        if not self.enabled or not self.entries:
            # no root yet: a module the frames hold may be the one the script trains
            return False
        frame = frame if frame is not None else sys._getframe(1)
        changed = bool(self._changed)
        self._ends_since_scan += 1
        if not (changed or self._made or self._eager_scans > 0 or self._ends_since_scan >= SCAN_EVERY):
            return False  # a steady run: the frames are scanned every SCAN_EVERY-th step end
        self._eager_scans -= 1
        self._ends_since_scan = 0
        while self._changed:
            entry = self._changed.pop()
            module = entry.module()
            if module is not None:
                self._walk(entry, module)
        found = self._scanner.scan(frame)
        added = False
        names: dict[int, Found] = {}
        for f in found:
            names.setdefault(id(f.value), f)
        # modules held by variables, attributes and containers, largest first (a module inside
        # another candidate is that one's member)
        candidates = [f for f in found if f.how != "collection" and f.value not in self._members
                      and f.value not in self._empty]
        if self._made:
            self._made = False
            candidates += [Found(m, None, "created") for m in self._top_level_made()]
        if candidates:
            seen: set[int] = set()
            unique = []
            for f in candidates:
                if id(f.value) not in seen:
                    seen.add(id(f.value))
                    unique.append(f)
            unique.sort(key=lambda f: -_count_modules(f.value))
            for f in unique:
                m = f.value
                if m in self._members:
                    continue
                if not _holds_tensors(m):  # a loss function in a variable: not looked at again
                    self._empty.add(m)
                    continue
                owner = self._owner_of_all(m)
                if owner is not None:  # a wrapper or view of a listed model (a compiled module)
                    for sub in m.modules():
                        self._members.setdefault(sub, owner)
                    continue
                if self._full():
                    continue
                named = names.get(id(m))
                name = named.name if named is not None and named.name else None
                self._add(m, name, named.how if named is not None else "created")
                added = True
        for f in found:
            if f.how == "collection":
                added |= self._collection(f)
        if added or changed:
            self._eager_scans = max(self._eager_scans, EAGER_SCANS_AFTER_CHANGE)
        return added or changed

    def _owner_of_all(self, module: torch.nn.Module) -> ModelEntry | None:
        """The listed model that already tags every parameter and buffer storage of ``module``
        (which is then no model of its own), or None."""
        owner = None
        local = self._instr.distributed.local
        for t in (*module.parameters(), *module.buffers()):
            t = local(t)
            if t is None:
                continue
            entry = self._owner_at(_address(t))
            if entry is None:
                return None
            owner = owner or entry
        return owner

    def _owner_at(self, addr: int) -> ModelEntry | None:
        """The model that tagged the storage at ``addr``, while the tensor it tagged still has
        its storage there (an address freed with a model and reused by another is no one's)."""
        held = self._owner.get(addr) if addr else None
        if held is None:
            return None
        entry, ref = held
        t = ref()
        if t is None or _address(t) != addr:
            del self._owner[addr]
            return None
        return entry

    def _top_level_made(self) -> list[torch.nn.Module]:
        made = [m for m in list(self._created.keys()) if m not in self._members]
        inside = {id(c) for m in made for c in m._modules.values() if c is not None}
        return [m for m in made if id(m) not in inside]

    def _names_of(self, frame: Any) -> dict[int, str]:
        out: dict[int, str] = {}
        for f in self._scanner.scan(frame):
            out.setdefault(id(f.value), f.name)
        return out

    # ------------------------------------------------------------------------- entries
    def _full(self) -> bool:
        """Whether MAX_MODELS models are listed (a script that makes a model every step would
        otherwise grow the run's description without bound); those after it stay untagged."""
        return len(self.entries) >= MAX_MODELS

    def _unique(self, name: str) -> str:
        taken = {e.name for e in self.entries}
        if name not in taken:
            return name
        i = 2
        while f"{name} #{i}" in taken:
            i += 1
        return f"{name} #{i}"

    def _add(self, module: torch.nn.Module, name: str | None, found: str,
             prefix: str | None = None) -> ModelEntry:
        created_at = self._created.get(module)
        cls = type(module).__name__
        if not name:
            name = f"{cls} created at {created_at}" if created_at else cls
        name = self._unique(name)
        entry = ModelEntry(name, cls, found, created_at,
                           f"{name}: " if prefix is None else prefix, weakref.ref(module))
        self.entries.append(entry)
        self._walk(entry, module)
        return entry

    def _walk(self, entry: ModelEntry, module: torch.nn.Module) -> None:
        """Tags the model's parameters and buffers (storages already tagged at the same address
        are skipped) and describes it."""
        for m in module.modules():
            self._members.setdefault(m, entry)
        entry.paths = None
        local = self._instr.distributed.local
        params = []
        for path, p in module.named_parameters(remove_duplicate=True):
            t = local(p)
            label = f"{entry.prefix}{path}"
            self.parameter_names.setdefault(id(p), label)
            params.append(p)
            if t is not None:
                self._register(entry, "p:" + path, t, "parameter",
                               label if p.requires_grad else f"{label} (frozen)")
        buffers = []
        for path, b in module.named_buffers(remove_duplicate=True):
            buffers.append(b)
            t = local(b)
            if t is not None:
                self._register(entry, "b:" + path, t, "buffer", f"{entry.prefix}{path}")
        entry.shapes = {path: p.shape for path, p in module.named_parameters(remove_duplicate=True)}
        entry.buffer_shapes = {path: b.shape for path, b in module.named_buffers(remove_duplicate=True)}
        entry.description = _describe(entry, params, buffers)

    def _register(self, entry: ModelEntry, key: str, t: torch.Tensor, category: str,
                  label: str, weak: bool = False) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type not in ("cpu", "cuda"):
            return
        addr = _address(t)
        cache_key = (id(entry), key)
        if addr and self._tagged.get(cache_key) == addr:
            return
        owner = self._owner_at(addr)
        if owner is not None and owner is not entry:
            return  # shared with a model found earlier: counted once, under its first name
        self._tagged[cache_key] = addr
        if addr:
            self._owner[addr] = (entry, weakref.ref(t))
        self._instr._native.register(t, category, self._instr.label(label), weak)

    def _collection(self, f: Found) -> bool:
        """A list, tuple or dict of tensors: a copy of a listed model's weights when its tensors
        are shaped exactly like the model's parameters (a list or tuple, in their order) or
        named like its parameters and buffers (a dict: ``{k: v.clone() for k, v in
        model.state_dict().items()}``), and are copies: neither the model's tensors themselves,
        views of them (``model.state_dict()``), nor their gradients."""
        value = f.value
        n = len(value)
        known = self._collections.get(id(value))
        if known is not None and known[0] == n:
            return False
        if n < 2 or not any(len(e.shapes) == n or type(value) is dict for e in self.entries):
            return False  # a batch (x, y), a single tensor in a list: no model has that many
        if len(self._collections) > 4096:
            self._collections.clear()  # transient lists of past steps
        self._collections[id(value)] = (n, None)
        for entry in list(self.entries):
            module = entry.module()
            if module is None:
                continue
            shapes, buffer_shapes = entry.shapes, entry.buffer_shapes
            if type(value) is dict:
                pairs = list(value.items())
                if any(type(k) is not str or (k not in shapes and k not in buffer_shapes)
                       for k, _ in pairs) or not any(k in shapes for k, _ in pairs):
                    continue
            else:
                if n != len(shapes):
                    continue
                pairs = list(zip(shapes.keys(), value))
            if not all(type(v) is torch.Tensor and v.shape == (shapes.get(k) or buffer_shapes[k])
                       for k, v in pairs):
                continue
            params = dict(module.named_parameters(remove_duplicate=True))
            own = {**dict(module.named_buffers(remove_duplicate=True)), **params}
            if any((k in params and v is params[k].grad) or _address(v) == _address(own[k])
                   for k, v in pairs):
                continue  # the model's gradients, or views of its own tensors
            if self._full():
                return False
            holder = f.holder
            name = f.holder_name or f.name
            copy = ModelEntry(self._unique(name), type(holder if holder is not None else value).__name__,
                              "collection", None, "", _weak(holder), copy_of=entry)
            copy.prefix = f"{copy.name}: "
            self._collections[id(value)] = (n, copy)
            self.entries.append(copy)
            for k, v in pairs:
                category = "parameter" if k in shapes else "buffer"
                frozen = " (frozen)" if category == "parameter" and not v.requires_grad else ""
                # weakly: a list of kept gradients, tagged `gradient` already, stays gradient
                self._register(copy, f"{category[0]}:{k}", v, category, f"{copy.prefix}{k}{frozen}",
                               weak=True)
            copy.description = _describe(copy, [v for k, v in pairs if k in shapes],
                                         [v for k, v in pairs if k not in shapes])
            copy.description["copy_of"] = entry.name
            return True
        return False

    # ------------------------------------------------------------------------- queries
    def trainable_parameters(self) -> list[torch.Tensor]:
        """The trainable parameters of every live model (whose gradients are watched)."""
        out, seen = [], set()
        for e in self.entries:
            module = e.module()
            if module is None:
                continue
            for p in module.parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def in_other_model(self, module: torch.nn.Module) -> bool:
        """Whether ``module`` is (in) a listed model other than the root (a teacher, or the
        encoder of a frozen VAE whose ``encode`` calls it)."""
        entry = self._members.get(module)
        return entry is not None and bool(entry.prefix)

    def module_name(self, module: torch.nn.Module) -> str | None:
        """``<model>: <path>`` of a module inside a listed model (the model's own name for the
        model itself), or None."""
        entry = self._members.get(module)
        root = entry.module() if entry is not None else None
        if root is None:
            return None
        if entry.paths is None:
            entry.paths = {id(m): path for path, m in root.named_modules()}
        path = entry.paths.get(id(module))
        if path is None:
            return None
        if not entry.prefix:
            return path or entry.name
        return f"{entry.prefix}{path}" if path else entry.name

    def describe(self) -> list[dict[str, Any]]:
        return [e.description for e in self.entries]

    # ------------------------------------------------------------------------- hooks
    def install(self, guard: Callable[[Callable[..., Any]], Callable[..., Any]]) -> list[Any]:
        """PyTorch's global registration hooks (construction, assign) and wrappers around
        ``Module.__setstate__`` (deepcopy, unpickling) and ``Module._apply`` (.to(), to_empty()).
        Returns the hooks' handles (removed by ``remove``)."""
        if not self.enabled:
            return []
        mm = torch.nn.modules.module
        on_tensor = guard(self._on_registered)
        on_module = guard(self._on_module_registered)
        made = guard(self._on_made)
        applied = guard(self._on_applied)

        def tensor_hook(module: torch.nn.Module, name: str, value: Any) -> None:
            if value is not None:
                on_tensor(module)

        def module_hook(module: torch.nn.Module, name: str, value: Any) -> None:
            if value is not None:
                on_module(module)
        self._handles = [mm.register_module_parameter_registration_hook(tensor_hook),
                         mm.register_module_buffer_registration_hook(tensor_hook),
                         mm.register_module_module_registration_hook(module_hook)]
        Module = torch.nn.Module
        setstate, apply = Module.__setstate__, Module._apply

        def __setstate__(self: torch.nn.Module, state: dict) -> None:
            setstate(self, state)
            made(self, sys._getframe(1))

        def _apply(self: torch.nn.Module, fn: Any, recurse: bool = True) -> Any:
            out = apply(self, fn, recurse)
            applied(self)
            return out
        # under torch.compile: hooks run as plain Python, wrappers are seen as the originals
        _compile.run_as_python(tensor_hook, module_hook)
        Module.__setstate__ = _compile.transparent(setstate, __setstate__)  # type: ignore[method-assign]
        Module._apply = _compile.transparent(apply, _apply)  # type: ignore[method-assign]

        def restore() -> None:
            Module.__setstate__ = setstate  # type: ignore[method-assign]
            Module._apply = apply  # type: ignore[method-assign]
        self._restore.append(restore)
        return list(self._handles)

    def remove(self) -> None:
        remove_all(self._handles, self._restore)

    def _on_made(self, module: torch.nn.Module, frame: Any) -> None:
        if module not in self._created:
            self._created[module] = self._scanner.creation_site(frame)
            self._made = True

    def _on_registered(self, module: torch.nn.Module) -> None:
        entry = self._members.get(module)
        if entry is not None:
            if entry not in self._changed:
                self._changed.append(entry)
        else:
            self._on_made(module, sys._getframe(1))

    def _on_module_registered(self, module: torch.nn.Module) -> None:
        self._on_registered(module)

    def _on_applied(self, module: torch.nn.Module) -> None:
        entry = self._members.get(module)
        if entry is not None and entry not in self._changed:
            self._changed.append(entry)


def _address(t: torch.Tensor) -> int:
    """The address of a tensor's storage block (0 for storages without data: fake, meta)."""
    if not isinstance(t, torch.Tensor) or t.device.type not in ("cpu", "cuda"):
        return 0
    return t.untyped_storage().data_ptr()


def _holds_tensors(module: torch.nn.Module) -> bool:
    for _ in module.parameters():
        return True
    for _ in module.buffers():
        return True
    return False


def _count_modules(module: torch.nn.Module) -> int:
    return sum(1 for _ in module.modules())


def _weak(obj: Any) -> Any:
    if obj is None:
        return None
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def _nbytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's elements (this rank's shard of a DTensor); 0 on the meta device,
    where nothing is allocated (a model built there before ``to_empty``)."""
    from ._model_info import storage_bytes
    return 0 if t.device.type == "meta" else storage_bytes(t)


def _describe(entry: ModelEntry, params: list[torch.Tensor], buffers: list[torch.Tensor]) -> dict[str, Any]:
    from .distributed._tensors import local_tensor
    trainable = [p for p in params if p.requires_grad]
    dtypes = Counter(str(p.dtype).replace("torch.", "") for p in params)
    return {
        "name": entry.name,
        "class": entry.cls,
        "found": entry.found,
        "created_at": entry.created_at,
        "label_prefix": entry.prefix,
        "trainable": bool(trainable),
        "parameters": sum(local_tensor(p).numel() for p in params),
        "parameter_tensors": len(params),
        "trainable_parameters": sum(local_tensor(p).numel() for p in trainable),
        "parameter_bytes": sum(_nbytes(p) for p in params),
        "trainable_parameter_bytes": sum(_nbytes(p) for p in trainable),
        "buffers": len(buffers),
        "buffer_bytes": sum(_nbytes(b) for b in buffers),
        "dtypes": {k: dtypes[k] for k in sorted(dtypes)},
        "devices": sorted({str(p.device) for p in params}),
        "copy_of": None,
    }
