"""numpy's reductions and shape functions on tensors, as compositions of easyad operations.

Each function here is made of operations every engine already differentiates (slices,
reshape, transpose, gathers by a constant index, elementwise products, sums, where), so it
works on Tensors of every device, recorded or not, TraceTensors, inside ``ad.record`` (of
tensor code: the pieces fuse; of scalar code: object arrays of Records) and to any order,
with no vjp of its own. Plain numeric arrays and numbers go to numpy itself.

- *Selections* (moveaxis... take_along_axis, pad, diag): numpy's own function applied to
  the array of element positions ``arange(size).reshape(shape)`` says which element goes
  where; the tensor is then one gather (``x.reshape(-1)[positions]``), whose vjp adds the
  adjoints back. Places numpy fills with a constant (pad, diag of a vector) point one past
  the end, at the constant appended to the elements.
- *Products* (prod, cumprod): the op table's ``prod`` and ``cumprod`` (``_prod_ops``:
  numpy and OpenCL lowerings, vjp and jvp with no division, so the derivative with a zero
  among the factors is exact, the product of the other factors, to any order).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from easyad._core import where
from easyad._generated.functions import sqrt
from easyad.ops import _prod_ops
from easyad.ops._apply import call
from easyad.tensor import _generic
from easyad.tensor._generic import NUMPY_FUNCTIONS, _is_tensor


def traced(*xs: Any) -> bool:
    """Whether any operand needs easyad's composition: a tensor, or an object array (of
    Records, Traces...: numpy's own functions would call methods they lack)."""
    return any(_is_tensor(x) or (isinstance(x, np.ndarray) and x.dtype == object)
               for x in xs)


def _array(x: Any) -> Any:
    return x if _is_tensor(x) or isinstance(x, np.ndarray) else np.asarray(x)


def _shape_probe(shape: tuple[int, ...]) -> np.ndarray:
    # an array of this shape that takes no memory: numpy's shape functions run on it
    return np.broadcast_to(np.empty((), dtype=np.int8), shape)


def gather(x: Any, index: np.ndarray) -> Any:
    """The elements of the flattened ``x`` at the integer array ``index``, in its shape."""
    flat = x.reshape(-1)
    if index.ndim == 0:
        return flat[index.reshape(1)].reshape(())
    return flat[index]


def select(x: Any, f: Any, fill: float | None = None) -> Any:
    """``f`` (a numpy function that moves elements) applied to ``x`` by its positions; with
    ``fill``, ``f`` marks filled places with -1 and they get ``fill``."""
    x = _array(x)
    positions = np.arange(x.size, dtype=np.int64).reshape(x.shape)
    if fill is None:
        return gather(x, np.asarray(f(positions)))
    index = np.asarray(f(positions + 1)) - 1          # 0 marks a filled place: now -1
    if not (index < 0).any():
        return gather(x, index)
    index = np.where(index < 0, x.size, index)
    extended = _generic.concatenate([x.reshape(-1), np.array([fill], dtype=_dtype(x))])
    return gather(extended, index)


def _dtype(x: Any) -> Any:
    return x.dtype if x.dtype != object else np.float64


# ---- reductions ----

def prod(x: Any, axis: Any = None, dtype: Any = None, out: Any = None,
         keepdims: bool = False, initial: Any = None, where: Any = None) -> Any:
    """The product of the elements over ``axis`` (all of them by default), as
    ``numpy.prod``. The derivative with respect to an element is the product of the other
    elements, also where one of them is zero (prefix and suffix products, no division:
    exact, and to any order).

    >>> import numpy as np, easyad as ad
    >>> lst = ad.WengertList()
    >>> t = ad.Tensor.variable(np.array([2.0, 0.0, 5.0]), lst)
    >>> p = ad.prod(t)
    >>> p.number, p.derivatives()[t].tolist()
    (0.0, [0.0, 10.0, 0.0])
    """
    _refuse("prod", dtype=dtype, out=out, initial=initial, where=where)
    if not traced(x):
        return np.prod(x, axis=axis, keepdims=keepdims)
    axes = None if axis is None else \
        (tuple(axis) if isinstance(axis, (tuple, list)) else (axis,))
    return call(_prod_ops.PROD, (_array(x),), {"axes": axes, "keepdims": bool(keepdims)})


