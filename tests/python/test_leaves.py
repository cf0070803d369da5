"""Specification of ridgescope._leaves.leaves: the leaves of a pytree, as torch's own
``tree_leaves`` gives them (the truth), for the shapes a training step passes its root module
and its loss, and for the ones the fast path leaves to torch."""
from __future__ import annotations

import collections

import pytest
import torch
from torch.utils._pytree import tree_leaves

from ridgescope._leaves import leaves

Point = collections.namedtuple("Point", "x y")
t, u = torch.ones(2), torch.zeros(3)
p = torch.nn.Parameter(torch.ones(1))

SHAPES = {
    "a tensor": t,
    "a parameter": p,
    "a number": 3,
    "None": None,
    "an empty tuple": (),
    "a flat tuple of tensors and numbers": (t, 2, 0.5, True, "s", u),
    "a flat list": [t, u, p],
    "a tuple holding None": (t, None, u),
    "a nested tuple": (t, (u, [t])),
    "a dict": {"b": u, "a": t},
    "an empty dict": {},
    "a namedtuple": Point(t, u),
    "a tuple holding a namedtuple": (t, Point(u, 1)),
    "args and kwargs": ((t, 1), {"mask": u}),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_leaves_are_torchs_in_its_order(name):
    # Given a pytree of one of the shapes, When its leaves are taken
    tree = SHAPES[name]
    got, expected = leaves(tree), tree_leaves(tree)
    # Then they are torch's leaves, the same objects in the same order
    assert len(got) == len(expected)
    assert all(a is b for a, b in zip(got, expected))


def test_a_container_type_the_script_registers_is_walked_by_torch():
    # Given a tuple subclass registered as a pytree node by the script
    from torch.utils import _pytree

    class Pair(tuple):
        pass

    _pytree.register_pytree_node(Pair, lambda p: (list(p), None), lambda xs, _: Pair(xs))
    try:
        tree = (Pair((t, u)), 1)
        # When its leaves are taken, Then they are torch's (the pair's members, not the pair)
        assert [id(x) for x in leaves(tree)] == [id(x) for x in tree_leaves(tree)] == [id(t), id(u), id(1)]
    finally:
        _pytree._deregister_pytree_node(Pair)
