"""The public tensor functions: ad.sum, ad.mean, ad.amax, ad.amin, ad.concatenate, ad.stack,
ad.logsumexp, ad.softmax, ad.log_softmax and ad.eval_shape.

Generic like the scalar functions: a Tensor (or TraceTensor) takes its own method; numpy
arrays and numbers go through numpy. The softmax family is composed of recorded tensor
operations around a constant shift by the maximum, so it is numerically stable and its
derivatives need no rule of their own.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad.tensor import _shapes as shapes
from easyad.tensor import _structural
from easyad.tensor._meta import META, MetaArray
from easyad.tensor._tensor import Tensor, wrap


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor) or type(x).__name__ == "TraceTensor"


def sum(x: Any, axis: Any = None, keepdims: bool = False) -> Any:  # noqa: A001
    """Sum of the elements over ``axis`` (all of them by default).

    On a Tensor summed to one number the result is a scalar Record (a float for constants).

    >>> import numpy as np, easyad as ad
    >>> ad.sum(np.array([[1.0, 2.0], [3.0, 4.0]]), axis=0)
    array([4., 6.])
    """
    if _is_tensor(x):
        return x.sum(axis=axis, keepdims=keepdims)
    return np.sum(x, axis=axis, keepdims=keepdims)


def mean(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Mean of the elements over ``axis`` (all of them by default).

    >>> import numpy as np, easyad as ad
    >>> lst = ad.WengertList()
    >>> t = ad.Tensor.variable(np.array([[1.0, 2.0], [3.0, 6.0]]), lst)
    >>> m = ad.mean(t)                     # one number: a scalar Record
    >>> m.number, m.derivatives()[t].tolist()
    (3.0, [[0.25, 0.25], [0.25, 0.25]])
    >>> ad.mean(t, axis=0).value.tolist()
    [2.0, 4.0]
    """
    if _is_tensor(x):
        return x.mean(axis=axis, keepdims=keepdims)
    return np.mean(x, axis=axis, keepdims=keepdims)


