"""Per-example gradients of arguments that are the same in every example (the weights in
``ad.vmap(ad.grad(loss), in_axes=(None, 0, 0))``), without a copy per example.

The general path (``vmap_lift``) broadcasts such an argument W along the batch, one copy
per example (the MLP's first layer: 64 x 784 x 128 floats, copied, then read by 64
matrix-vector products), and differentiates by the copies. Here W stays one array and is
a constant of the recording; f sees a ``Shared``, a batched value whose examples are all
W. Where W first meets a batched value y (the frontier: ``x @ W``, ``z + b``,
``z * s``), the product is one ordinary operation on the whole batch, and a zero
*probe* P of the result's shape is added to it. The sweep then gives P's adjoint, the
result's cotangent g (batched: the examples are independent), and each example's
gradient of W is that operation's vjp of one example, for all examples at once: one
batched product ``x_bᵀ g_b`` for a matmul, g itself (reduced to W's shape) for a sum.
Everything else a Shared meets reads its ``_value``: the broadcast copy, made then as an
input of the sweep of its own (the general path's meaning), so no operation is refused
and every derivative is the general path's.

Used at the top level only (no other transform open, the numpy device, float64 arrays,
one vmap): elsewhere the general path runs. A transform opened inside f (a gradient
penalty's ``ad.grad``) also reads the copy: a probe's matmul takes W as a constant, right
for the first derivative, not for derivatives of it.
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from easyad import _levels, _trees
from easyad._argnums import _undifferentiated
from easyad._evaluation import _scalar_output
from easyad._reverse_mode import _input_tensor, _Reverse
from easyad.tensor import Tensor
from easyad.tensor._devices import resolve
from easyad.transforms.vmap_batched import Batched, with_units

_SLOT = Batched._value          # (Batched's slot: Shared reads it behind a property)
_SIGNS = {operator.add: (1.0, 1.0), operator.sub: (1.0, -1.0)}


def usable(v: Any) -> bool:
    """Whether the differentiated leaf ``v`` (not batched) can be a Shared: a float64
    array, at the top level, on the numpy device."""
    return (type(v) is np.ndarray and v.dtype == np.float64 and v.ndim > 0
            and _levels.LEVEL.get() == _levels.OUTSIDE and resolve(None).kind == "numpy")


class Frontier:
    """The probes and broadcast copies of one gradient, and what each adds to which
    Shared's per-example gradient."""

    def __init__(self) -> None:
        self.inputs: list[Any] = []        # (tensors on the sweep's list)
        self.parts: list[tuple[int, Callable[[np.ndarray], np.ndarray]]] = []
        # the level f runs at (the very object: a transform opened inside f sets a new
        # one, and there the probes' meaning would be lost: a matmul's vjp would take W
        # as a constant, so second derivatives through it would be wrong)
        self.level: Any = None
        self.closed = False

    def here(self) -> bool:
        """Whether f runs at this gradient's own level (no transform opened inside)."""
        return _levels.LEVEL.get() is self.level and not self.closed

    def input(self, array: np.ndarray, owner: "Shared",
              part: Callable[[np.ndarray], np.ndarray]) -> Any:
        if self.closed:
            raise NotImplementedError(
                "ad.grad inside ad.vmap: a weight not batched was first read during the "
                "backward sweep (by a function recomputed there, such as ad.checkpoint's), "
                "after the sweep's inputs were fixed; read it once before (e.g. w + 0.0)")
        t = _input_tensor(array, self.level[1], False)
        self.inputs.append(t)
        self.parts.append((id(owner), part))
        return t

    def gradients(self, shared: list["Shared"], swept: list[np.ndarray]) -> list[np.ndarray]:
        """Each Shared's per-example gradient, (batch, *its shape), from the inputs'
        adjoints in the sweep."""
        total: dict[int, Any] = {}
        for (owner, part), g in zip(self.parts, swept):
            d = part(g)
            total[owner] = d if owner not in total else total[owner] + d
        return [total[id(s)] if id(s) in total else np.zeros((s._size,) + s._array.shape)
                for s in shared]


class Shared(Batched):
    """A batched value whose examples are all one array (a differentiated argument not
    batched); its ``_value``, the broadcast copy, is made only where an operation reads
    it."""

    __slots__ = ("_array", "_frontier")
    _shared = True

    def __init__(self, array: np.ndarray, level: int, size: int, frontier: Frontier) -> None:
        self._array, self._frontier = array, frontier
        self._level, self._size = level, size

    @property  # type: ignore[override]
    def _value(self) -> Any:
        try:
            return _SLOT.__get__(self)
        except AttributeError:
            pass
        copy = np.ascontiguousarray(np.broadcast_to(self._array,
                                                    (self._size,) + self._array.shape))
        t = self._frontier.input(copy, self, _same)
        _SLOT.__set__(self, t)
        return t

    @property
    def shape(self) -> tuple[int, ...]:
        return self._array.shape

    @property
    def ndim(self) -> int:
        return self._array.ndim

    @property
    def dtype(self) -> Any:
        return self._array.dtype

    def _elementwise(self, function: Any, args: tuple[Any, ...]) -> Any:
        return _elementwise(self, function, args)

    def _matmul(self, a: Any, b: Any) -> Any:
        return _matmul(self, a, b)


def _same(g: np.ndarray) -> np.ndarray:
    return g


def _partner(s: Shared, other: Any) -> bool:
    """Whether ``other`` is a batched value of s's level (not another Shared) whose
    batch is an array or a tensor (not an outer vmap's batched value)."""
    return (isinstance(other, Batched) and not isinstance(other, Shared)
            and other._level == s._level
            and isinstance(other._value, (np.ndarray, Tensor)))