def cumprod(x: Any, axis: int | None = None, dtype: Any = None, out: Any = None) -> Any:
    """The running products of ``x`` along ``axis`` (None: of the flattened ``x``), as
    ``numpy.cumprod``; derivatives exact with zeros (running products and a linear
    recurrence from the end, no division).

    >>> import numpy as np, easyad as ad
    >>> ad.cumprod(ad.Tensor.constant(np.array([1.0, 2.0, 0.0, 4.0]))).value.tolist()
    [1.0, 2.0, 0.0, 0.0]
    """
    _refuse("cumprod", dtype=dtype, out=out)
    if not traced(x):
        return np.cumprod(x, axis=axis)
    x = _array(x)
    if axis is None:
        x, axis = x.reshape(-1), 0
    return call(_prod_ops.CUMPROD, (x,), {"axis": axis})


def var(x: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: float = 0,
        keepdims: bool = False, *, where: Any = None, mean: Any = None,
        correction: Any = None) -> Any:
    """The variance over ``axis``, ``sum((x - mean)**2) / (n - ddof)``, as ``numpy.var``.

    >>> import numpy as np, easyad as ad
    >>> float(ad.var(ad.Tensor.constant(np.array([1.0, 2.0, 4.0])), ddof=1))
    2.333333333333333
    """
    _refuse("var", dtype=dtype, out=out, where=where, mean=mean)
    ddof = ddof if correction is None else correction
    if not traced(x):
        return np.var(x, axis=axis, ddof=ddof, keepdims=keepdims)
    x = _array(x)
    n = x.size if axis is None else math.prod(
        x.shape[a] for a in _axes(axis, x.ndim, "var"))
    d = x - _generic.mean(x, axis=axis, keepdims=True)
    return _generic.sum(d * d, axis=axis, keepdims=keepdims) / (n - ddof)


def std(x: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: float = 0,
        keepdims: bool = False, *, where: Any = None, mean: Any = None,
        correction: Any = None) -> Any:
    """The standard deviation over ``axis``, ``sqrt(var(x, axis, ddof))``, as
    ``numpy.std``. Its derivative is infinite (NaN in products) where every element is
    equal, as torch's is.

    >>> import numpy as np, easyad as ad
    >>> float(ad.std(ad.Tensor.constant(np.array([1.0, 3.0]))))
    1.0
    """
    _refuse("std", dtype=dtype, out=out, where=where, mean=mean)
    if not traced(x):
        return np.std(x, axis=axis, ddof=ddof if correction is None else correction,
                      keepdims=keepdims)
    return sqrt(var(x, axis=axis, ddof=ddof, keepdims=keepdims, correction=correction))


def clip(a: Any, a_min: Any = None, a_max: Any = None, out: Any = None, *, min: Any = None,
         max: Any = None) -> Any:
    """``a`` limited to [a_min, a_max] (either may be None), as ``numpy.clip``. At a bound
    the value is ``a`` and so is the derivative (1, as torch.clamp's); beyond it the
    derivative goes to the bound (when that is a tensor). NaN stays NaN.

    >>> import numpy as np, easyad as ad
    >>> lst = ad.WengertList()
    >>> t = ad.Tensor.variable(np.array([-2.0, 0.0, 1.0, 3.0]), lst)
    >>> ad.sum(ad.clip(t, 0.0, 1.0)).derivatives()[t].tolist()
    [0.0, 1.0, 1.0, 0.0]
    """
    _refuse("clip", out=out)
    lo = a_min if min is None else min
    hi = a_max if max is None else max
    if not traced(a, lo, hi):
        return np.clip(a, lo, hi)
    a = _array(a)
    if lo is not None:
        a = where(a < lo, lo, a)
    if hi is not None:
        a = where(a > hi, hi, a)
    return a


# ---- shapes ----

