"""``argnums=`` and ``has_aux=`` of the transforms: which of f's positional arguments are
differentiated, and f's auxiliary output (JAX's and torch.func's spellings and meanings).

A transform called with ``argnums`` other than 0, or with ``has_aux=True``, goes through a
``Selection``: the point is the argument ``argnums`` names (an int), or the tuple of the
arguments a tuple names (always a container of them, so ``argnums=(0, 1)`` of two
numbers gives a tuple of two gradients, not one array of two); f is called through
``on_point(x)``, which puts ``x`` back among the other positional arguments (passed
through untouched: numbers, arrays, any object) and, with ``has_aux``, keeps f's second
output aside. That aux comes back as a value of the levels *around* the transform: its
own level's derivative parts are dropped (Records of its own list read as numbers, the
tangent of its own forward level left off), the outer levels' kept, so nesting works
as for the primal output.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from easyad import _levels, _trees
from easyad._core import Record, Trace
from easyad._evaluation import _depth, _detached, _name, _split_top, _value
from easyad.tensor import Tensor, TraceTensor

ArgNums = int | tuple[int, ...]
_MISSING = object()


def check_argnums(argnums: Any, caller: str) -> ArgNums:
    """``argnums`` as given, checked at the transform's creation: an int or a non-empty
    tuple of distinct ints (ranges are checked at each call, when the arguments are
    known)."""
    if _is_index(argnums):
        return int(argnums)
    if isinstance(argnums, tuple) and argnums and all(_is_index(a) for a in argnums):
        if len(set(argnums)) != len(argnums):
            raise ValueError(f"{caller}: argnums={argnums!r} names an argument twice; "
                             f"name each positional argument at most once")
        return tuple(int(a) for a in argnums)
    raise TypeError(f"{caller}: argnums must be an int or a non-empty tuple of ints (the "
                    f"positions of f's arguments to differentiate), got {argnums!r}")


def _is_index(a: Any) -> bool:
    return isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_))


def plain(argnums: ArgNums, has_aux: bool) -> bool:
    """Whether a call needs no Selection (the first argument, no aux: the fast path)."""
    return argnums == 0 and not has_aux and type(argnums) is int


class Selection:
    """One call of a transform with argnums/has_aux (see the module's docstring)."""

    def __init__(self, f: Callable[..., Any], argnums: ArgNums, has_aux: bool,
                 positional: tuple[Any, ...], caller: str) -> None:
        count = len(positional)
        wanted = (argnums,) if isinstance(argnums, int) else argnums
        indices = []
        for a in wanted:
            if not -count <= a < count:
                raise ValueError(
                    f"{caller}: argnums={argnums!r} is out of range: {_name(f)} was given "
                    f"{count} positional argument{'s' * (count != 1)}, so argnums must lie "
                    f"in [{-count}, {count - 1}]")
            indices.append(a % count)
        if len(set(indices)) != len(indices):
            raise ValueError(f"{caller}: argnums={argnums!r} names the same one of the "
                             f"{count} arguments twice (a negative and a positive index)")
        self.f, self.has_aux, self.caller = f, has_aux, caller
        self.positional = positional
        self.indices = indices
        self.single = isinstance(argnums, int)
        self.point: Any = (positional[indices[0]] if self.single
                           else _trees.Arguments(positional[i] for i in indices))
        self.outside = _levels.LEVEL.get()     # the levels open around the transform
        self.inside = self.outside
        self._aux: Any = _MISSING

    def function(self) -> Callable[..., Any]:
        """f of the point alone (the other arguments put back where they were)."""
        def on_point(x: Any, *unused: Any) -> Any:
            full = list(self.positional)
            if self.single:
                full[self.indices[0]] = x
            else:
                for i, v in zip(self.indices, x):
                    full[i] = v
            result = self.f(*full)
            if not self.has_aux:
                return result
            if not (isinstance(result, (tuple, list)) and len(result) == 2):
                got = (f"a {type(result).__name__} of {len(result)}"
                       if isinstance(result, (tuple, list)) else type(result).__name__)
                raise TypeError(f"{self.caller}(..., has_aux=True) needs {_name(self.f)} to "
                                f"return a pair (output, aux), got {got}; return "
                                f"(out, aux), or drop has_aux=True")
            self.inside = _levels.LEVEL.get()      # the transform's own level
            self._aux = result[1]
            return result[0]
        on_point.__name__ = _name(self.f)
        on_point.__qualname__ = on_point.__name__
        return on_point

    def result(self, x: Any) -> Any:
        """A transform's result for the caller: the point's tuples plain tuples at the
        top level; inside another transform they stay ``Arguments``, so that one sees a
        tuple of gradients as a container of them (a plain tuple of scalar Records would
        be one array)."""
        if self.single or self.outside != (0, None):
            return x
        return _trees.plain_tuples(x)

    def direction(self, v: Any, what: str) -> Any:
        """A direction (jvp's v) for the point: a tuple of them for tuple argnums."""
        if self.single:
            return v
        if not isinstance(v, (tuple, list)) or len(v) != len(self.indices):
            raise ValueError(f"{self.caller}: with argnums={tuple(self.indices)!r}, {what} "
                             f"must be a tuple of {len(self.indices)} directions, one per "
                             f"differentiated argument")
        return _trees.Arguments(v)

    def aux(self) -> Any:
        """f's aux as a value of the levels around the transform (not differentiated by
        it)."""
        if self._aux is _MISSING:      # f was never called (no evaluation needed it)
            return None
        return _undifferentiated(self._aux, self.inside, self.outside)


def _undifferentiated(v: Any, inside: tuple[int, Any], outside: tuple[int, Any]) -> Any:
    if isinstance(v, dict):
        return {k: _undifferentiated(e, inside, outside) for k, e in v.items()}
    if isinstance(v, (tuple, list)):
        items = [_undifferentiated(e, inside, outside) for e in v]
        if isinstance(v, tuple) and hasattr(v, "_fields"):      # a namedtuple
            return type(v)(*items)
        return type(v)(items)
    if not (isinstance(v, (Record, Trace, Tensor, TraceTensor))
            or isinstance(v, np.ndarray) and v.dtype == object):
        return v         # numbers, arrays, any other object: as they are
    depth_in, tape_in = inside
    depth_out, tape_out = outside
    if depth_in > depth_out and _depth(v) >= depth_in:
        v = _split_top(v, depth_in)[0]      # the transform's own forward level left off
    if tape_in is not None and tape_in is not tape_out:
        v = _detached(v)                    # Records of its own list read as numbers
    if depth_out == 0 and tape_out is None:     # no transform around: plain numbers
        if isinstance(v, Tensor):
            return np.array(v.value)
        v = _value(v) if isinstance(v, (Record, Trace, TraceTensor, np.ndarray)) else v
    return v
