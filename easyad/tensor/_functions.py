"""The public tensor functions: ad.sum, ad.mean, ad.amax, ad.amin, ad.concatenate, ad.stack
(from ``_generic``), ad.logsumexp, ad.softmax, ad.log_softmax and ad.eval_shape.

Generic like the scalar functions: a Tensor (or TraceTensor) takes its own method; numpy
arrays and numbers go through numpy. The softmax family is composed of tensor operations
around a constant shift by the maximum, so it is numerically stable; softmax of a recorded
tensor computes those on the constant and records one entry (``_fused.SoftmaxStep``, vjp
``y (g - sum(g y))``: fewer passes than the composition's vjps); the others record the
composition, whose derivatives need no rule of their own.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad._core import Record, Trace
from easyad.tensor import _fused
from easyad.tensor import _shapes as shapes
from easyad.tensor import _structural
from easyad.tensor._interpreters import interpreting
from easyad.tensor._base import TensorBase, refuse_object_array, wrap
from easyad.tensor._generic import _is_tensor, amax, amin, concatenate, mean, stack, sum
from easyad.tensor._meta import META, MetaArray, ShapeDtype
from easyad.tensor._tensor import Tensor

__all__ = ["ShapeDtype", "amax", "amin", "concatenate", "eval_shape", "log_softmax",
           "logsumexp", "mean", "softmax", "stack", "sum"]


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
    if isinstance(t, TensorBase) and t._tape is not None and t._index >= 0 and t.ndim \
            and t._backend.interpreter.fuses:
        # the same floats from the constant, then one tape entry (_fused.SoftmaxStep)
        c = t.detach()
        e = (c - _shift(c, axis)).exp()
        return _fused.softmax_node(t, e / e.sum(axis=axis, keepdims=True),
                                   shapes.normalize_axes("softmax", axis, t.ndim))
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


def eval_shape(f: Any, *args: Any, dtype: Any = np.float64, **kwargs: Any) -> Any:
    """The shapes and dtypes of ``f``'s outputs, without computing anything.

    Each argument that is a shape (a tuple of ints) or an ``ad.ShapeDtype`` becomes a
    tensor with that shape and no values (``dtype`` for a bare shape; a ShapeDtype of
    integers or booleans, such as class targets, becomes zeros of its shape); a Tensor
    counts by its shape and dtype; lists, dicts and other tuples are looked into; anything
    else (numpy arrays, numbers, modules, strings) and ``kwargs`` reach ``f`` unchanged.
    While ``f`` runs, every tensor made from data (constants, the parameters of
    ``easyad.nn`` modules) has a shape only, so models, losses, the softmax family and
    user array primitives (``ad.primitive(vjp=...)``) trace without a kernel. Every
    operation checks its operands' shapes as in a real evaluation, so a mismatch raises
    the same ``ad.ShapeError``.

    Returns an ``ad.ShapeDtype`` per output (shape ``()`` for a number) in the structure
    of ``f``'s result: tuples, lists and dicts of them; None stays None.

    >>> import numpy as np, easyad as ad
    >>> ad.eval_shape(lambda a, b: ad.sum(a @ b, axis=0), (3, 4), (4, 5))
    ShapeDtype(shape=(5,), dtype=float64)
    >>> model = ad.nn.Sequential(ad.nn.Linear(784, 32), ad.nn.Tanh(), ad.nn.Linear(32, 10))
    >>> loss = lambda x, t: ad.nn.functional.cross_entropy(model(x), t)
    >>> out = ad.eval_shape(lambda x, t: {"logits": model(x), "loss": loss(x, t)},
    ...                     (16, 784), ad.ShapeDtype((16,), np.int64))
    >>> out["logits"], out["loss"]
    (ShapeDtype(shape=(16, 10), dtype=float64), ShapeDtype(shape=(), dtype=float64))
    """
    with interpreting(META):
        inputs = [_abstract(a, np.dtype(dtype)) for a in args]
        return _spec_of(f(*inputs, **kwargs))


def _is_shape(v: Any) -> bool:
    return type(v) is tuple and all(isinstance(n, (int, np.integer)) and
                                    not isinstance(n, bool) for n in v)


def _abstract(v: Any, dtype: np.dtype) -> Any:
    """An argument of eval_shape as what ``f`` receives (see eval_shape)."""
    if _is_shape(v):
        v = ShapeDtype(v, dtype)
    if isinstance(v, ShapeDtype):
        if v.dtype.kind in "biu":
            return np.zeros(v.shape, v.dtype)      # integer data (class targets): zeros
        if v.dtype.kind != "f":
            raise TypeError(f"eval_shape: a tensor is float64 or float32, not {v.dtype}")
        return wrap(Tensor, META, MetaArray(v.shape, v.dtype), v.shape, v.dtype)
    if isinstance(v, TensorBase):
        return wrap(Tensor, META, MetaArray(v.shape, v.dtype), v.shape, v.dtype)
    if isinstance(v, dict):
        return {k: _abstract(x, dtype) for k, x in v.items()}
    if type(v) in (tuple, list):
        return type(v)(_abstract(x, dtype) for x in v)
    return v


def _spec_of(out: Any) -> Any:
    """The ShapeDtype of each output, in the output's structure."""
    if out is None:
        return None
    if isinstance(out, (tuple, list)):
        return type(out)(_spec_of(o) for o in out) if type(out) in (tuple, list) else \
            tuple(_spec_of(o) for o in out)
    if isinstance(out, dict):
        return {k: _spec_of(v) for k, v in out.items()}
    if isinstance(out, (bool, np.bool_)):
        return ShapeDtype((), np.bool_)
    if isinstance(out, (int, float, np.number, Record, Trace)):
        return ShapeDtype((), np.float64)
    shape, dt = getattr(out, "shape", None), getattr(out, "dtype", None)
    if isinstance(shape, tuple) and dt is not None:   # Tensor, TraceTensor, ndarray
        return ShapeDtype(shape, dt)
    raise TypeError(f"eval_shape: f returned a {type(out).__name__}; it may return tensors, "
                    f"arrays, numbers and tuples, lists or dicts of them")