def moveaxis(a: Any, source: Any, destination: Any) -> Any:
    """``numpy.moveaxis``: axes moved to new places (a transpose).

    >>> import numpy as np, easyad as ad
    >>> ad.moveaxis(ad.Tensor.constant(np.zeros((2, 3, 4))), 0, -1).shape
    (3, 4, 2)
    """
    if not traced(a):
        return np.moveaxis(a, source, destination)
    a = _array(a)
    return _permuted(a, np.moveaxis(_positions_of_axes(a.ndim), source, destination))


def swapaxes(a: Any, axis1: int, axis2: int) -> Any:
    """``numpy.swapaxes``: two axes exchanged (a transpose).

    >>> import numpy as np, easyad as ad
    >>> ad.swapaxes(ad.Tensor.constant(np.zeros((2, 3, 4))), 0, 2).shape
    (4, 3, 2)
    """
    if not traced(a):
        return np.swapaxes(a, axis1, axis2)
    a = _array(a)
    return _permuted(a, np.swapaxes(_positions_of_axes(a.ndim), axis1, axis2))


def _positions_of_axes(ndim: int) -> np.ndarray:
    # axis k has length k + 1 (a view of one byte): the moved shape names the permutation
    return _shape_probe(tuple(range(1, ndim + 1)))


def _permuted(a: Any, moved: np.ndarray) -> Any:
    perm = tuple(n - 1 for n in moved.shape)
    return a if perm == tuple(range(a.ndim)) else a.transpose(*perm)


def squeeze(a: Any, axis: Any = None) -> Any:
    """``numpy.squeeze``: axes of length one removed (a reshape).

    >>> import numpy as np, easyad as ad
    >>> ad.squeeze(ad.Tensor.constant(np.zeros((2, 1, 3)))).shape
    (2, 3)
    """
    if not traced(a):
        return np.squeeze(a, axis=axis)
    a = _array(a)
    return a.reshape(np.squeeze(_shape_probe(a.shape), axis=axis).shape)


def expand_dims(a: Any, axis: Any) -> Any:
    """``numpy.expand_dims``: axes of length one inserted (a reshape).

    >>> import numpy as np, easyad as ad
    >>> ad.expand_dims(ad.Tensor.constant(np.zeros((2, 3))), (0, 2)).shape
    (1, 2, 1, 3)
    """
    if not traced(a):
        return np.expand_dims(a, axis)
    a = _array(a)
    return a.reshape(np.expand_dims(_shape_probe(a.shape), axis).shape)


def broadcast_to(array: Any, shape: Any, subok: bool = False) -> Any:
    """``numpy.broadcast_to``: ``array`` repeated to ``shape`` (its derivative sums the
    repeats back).

    >>> import numpy as np, easyad as ad
    >>> ad.broadcast_to(ad.Tensor.constant(np.array([1.0, 2.0])), (2, 2)).value.tolist()
    [[1.0, 2.0], [1.0, 2.0]]
    """
    if not traced(array):
        return np.broadcast_to(array, shape)
    return select(array, lambda p: np.broadcast_to(p, shape))


def split(ary: Any, indices_or_sections: Any, axis: int = 0) -> list[Any]:
    """``numpy.split``: a list of consecutive pieces along ``axis``.

    >>> import numpy as np, easyad as ad
    >>> [p.shape for p in ad.split(ad.Tensor.constant(np.zeros((4, 2))), [1])]
    [(1, 2), (3, 2)]
    """
    if not traced(ary):
        return np.split(ary, indices_or_sections, axis=axis)
    ary = _array(ary)
    positions = np.arange(ary.size, dtype=np.int64).reshape(ary.shape)
    return [gather(ary, piece) for piece in np.split(positions, indices_or_sections, axis)]


def tile(A: Any, reps: Any) -> Any:
    """``numpy.tile``: ``A`` repeated ``reps`` times along each axis.

    >>> import numpy as np, easyad as ad
    >>> ad.tile(ad.Tensor.constant(np.array([1.0, 2.0])), 2).value.tolist()
    [1.0, 2.0, 1.0, 2.0]
    """
    return select(A, lambda p: np.tile(p, reps)) if traced(A) else np.tile(A, reps)


