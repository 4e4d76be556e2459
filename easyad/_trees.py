"""Structures of arrays: what the transforms take and give back.

A structure is a leaf or a tuple, list or dict of structures (nested). A leaf is one
array of reals: a number, an ndarray, a Tensor, a TraceTensor, a Record or Trace, or a
list or tuple of numbers (rectangular, any depth: ``[1.0, 2.0]`` is ONE 1-D leaf, as
scipy reads ``x0``). A list or tuple holding anything else (arrays, dicts...) is a
container of its items. Dicts are always containers (keys kept in their order).

``flatten`` gives the leaves in order and a ``TreeDef`` that rebuilds the same structure
around other leaves (``unflatten``): gradients have their inputs' structure, Jacobians
the outputs' structure around the inputs'.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from easyad._core import Record, Trace
from easyad.tensor import Tensor, TraceTensor

_NUMBERS = (int, float, np.integer, np.floating, np.bool_)
_SCALARS = (Record, Trace) + _NUMBERS


@dataclass(frozen=True)
class TreeDef:
    """The shape of a structure: ``kind`` is "leaf", "tuple", "list", "dict" or
    "arguments" (an ``Arguments`` tuple, rebuilt as one so it stays a container);
    ``children`` the sub-structures; ``keys`` a dict's keys."""

    kind: str
    children: tuple["TreeDef", ...] = ()
    keys: tuple[Any, ...] = ()

    @property
    def is_leaf(self) -> bool:
        return self.kind == "leaf"

    @property
    def leaf_count(self) -> int:
        if self.is_leaf:
            return 1
        return sum(c.leaf_count for c in self.children)

    def describe(self) -> str:
        if self.is_leaf:
            return "an array"
        if self.kind == "dict":
            return "a dict with keys " + ", ".join(map(repr, self.keys))
        kind = "tuple" if self.kind == "arguments" else self.kind
        return f"a {kind} of {len(self.children)}"


LEAF = TreeDef("leaf")


class Arguments(tuple):  # type: ignore[type-arg]
    """The positional arguments a transform differentiates (``argnums`` a tuple): always
    a container of them, even when they are all numbers (a plain tuple of numbers would
    be one array)."""

    __slots__ = ()


def _is_sequence_leaf(x: list[Any] | tuple[Any, ...]) -> bool:
    """A list or tuple of numbers (nested, rectangular), or of scalar Records/Traces."""
    for item in x:
        if isinstance(item, (list, tuple)):
            if not _is_sequence_leaf(item):
                return False
        elif not isinstance(item, _SCALARS):
            if not (isinstance(item, np.ndarray) and item.ndim == 0):
                return False
    return True


def flatten(x: Any) -> tuple[list[Any], TreeDef]:
    if type(x) is np.ndarray:          # the common case: one array
        return [x], LEAF
    leaves: list[Any] = []
    return leaves, _visit(x, leaves)


# module-level recursion, not closures: a closure that calls itself is a reference cycle,
# garbage left to the cyclic collector on every call of a transform
def _visit(v: Any, leaves: list[Any]) -> TreeDef:
    if isinstance(v, dict):
        keys = tuple(v)
        return TreeDef("dict", tuple(_visit(v[k], leaves) for k in keys), keys)
    if type(v) is Arguments or isinstance(v, (list, tuple)) and not _is_sequence_leaf(v):
        kind = ("arguments" if type(v) is Arguments else "tuple" if isinstance(v, tuple)
                else "list")
        return TreeDef(kind, tuple(_visit(item, leaves) for item in v))
    leaves.append(v)
    return LEAF


def unflatten(tree: TreeDef, leaves: list[Any]) -> Any:
    if tree.is_leaf:
        return leaves[0]
    return _build(tree, iter(leaves))


def _build(t: TreeDef, items: Any) -> Any:
    if t.is_leaf:
        return next(items)
    built = [_build(c, items) for c in t.children]
    if t.kind == "dict":
        return dict(zip(t.keys, built))
    if t.kind == "arguments":
        return Arguments(built)
    return tuple(built) if t.kind == "tuple" else built


def plain_tuples(x: Any) -> Any:
    """``x`` with every ``Arguments`` in its structure made a plain tuple (a result for
    the caller)."""
    if isinstance(x, dict):
        return {k: plain_tuples(v) for k, v in x.items()}
    if type(x) is Arguments or type(x) is tuple:
        return tuple(plain_tuples(v) for v in x)
    if type(x) is list:
        return [plain_tuples(v) for v in x]
    return x


def paths(tree: TreeDef, root: str) -> list[str]:
    """A name for each leaf, for error messages: ``x0['W'][1]``."""
    out: list[str] = []
    _name_leaves(tree, root, out)
    return out


def _name_leaves(t: TreeDef, name: str, out: list[str]) -> None:
    if t.is_leaf:
        out.append(name)
    elif t.kind == "dict":
        for k, c in zip(t.keys, t.children):
            _name_leaves(c, f"{name}[{k!r}]", out)
    else:
        for i, c in enumerate(t.children):
            _name_leaves(c, f"{name}[{i}]", out)


def map_leaves(function: Callable[[Any], Any], x: Any) -> Any:
    leaves, tree = flatten(x)
    return unflatten(tree, [function(v) for v in leaves])


def is_recorded(v: Any) -> bool:
    """Whether a leaf is already on a tape (a transform inside another one)."""
    if isinstance(v, Tensor):
        return v.tape is not None
    if type(v) is Record:
        return v.tape is not None
    if isinstance(v, np.ndarray) and v.dtype == object:
        return any(is_recorded(e) for e in v.reshape(-1))
    return False


def is_traced(v: Any) -> bool:
    """Whether a leaf carries a tangent (a transform inside a forward one)."""
    if isinstance(v, (TraceTensor, Trace)):
        return True
    if isinstance(v, np.ndarray) and v.dtype == object:
        return any(isinstance(e, (Trace, TraceTensor)) for e in v.reshape(-1))
    return False
