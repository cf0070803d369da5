"""Where a training script keeps its models: the variables of its frames, and where a module was
made (docs/categories.md, "Parameters of every model").

``FrameScanner.scan`` looks at the frames on the calling thread's stack that are not library
code (torch's, ridgescope's, the standard library's): their local variables, and the globals
of the script's own files. It returns every ``torch.nn.Module`` it finds with the name it is
bound to — a variable (``ref_model``), one level into a plain object's attributes (a trainer's
``self.ref_model``, ``ema.module``), or an element of a list or dict (``models[1]``) — and the
lists, tuples and dicts of tensors it meets (which may be a copy of a model's weights, as
diffusers' ``EMAModel.shadow_params`` is). ``creation_site`` says which line of the script made
a module (``train.py:9``).

The locals of a function's frame are read without ``frame.f_locals``: on Python 3.11 and 3.12
that makes a snapshot the frame keeps until it returns, which would keep tensors alive that the
script has dropped, and change the memory being measured. ``_C.frame_locals`` reads them in
place (csrc/torch_python/python_locals.h); on 3.13 ``f_locals`` is a view without a snapshot. Where
neither is available, only module globals are read (and ``locals_status`` says why).

The scan is bounded (frames, names per frame, attributes per object, elements per list) and
classifies each type once, so a step-end scan costs a few microseconds; it never calls code of
the objects it looks at (no ``getattr`` hooks, no ``isinstance`` through ``__class__``)."""
from __future__ import annotations

import os
import sys
import types
from typing import Any, Iterator

import torch

from . import _C

MAX_FRAMES = 24        # frames of user code looked at per scan
MAX_NAMES = 512        # variables per frame namespace
MAX_ATTRIBUTES = 128   # attributes of one plain object
MAX_ELEMENTS = 64      # elements of a list, tuple or dict looked at for modules

# What a value's type is, decided once per type.
_SKIP, _MODULE, _TENSOR, _SEQ, _DICT, _OBJECT = range(6)
_NOT_OBJECTS = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                types.MethodType, types.CodeType, types.FrameType, types.GeneratorType,
                types.CoroutineType, types.AsyncGeneratorType, property, staticmethod,
                classmethod, BaseException)

# Code classes: library code (not looked at), a package's code (site-packages: its locals are
# read), the script's own code (its locals and its module's globals are read).
_LIBRARY, _PACKAGE, _SCRIPT = range(3)
_CONSTRUCTION = frozenset({"__init__", "__new__", "__setstate__", "__deepcopy__", "inner_init"})


class Found:
    """One thing a scan found: ``value`` bound to ``name``; ``holder`` the plain object whose
    attribute it is (None for a variable), ``holder_name`` that object's variable."""
    __slots__ = ("value", "name", "how", "holder", "holder_name")

    def __init__(self, value: Any, name: str, how: str, holder: Any = None,
                 holder_name: str | None = None) -> None:
        self.value, self.name, self.how = value, name, how
        self.holder, self.holder_name = holder, holder_name