def amax(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Largest element over ``axis``; tied elements share the derivative evenly
    (``ad.maximum`` is the elementwise maximum of two operands).

    >>> import numpy as np, easyad as ad
    >>> lst = ad.WengertList()
    >>> t = ad.Tensor.variable(np.array([1.0, 3.0, 3.0]), lst)
    >>> ad.amax(t).derivatives()[t].tolist()       # a tie: half each
    [0.0, 0.5, 0.5]
    """
    if _is_tensor(x):
        return x.max(axis=axis, keepdims=keepdims)
    return np.amax(x, axis=axis, keepdims=keepdims)


def amin(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Smallest element over ``axis``; tied elements share the derivative evenly.

    >>> import numpy as np, easyad as ad
    >>> lst = ad.WengertList()
    >>> t = ad.Tensor.variable(np.array([[4.0, 1.0], [2.0, 5.0]]), lst)
    >>> ad.amin(t, axis=1).value.tolist()
    [1.0, 2.0]
    """
    if _is_tensor(x):
        return x.min(axis=axis, keepdims=keepdims)
    return np.amin(x, axis=axis, keepdims=keepdims)


def concatenate(tensors: Any, axis: int = 0) -> Any:
    """Join tensors along an existing axis (numpy's rules; ShapeError when they differ).

    >>> import numpy as np, easyad as ad
    >>> lst = ad.WengertList()
    >>> a = ad.Tensor.variable(np.ones((2, 2)), lst)
    >>> b = ad.Tensor.variable(np.zeros((1, 2)), lst)
    >>> ad.concatenate([a, b]).shape
    (3, 2)
    """
    tensors = list(tensors)
    if any(_is_tensor(t) for t in tensors):
        first = next(t for t in tensors if _is_tensor(t))
        if type(first).__name__ == "TraceTensor":
            return type(first).concatenate(tensors, axis)
        return _structural.concatenate(tensors, axis)
    return np.concatenate(tensors, axis=axis)


def stack(tensors: Any, axis: int = 0) -> Any:
    """Join tensors of one shape along a new axis.

    >>> import numpy as np, easyad as ad
    >>> lst = ad.WengertList()
    >>> a = ad.Tensor.variable(np.ones(3), lst)
    >>> ad.stack([a, 2 * a], axis=1).shape
    (3, 2)
    """
    tensors = list(tensors)
    if any(_is_tensor(t) for t in tensors):
        first = next(t for t in tensors if _is_tensor(t))
        if type(first).__name__ == "TraceTensor":
            return type(first).stack(tensors, axis)
        return _structural.stack(tensors, axis)
    return np.stack(tensors, axis=axis)


def _as_tensor(x: Any) -> tuple[Any, bool]:
    if _is_tensor(x):
        return x, False
    return Tensor.constant(np.asarray(x, dtype=float), device="numpy"), True


def _unwrap(result: Any, was_array: bool) -> Any:
    return result.value if was_array and isinstance(result, Tensor) else result


def _shift(t: Any, axis: Any) -> Any:
    """The constant max over ``axis`` (kept dims), 0 where it is not finite."""
    m = t.detach().max(axis=axis, keepdims=True)
    return _structural.where(m - m == 0.0, m, 0.0)


def logsumexp(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """``log(sum(exp(x)))`` over ``axis``, computed stably (shifted by the maximum).

    >>> import numpy as np, easyad as ad
    >>> lst = ad.WengertList()
    >>> t = ad.Tensor.variable(np.array([1000.0, 1000.0]), lst)   # exp would overflow
    >>> z = ad.logsumexp(t)
    >>> round(z.number - 1000.0, 12), z.derivatives()[t].tolist()
    (0.69314718056, [0.5, 0.5])
    """
    t, was_array = _as_tensor(x)
    m = _shift(t, axis)
    s = (t - m).exp().sum(axis=axis, keepdims=True).log() + m
    axes = shapes.normalize_axes("logsumexp", axis, t.ndim)
    if not keepdims:
        s = s.reshape(shapes.reduce(t.shape, axes, False))
        if s.shape == ():
            s = s.sum()  # a scalar Record (a float for constants)
    return _unwrap(s, was_array)


def softmax(x: Any, axis: int = -1) -> Any:
    """``exp(x) / sum(exp(x))`` along ``axis``, computed stably.

    >>> import numpy as np, easyad as ad
    >>> ad.softmax(ad.Tensor.constant(np.array([0.0, 0.0, 0.0, 0.0]))).value.tolist()
    [0.25, 0.25, 0.25, 0.25]
    """
    t, was_array = _as_tensor(x)
    e = (t - _shift(t, axis)).exp()
    return _unwrap(e / e.sum(axis=axis, keepdims=True), was_array)


def log_softmax(x: Any, axis: int = -1) -> Any:
    """``x - logsumexp(x)`` along ``axis``, computed stably.

    >>> import numpy as np, easyad as ad
    >>> p = ad.log_softmax(ad.Tensor.constant(np.array([[0.0, 0.0]]))).value
    >>> np.allclose(p, np.log(0.5))
    True
    """
    t, was_array = _as_tensor(x)
    return _unwrap(t - logsumexp(t, axis=axis, keepdims=True), was_array)


def eval_shape(f: Any, *shapes_: Any, dtype: Any = np.float64) -> Any:
    """The output shape(s) of ``f`` on tensors of ``shapes_``, without computing anything.

    Every operation checks its operands' shapes as in a real evaluation, so a mismatch
    raises the same ``ad.ShapeError``. Outputs that are tensors or scalars give their shape
    (``()`` for a number); tuples and lists of outputs give tuples of shapes.

    >>> import easyad as ad
    >>> ad.eval_shape(lambda a, b: ad.sum(a @ b, axis=0), (3, 4), (4, 5))
    (5,)
    """
    args = [wrap(META, MetaArray(tuple(s), dtype), tuple(s), dtype) for s in shapes_]
    return _shape_of(f(*args))


def _shape_of(out: Any) -> Any:
    if isinstance(out, (tuple, list)):
        return tuple(_shape_of(o) for o in out)
    if isinstance(out, dict):
        return {k: _shape_of(v) for k, v in out.items()}
    return tuple(np.shape(out)) if not isinstance(out, Tensor) else out.shape


NUMPY_FUNCTIONS = {
    np.sum: sum, np.mean: mean, np.amax: amax, np.amin: amin, np.max: amax, np.min: amin,
    np.concatenate: concatenate, np.stack: stack,
    np.where: lambda c, a, b: _structural.where(c, a, b),
    np.reshape: lambda a, shape: a.reshape(shape),
    np.transpose: lambda a, axes=None: a.transpose(*(() if axes is None else (axes,))),
    np.shape: lambda a: a.shape, np.ndim: lambda a: a.ndim, np.size: lambda a: a.size,
}