def _plain(v: Any) -> np.ndarray:
    return v if isinstance(v, np.ndarray) else np.asarray(v.value)


def _probed(s: Shared, y: Any, part: Callable[[np.ndarray], np.ndarray]) -> Any:
    """``y + P``, P a zero probe whose adjoint goes through ``part`` to s's gradient."""
    shape = tuple(np.shape(y)) if isinstance(y, np.ndarray) else tuple(y.shape)
    probe = s._frontier.input(np.zeros(shape), s, part)
    return y + probe


def _reduced(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A batched (B, *out) cotangent summed to (B, *shape): numpy's broadcast undone in
    each example."""
    lead = g.ndim - 1 - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(1, lead + 1)))
    axes = tuple(k + 1 for k, n in enumerate(shape) if n == 1 and g.shape[k + 1] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _elementwise(s: Shared, function: Any, args: tuple[Any, ...]) -> Any:
    """s + y, y + s, s - y, y - s, s * y, y * s for a batched y of s's level; other
    calls: NotImplemented (the caller reads s's broadcast copy)."""
    if len(args) != 2 or not (function in _SIGNS or function is operator.mul) or \
            not s._frontier.here():
        return NotImplemented
    first = args[0] is s
    other = args[1] if first else args[0]
    if not _partner(s, other):
        return NotImplemented
    ov = other._value
    rank = max(s.ndim, other.ndim)
    ov = with_units(ov, rank - other.ndim)
    w, shape = s._array, s._array.shape
    y = function(w, ov) if first else function(ov, w)
    if function is operator.mul:
        keep = _plain(ov)

        def part(g: np.ndarray) -> np.ndarray:
            return _reduced(g * keep, shape)
    else:
        sign = _SIGNS[function][0 if first else 1]

        def part(g: np.ndarray) -> np.ndarray:
            return _reduced(g if sign > 0 else -g, shape)
    return Batched(_probed(s, y, part), s._level, s._size)


def _matmul(s: Shared, a: Any, b: Any) -> Any:
    """y @ W (y batched, of any rank, W a matrix) and W @ v (v a vector per example):
    one product on the whole batch; each example's gradient of W one batched product."""
    w = s._array
    size = s._size
    if w.ndim != 2 or not s._frontier.here():
        return NotImplemented
    if b is s and _partner(s, a) and a.ndim >= 1:
        sa = a.shape
        x = a._value.reshape((-1, sa[-1]))           # the batch folded into the rows
        rows = int(np.prod(sa[:-1], dtype=np.int64))
        keep = _plain(x).reshape((size, rows, sa[-1]))

        def part(g: np.ndarray) -> np.ndarray:        # x_bᵀ g_b for every example b
            g = g.reshape((size, rows, w.shape[1]))
            if rows == 1:                             # (outer products: no sum)
                return keep[:, 0, :, None] * g[:, 0, None, :]
            return np.matmul(keep.transpose(0, 2, 1), g)
        y = _probed(s, x @ w, part)
        return Batched(y.reshape((size,) + sa[:-1] + w.shape[1:]), s._level, size)
    if a is s and _partner(s, b) and b.ndim == 1:
        keep = _plain(b._value)

        def part(g: np.ndarray) -> np.ndarray:        # g_b v_bᵀ
            return g[:, :, None] * keep[:, None, :]
        return Batched(_probed(s, b._value @ w.T, part), s._level, size)
    return NotImplemented


def value_and_grad(F: Any, xs: list[Any], argnums: Any, aux: bool,
                   value: bool, total: Callable[[Any], Any]) -> Any:
    """vmap_lift's grad and value_and_grad with the Shared leaves of ``xs`` (the
    differentiated arguments' leaves that ``usable`` takes, left unbatched by
    ``F.unwrap``): the same results, as whole batches."""
    numbers = argnums if isinstance(argnums, tuple) else (argnums,)
    numbers = tuple(k + len(xs) if k < 0 else k for k in numbers)
    frontier = Frontier()
    layout, point, shared = [], [], []
    for k in numbers:
        leaves, tree = _trees.flatten(xs[k])
        kinds: list[Any] = []
        for v, marked in zip(leaves, F.marks[k]):
            if marked:
                kinds.append(None)
                point.append(v)
            else:
                kinds.append(Shared(v, F.level, F.size, frontier))
                shared.append(kinds[-1])
        layout.append((k, tree, kinds))

    def inner(given: list[Any]) -> Any:
        frontier.level = _levels.LEVEL.get()
        it = iter(given)
        ys = list(xs)
        for k, tree, kinds in layout:
            ys[k] = _trees.unflatten(tree, [next(it) if c is None else c for c in kinds])
        return F(*ys)

    run = _Reverse(inner, tuple(point), ())
    out = run.result
    z = _scalar_output(total(out[0] if aux else out), inner, "grad", run.mode)
    made = len(run.inputs)
    frontier.closed = True
    run.adopt(frontier.inputs)
    swept = run.sweep(z, last=True)
    grads = iter(_trees.flatten(run.gradient(swept[:made]))[0])
    extra = iter(frontier.gradients(shared, swept[made:]))
    per_arg = [_trees.unflatten(tree, [next(grads) if c is None else next(extra)
                                       for c in kinds]) for _, tree, kinds in layout]
    gradient = tuple(per_arg) if isinstance(argnums, tuple) else per_arg[0]
    if not value and not aux:
        return F.rewrap(gradient)
    # (the per-example values and aux, read as numbers, as the general path's aux)
    numbers = _undifferentiated(out if value else out[1], (0, run.tape), _levels.OUTSIDE)
    return (F.rewrap(numbers), F.rewrap(gradient)) if value else \
        (F.rewrap(gradient), F.rewrap(numbers))