class FrameScanner:
    def __init__(self, library_roots: list[str], stdlib_roots: list[str]) -> None:
        self._library = tuple(library_roots)
        self._stdlib = tuple(stdlib_roots)
        self._code_class: dict[int, tuple[Any, int]] = {}
        self._kinds: dict[type, int] = {}
        self.locals_status = ""
        self._read_locals = self._choose_locals_reader()

    # ------------------------------------------------------------------------- frames
    def _choose_locals_reader(self) -> Any:
        if sys.version_info >= (3, 13):
            return lambda frame: frame.f_locals.items()  # a view (PEP 667): no snapshot
        reason = _C.frame_locals_status()
        if reason:
            self.locals_status = reason
            return None
        # The mirrored frame layout must read a known frame right before it is trusted.
        if not _check_frame_locals():
            self.locals_status = "the frame locals reader disagrees with the interpreter"
            return None
        return _C.frame_locals

    def _class_of(self, code: Any) -> int:
        # by id: a code object's hash covers its constants, which may be unhashable (a slice);
        # the code object is kept in the entry so that its id is not reused
        known = self._code_class.get(id(code))
        cls = known[1] if known is not None and known[0] is code else None
        if cls is None:
            file = code.co_filename
            if file.startswith(("<frozen ", "<eval_with_key>")) or file.startswith(self._library):
                cls = _LIBRARY
            elif "/site-packages/" in file or "/dist-packages/" in file:
                cls = _PACKAGE
            elif file.startswith(self._stdlib):
                cls = _LIBRARY
            else:
                cls = _SCRIPT
            self._code_class[id(code)] = (code, cls)
        return cls

    def user_frames(self, frame: Any) -> Iterator[tuple[Any, int]]:
        """The frames of user code from ``frame`` outwards, with their code class."""
        n = 0
        while frame is not None and n < MAX_FRAMES:
            cls = self._class_of(frame.f_code)
            if cls != _LIBRARY:
                n += 1
                yield frame, cls
            frame = frame.f_back

    def creation_site(self, frame: Any) -> str | None:
        """The line that made the module being built under ``frame``: the first frame of the
        script's own code that is not a constructor, else of a package's code."""
        fallback = None
        while frame is not None:
            code = frame.f_code
            cls = self._class_of(code)
            if cls != _LIBRARY and code.co_name not in _CONSTRUCTION:
                site = f"{os.path.basename(code.co_filename)}:{frame.f_lineno}"
                if cls == _SCRIPT:
                    return site
                fallback = fallback or site
            frame = frame.f_back
        return fallback

    # ------------------------------------------------------------------------- values
    def _kind(self, t: type) -> int:
        k = self._kinds.get(t)
        if k is None:
            if issubclass(t, torch.nn.Module):
                k = _MODULE
            elif issubclass(t, torch.Tensor):
                k = _TENSOR
            elif t is list or t is tuple:
                k = _SEQ
            elif t is dict:
                k = _DICT
            elif issubclass(t, _NOT_OBJECTS) or t.__module__ == "builtins" or not t.__dictoffset__:
                k = _SKIP
            else:
                k = _OBJECT
            self._kinds[t] = k
        return k

    def scan(self, frame: Any) -> list[Found]:
        """Modules and tensor collections held by the user's frames from ``frame`` outwards:
        variables first (innermost frame first), then attributes of plain objects and elements
        of lists and dicts. Each object once, under the first name found."""
        direct: list[Found] = []
        objects: list[tuple[str, Any]] = []
        containers: list[tuple[str, Any]] = []
        seen_globals: set[int] = set()
        kinds, kind = self._kinds, self._kind
        read_locals = self._read_locals
        for f, cls in self.user_frames(frame):
            spaces = []
            if f.f_code.co_flags & 0x02:  # CO_NEWLOCALS: a function's frame
                if read_locals is not None:
                    spaces.append(read_locals(f))
            if cls == _SCRIPT and id(f.f_globals) not in seen_globals:
                seen_globals.add(id(f.f_globals))
                spaces.append(f.f_globals.items())
            for items in spaces:
                for i, (name, value) in enumerate(items):
                    if i >= MAX_NAMES:
                        break
                    t = type(value)
                    k = kinds.get(t)
                    if k is None:
                        k = kind(t)
                    if k == _SKIP or k == _TENSOR or name[:2] == "__":  # __builtins__, __spec__
                        continue
                    if k == _MODULE:
                        direct.append(Found(value, name, "variable"))
                    elif k == _OBJECT:
                        objects.append((name, value))
                    else:
                        containers.append((name, value))
        out = direct
        for name, obj in objects:
            try:
                attrs = object.__getattribute__(obj, "__dict__")
            except Exception:
                continue
            if type(attrs) is not dict:
                continue
            for i, (attr, value) in enumerate(attrs.items()):
                if i >= MAX_ATTRIBUTES:
                    break
                k = kind(type(value))
                if k == _MODULE:
                    out.append(Found(value, attr, "attribute", obj, name))
                elif k == _SEQ or k == _DICT:
                    self._container(value, attr, out, obj, name)
        for name, value in containers:
            self._container(value, name, out, None, None)
        return out

    def _container(self, value: Any, name: str, out: list[Found], holder: Any,
                   holder_name: str | None) -> None:
        """A list, tuple or dict: the modules in it (``name[i]``), or the collection itself when
        it holds tensors (a candidate copy of a model's weights)."""
        if not value:
            return
        kind = self._kind
        if type(value) is dict:
            items = value.items()
        else:
            items = enumerate(value)
        for i, (key, v) in enumerate(items):
            if i >= MAX_ELEMENTS:
                break
            k = kind(type(v))
            if k == _TENSOR:
                if i == 0:
                    out.append(Found(value, name, "collection", holder, holder_name))
                return
            if k == _MODULE:
                out.append(Found(v, f"{name}[{key!r}]" if type(key) is str else f"{name}[{key}]",
                                 "element", holder, holder_name))
            elif i == 0:
                return  # neither modules nor tensors


def _check_frame_locals() -> bool:
    """Whether ``_C.frame_locals`` reads a frame whose locals are known."""
    marker_a, marker_b = object(), object()

    def probe(alpha: Any, beta: Any) -> Any:
        gamma = [alpha]

        def inner() -> Any:
            return gamma
        return _C.frame_locals(sys._getframe()), inner
    try:
        pairs, inner = probe(marker_a, marker_b)
    except Exception:
        return False
    if pairs is None:
        return False
    got = dict(pairs)
    return (got.get("alpha") is marker_a and got.get("beta") is marker_b
            and type(got.get("gamma")) is list and got["gamma"][0] is marker_a
            and got.get("inner") is inner)
