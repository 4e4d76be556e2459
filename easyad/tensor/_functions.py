"""The public tensor functions: ad.sum, ad.mean, ad.amax, ad.amin, ad.concatenate, ad.stack
(from ``_generic``), ad.logsumexp, ad.softmax, ad.log_softmax and ad.eval_shape.

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
from easyad.tensor._base import refuse_object_array, wrap
from easyad.tensor._generic import _is_tensor, amax, amin, concatenate, mean, stack, sum
from easyad.tensor._meta import META, MetaArray
from easyad.tensor._tensor import Tensor

__all__ = ["amax", "amin", "concatenate", "eval_shape", "log_softmax", "logsumexp", "mean",
           "softmax", "stack", "sum"]


def _as_tensor(x: Any) -> tuple[Any, bool]:
    if _is_tensor(x):
        return x, False
    if isinstance(x, np.ndarray):
        refuse_object_array(x)
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
    args = [wrap(Tensor, META, MetaArray(tuple(s), dtype), tuple(s), dtype) for s in shapes_]
    return _shape_of(f(*args))


def _shape_of(out: Any) -> Any:
    if isinstance(out, (tuple, list)):
        return tuple(_shape_of(o) for o in out)
    if isinstance(out, dict):
        return {k: _shape_of(v) for k, v in out.items()}
    return tuple(np.shape(out)) if not isinstance(out, Tensor) else out.shape
