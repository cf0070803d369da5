"""The leaves of a pytree, as ``torch.utils._pytree.tree_leaves`` gives them.

The root module's inputs and output and the loss are read every step (docs/phases.md); their
usual shapes (a tensor, a flat tuple or list of tensors and numbers) are taken here without
pytree's generic walk, which costs about 50 bytecodes a leaf (docs/performance.md). Anything
else (dicts, namedtuples, ``None``, nested or registered containers) goes to torch's.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves

# Types that are always leaves: never a pytree node, whatever the script registers. None is not
# one (pytree gives it no leaves).
_LEAF_TYPES = frozenset({torch.Tensor, torch.nn.Parameter, int, float, bool, str})


def leaves(tree: Any) -> list[Any]:
    kind = type(tree)
    if kind in _LEAF_TYPES:
        return [tree]
    if (kind is tuple or kind is list) and all(type(x) in _LEAF_TYPES for x in tree):
        return list(tree)
    return tree_leaves(tree)
