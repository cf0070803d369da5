"""Data a DataLoader's dataset holds, and the batches it yields: the ``input`` category
(docs/categories.md).

A dataset made before training (a ``TensorDataset`` of the whole training set, a dataset class
that keeps its tokens in one tensor) is live for the whole run, and no training-loop signal
names it: the root module only ever sees the batches cut from it. When a DataLoader starts
iterating during a session, the tensors its dataset holds are registered as ``input``: a block
allocated while tracking is tagged from its allocation on, and one allocated before the session
is adopted (counted from then on, like the model's parameters).

What counts as "held": ``TensorDataset.tensors``; the datasets inside a ``Subset`` or a
``ConcatDataset``; and, for any other dataset, the tensors among its attributes, directly or one
level down in a list, tuple or dict (``self.ids = torch.randint(...)``,
``self.columns = {"input_ids": ...}``). The scan is bounded (``MAX_TENSORS`` per dataset,
``MAX_ITEMS`` objects looked at) so a dataset of a million small tensors costs a bounded moment
when its first epoch starts; what lies beyond the bound stays ``unknown``. Each dataset is
scanned once per session."""
from __future__ import annotations

import weakref
from typing import Any, Iterator

import torch

MAX_TENSORS = 4096  # tensors registered per dataset
MAX_ITEMS = 16384   # objects looked at per dataset (attributes, list items, nested datasets)


def dataset_tensors(dataset: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(label, tensor) for each tensor the dataset holds, each storage once, within the bounds."""
    seen_storages: set[tuple[str, int]] = set()
    budget = [MAX_ITEMS]
    found = 0
    for label, t in _walk(dataset, type(dataset).__name__, 0, set(), budget):
        if t.layout != torch.strided or t.device.type not in ("cpu", "cuda"):
            continue
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if storage.nbytes() == 0 or key in seen_storages:
            continue
        seen_storages.add(key)
        yield label, t
        found += 1
        if found >= MAX_TENSORS:
            return


def _walk(obj: Any, label: str, depth: int, seen: set[int],
          budget: list[int]) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors in ``obj``. ``depth`` counts containers below the nearest dataset: a dataset's
    attributes are depth 1, the items of a list or dict among them depth 2 (the last looked at);
    a dataset found anywhere is scanned as a dataset of its own."""
    if budget[0] <= 0 or id(obj) in seen:
        return
    budget[0] -= 1
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield label, obj
        return
    if isinstance(obj, torch.utils.data.TensorDataset):
        children: Any = ((f"{label}.tensors[{i}]", t) for i, t in enumerate(obj.tensors))
        depth = 0
    elif isinstance(obj, torch.utils.data.Subset):
        children = iter([(f"{label}.dataset", obj.dataset)])
        depth = 0
    elif isinstance(obj, torch.utils.data.ConcatDataset):
        children = ((f"{label}.datasets[{i}]", d) for i, d in enumerate(obj.datasets))
        depth = 0
    elif isinstance(obj, dict) and depth < 2:
        children = ((f"{label}[{k!r}]", v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)) and depth < 2:
        children = ((f"{label}[{i}]", v) for i, v in enumerate(obj))
    elif depth == 0 or isinstance(obj, torch.utils.data.Dataset):
        attrs = getattr(obj, "__dict__", None)
        if not isinstance(attrs, dict):
            return
        children = ((f"{label}.{k}", v) for k, v in list(attrs.items()))
        depth = 0
    else:
        return
    for sub_label, value in children:
        if budget[0] <= 0:
            return
        if isinstance(value, (torch.Tensor, dict, list, tuple, torch.utils.data.Dataset)):
            yield from _walk(value, sub_label, depth + 1, seen, budget)


class DatasetRegistrar:
    """Registers the tensors of each DataLoader's dataset as ``input`` when it starts iterating.
    Owned by an ``Instrumentation``; ``install`` patches ``DataLoader.__iter__`` (restored with
    the instrumentation's other patches)."""

    def __init__(self, instr: Any) -> None:
        self._instr = instr
        # id(dataset) -> a weak reference to it (None where it takes none: a list), so that a
        # dataset made later at a recycled address is scanned, and none is kept alive here
        self._done: dict[int, Any] = {}

    def register(self, dataset: Any) -> int:
        """Registers what ``dataset`` holds (once per session); returns the tensors tagged."""
        if dataset is None:
            return 0
        seen = self._done.get(id(dataset), False)
        if seen is None or (seen is not False and seen() is dataset):
            return 0
        try:
            self._done[id(dataset)] = weakref.ref(dataset)
        except TypeError:
            self._done[id(dataset)] = None
        native, label = self._instr._native, self._instr.label
        count = 0
        for name, t in dataset_tensors(dataset):
            native.register(t, "input", label(f"dataset {name}"))
            count += 1
        return count

    def tag_batch(self, batch: Any) -> None:
        """Tags the tensors of a batch a framework hands its step as ``input`` (weakly, as the
        root module's arguments are): also when the step calls a submodule, not the root."""
        from torch.utils._pytree import tree_leaves

        leaves = tree_leaves(batch)
        label = self._instr.label("input")
        for t in leaves:
            if isinstance(t, torch.Tensor):
                self._instr._native.tag(t, "input", label, True)

    def install(self) -> None:
        registrar = self
        guarded = self._instr._guard(lambda loader: registrar.register(loader.dataset))

        def make(original: Any) -> Any:
            def __iter__(loader: Any) -> Any:
                guarded(loader)
                return original(loader)
            __iter__.__wrapped__ = original  # type: ignore[attr-defined]
            return __iter__

        self._instr._patch(torch.utils.data.DataLoader, "__iter__", make)

        # Each batch a DataLoader yields is input from its collation on, also when it is held
        # ahead of its step (accelerate's DataLoaderShard fetches the next batch first) or only
        # reaches the model through other tensors (a diffusion step's noised images).
        tag = self._instr._guard(self.tag_batch)

        def make_next(original: Any) -> Any:
            def __next__(it: Any) -> Any:
                batch = original(it)
                tag(batch)
                return batch
            from . import _compile
            return _compile.transparent(original, __next__)

        self._instr._patch(torch.utils.data.dataloader._BaseDataLoaderIter, "__next__", make_next)