def repeat(a: Any, repeats: Any, axis: int | None = None) -> Any:
    """``numpy.repeat``: each element repeated (``repeats`` an int or one per element).

    >>> import numpy as np, easyad as ad
    >>> ad.repeat(ad.Tensor.constant(np.array([1.0, 2.0])), [2, 1]).value.tolist()
    [1.0, 1.0, 2.0]
    """
    if not traced(a):
        return np.repeat(a, repeats, axis=axis)
    return select(a, lambda p: np.repeat(p, repeats, axis=axis))


def roll(a: Any, shift: Any, axis: Any = None) -> Any:
    """``numpy.roll``: elements shifted cyclically along ``axis`` (None: flattened).

    >>> import numpy as np, easyad as ad
    >>> ad.roll(ad.Tensor.constant(np.array([1.0, 2.0, 3.0])), 1).value.tolist()
    [3.0, 1.0, 2.0]
    """
    if not traced(a):
        return np.roll(a, shift, axis=axis)
    return select(a, lambda p: np.roll(p, shift, axis=axis))


def pad(array: Any, pad_width: Any, mode: str = "constant", **kwargs: Any) -> Any:
    """``numpy.pad`` in mode "constant" (``constant_values``: one number): ``array`` with
    constants around it; the constants carry no derivative.

    >>> import numpy as np, easyad as ad
    >>> ad.pad(ad.Tensor.constant(np.array([1.0])), 1, constant_values=9.0).value.tolist()
    [9.0, 1.0, 9.0]
    """
    if not traced(array):
        return np.pad(array, pad_width, mode=mode, **kwargs)
    if mode != "constant":
        raise ValueError(f"pad: mode {mode!r} is not supported on easyad tensors; only "
                         f"mode='constant' (write other modes with ad.concatenate and "
                         f"slices)")
    value = kwargs.pop("constant_values", 0.0)
    if kwargs:
        raise TypeError(f"pad: unexpected argument(s) {sorted(kwargs)} for mode 'constant'")
    if np.ndim(value) != 0:
        raise ValueError("pad: constant_values must be one number on easyad tensors "
                         "(pad twice for different values before and after)")
    return select(array, lambda p: np.pad(p, pad_width, constant_values=0), float(value))


def diag(v: Any, k: int = 0) -> Any:
    """``numpy.diag``: the ``k``-th diagonal of a matrix, or a matrix (zeros elsewhere)
    with a vector on its ``k``-th diagonal.

    >>> import numpy as np, easyad as ad
    >>> ad.diag(ad.Tensor.constant(np.array([1.0, 2.0]))).value.tolist()
    [[1.0, 0.0], [0.0, 2.0]]
    """
    if not traced(v):
        return np.diag(v, k)
    v = _array(v)
    if v.ndim not in (1, 2):
        raise ValueError(f"diag: takes a 1-d or 2-d operand, got {v.ndim}-d (ad.diagonal "
                         f"takes any number of axes)")
    return select(v, lambda p: np.diag(p, k), 0.0 if v.ndim == 1 else None)


def diagonal(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1) -> Any:
    """``numpy.diagonal``: the diagonal of the (axis1, axis2) planes, as a last axis.

    >>> import numpy as np, easyad as ad
    >>> ad.diagonal(ad.Tensor.constant(np.arange(4.0).reshape(2, 2))).value.tolist()
    [0.0, 3.0]
    """
    if not traced(a):
        return np.diagonal(a, offset, axis1, axis2)
    return select(a, lambda p: np.diagonal(p, offset, axis1, axis2).copy())


def trace(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype: Any = None,
          out: Any = None) -> Any:
    """``numpy.trace``: the sum of ``diagonal(a, offset, axis1, axis2)``.

    >>> import numpy as np, easyad as ad
    >>> float(ad.trace(ad.Tensor.constant(np.arange(4.0).reshape(2, 2))))
    3.0
    """
    _refuse("trace", dtype=dtype, out=out)
    if not traced(a):
        return np.trace(a, offset, axis1, axis2)
    return _generic.sum(diagonal(a, offset, axis1, axis2), axis=-1)


def _triangle(name: str, m: Any, k: int, lower: bool) -> Any:
    m = _array(m)
    if m.ndim < 2:
        raise ValueError(f"{name}: takes an operand of at least 2 axes, got {m.ndim}-d")
    rows, cols = m.shape[-2:]
    keep = np.tri(rows, cols, k, dtype=bool)
    keep = keep if lower else ~np.tri(rows, cols, k - 1, dtype=bool)
    return where(keep, m, 0.0)


