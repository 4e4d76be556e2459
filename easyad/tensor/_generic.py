"""The generic reductions and joins: ad.sum, ad.mean, ad.amax, ad.amin, ad.concatenate,
ad.stack, and the numpy functions a Tensor answers (``NUMPY_FUNCTIONS``, read by
``Tensor.__array_function__``).

Generic like the scalar functions: a Tensor (or TraceTensor) takes its own method; numpy
arrays and numbers go through numpy. Below ``_tensor`` (it needs only ``_structural`` and
the storage class), so ``Tensor`` can dispatch numpy's functions here without a cycle.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad.tensor import _structural
from easyad.tensor._base import TensorBase


def _is_tensor(x: Any) -> bool:
    return isinstance(x, TensorBase) or type(x).__name__ == "TraceTensor"


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


NUMPY_FUNCTIONS = {
    np.sum: sum, np.mean: mean, np.amax: amax, np.amin: amin, np.max: amax, np.min: amin,
    np.concatenate: concatenate, np.stack: stack,
    np.where: lambda c, a, b: _structural.where(c, a, b),
    np.reshape: lambda a, shape: a.reshape(shape),
    np.transpose: lambda a, axes=None: a.transpose(*(() if axes is None else (axes,))),
    np.shape: lambda a: a.shape, np.ndim: lambda a: a.ndim, np.size: lambda a: a.size,
}