def triu(m: Any, k: int = 0) -> Any:
    """``numpy.triu``: zeros below the ``k``-th diagonal (of the last two axes).

    >>> import numpy as np, easyad as ad
    >>> ad.triu(ad.Tensor.constant(np.ones((2, 2)))).value.tolist()
    [[1.0, 1.0], [0.0, 1.0]]
    """
    return _triangle("triu", m, k, False) if traced(m) else np.triu(m, k)


def tril(m: Any, k: int = 0) -> Any:
    """``numpy.tril``: zeros above the ``k``-th diagonal (of the last two axes).

    >>> import numpy as np, easyad as ad
    >>> ad.tril(ad.Tensor.constant(np.ones((2, 2)))).value.tolist()
    [[1.0, 0.0], [1.0, 1.0]]
    """
    return _triangle("tril", m, k, True) if traced(m) else np.tril(m, k)


def take(a: Any, indices: Any, axis: int | None = None, out: Any = None,
         mode: str = "raise") -> Any:
    """``numpy.take``: elements at integer ``indices`` (constants) along ``axis`` (None:
    of the flattened ``a``); repeated indices add their derivatives.

    >>> import numpy as np, easyad as ad
    >>> ad.take(ad.Tensor.constant(np.array([1.0, 2.0, 3.0])), [2, 0]).value.tolist()
    [3.0, 1.0]
    """
    _refuse("take", out=out)
    if not traced(a):
        return np.take(a, indices, axis=axis, mode=mode)
    indices = _constant_indices(indices)
    return select(a, lambda p: np.take(p, indices, axis=axis, mode=mode))


def take_along_axis(arr: Any, indices: Any, axis: int | None) -> Any:
    """``numpy.take_along_axis``: ``arr``'s elements at ``indices`` (constants, e.g. from
    ``ad.argsort``) along ``axis``.

    >>> import numpy as np, easyad as ad
    >>> x = ad.Tensor.constant(np.array([[3.0, 1.0, 2.0]]))
    >>> ad.take_along_axis(x, ad.argsort(x, axis=1), axis=1).value.tolist()
    [[1.0, 2.0, 3.0]]
    """
    if not traced(arr):
        return np.take_along_axis(arr, indices, axis)
    indices = _constant_indices(indices)
    return select(arr, lambda p: np.take_along_axis(p, indices, axis))


def _constant_indices(indices: Any) -> np.ndarray:
    if _is_tensor(indices):
        indices = indices.value
    index = np.asarray(indices)
    if index.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers (e.g. ad.argsort's), got dtype "
                        f"{index.dtype}")
    return index


# ---- helpers ----

def _normalized(axis: int, ndim: int, name: str) -> int:
    if not -ndim <= axis < ndim:
        raise np.exceptions.AxisError(f"{name}: axis {axis} is out of bounds for an array "
                                      f"of {ndim} dimension(s)")
    return axis % ndim


def _axes(axis: Any, ndim: int, name: str) -> tuple[int, ...]:
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(_normalized(int(a), ndim, name) for a in items)


def _refuse(name: str, **given: Any) -> None:
    """numpy's arguments easyad does not take, refused by name when given."""
    used = sorted(k for k, v in given.items() if v is not None)
    if used:
        raise TypeError(f"{name}: argument(s) {used} are not supported on easyad tensors "
                        f"(convert the result with .astype() instead of dtype=; no out=)")


NUMPY_FUNCTIONS.update({
    np.prod: prod, np.cumprod: cumprod, np.var: var, np.std: std, np.clip: clip,
    np.moveaxis: moveaxis, np.swapaxes: swapaxes, np.squeeze: squeeze,
    np.expand_dims: expand_dims, np.broadcast_to: broadcast_to, np.split: split,
    np.tile: tile, np.repeat: repeat, np.roll: roll, np.pad: pad, np.diag: diag,
    np.diagonal: diagonal, np.trace: trace, np.triu: triu, np.tril: tril, np.take: take,
    np.take_along_axis: take_along_axis,
})
