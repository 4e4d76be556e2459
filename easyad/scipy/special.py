"""scipy.special's functions with easyad's derivatives: on floats, Traces, Records, numpy
arrays (object arrays of Records or Traces too) and Tensors, in every mode.

The elementwise ones are rows of the rule table (``easyad/_rules.py``): ``expit``,
``logit``, ``gammaln``, ``digamma`` (``psi``), ``polygamma``, ``erf``, ``erfc``,
``xlogy``, ``xlog1py``, the generic functions ``ad.<name>`` themselves, so they work
everywhere a row works (replay, ``compile()``, OpenCL, Taylor mode). scipy.special's own
ufuncs called on an easyad number dispatch to them too (``scipy.special.expit(record)``).
The reductions ``logsumexp``, ``softmax`` and ``log_softmax`` are compositions of rows.

>>> import easyad as ad
>>> from easyad.scipy import special
>>> round(ad.derivative(special.gammaln)(3.0), 12)       # digamma(3) = 3/2 - euler gamma
0.922784335098
"""
from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from easyad._core import Record, Trace
from easyad._generated.functions import (digamma, erf, erfc, exp, expit, gammaln, log,
                                         logit, psi, xlog1py, xlogy)
from easyad._generated.functions import polygamma as _polygamma
from easyad.tensor import TraceTensor, Tensor
from easyad.tensor import log_softmax as _tensor_log_softmax
from easyad.tensor import logsumexp as _tensor_logsumexp
from easyad.tensor import softmax as _tensor_softmax

__all__ = ["digamma", "erf", "erfc", "expit", "gammaln", "log_softmax", "logit",
           "logsumexp", "polygamma", "psi", "softmax", "xlog1py", "xlogy"]

_TENSORS = (Tensor, TraceTensor)


def polygamma(n: Any, x: Any) -> Any:
    """The n-th derivative of digamma at x (scipy.special.polygamma); n is an integer order
    >= 0 (an int or integer-valued float or array), not differentiated: its derivative
    in x is polygamma(n + 1, x), to any order.

    >>> from easyad.scipy import special
    >>> round(special.polygamma(1, 1.0), 12)                  # pi^2 / 6
    1.644934066848
    """
    if isinstance(n, (Trace, Record) + _TENSORS):
        raise TypeError("polygamma's order n is an integer, not a differentiable number: "
                        "pass an int (or an integer-valued array)")
    order = np.asarray(n, dtype=np.float64)
    if not np.all(np.isfinite(order)) or np.any(order != np.round(order)) \
            or np.any(order < 0):
        raise ValueError(f"polygamma's order n must be an integer >= 0, got {n!r}")
    return _polygamma(float(order) if order.ndim == 0 else order, x)


def _number(v: Any) -> float:
    # the plain value of any easyad number (Trace of Trace...): for the shift of logsumexp
    while not isinstance(v, numbers.Real):
        v = v.number
    return float(v)


def _objects(a: Any) -> np.ndarray:
    array = np.asarray(a) if isinstance(a, np.ndarray) else np.array(a, dtype=object)
    if array.dtype.kind != "O" and array.dtype.kind not in "biuf":
        raise TypeError(f"expected numbers, Records or Traces, got an array of {array.dtype}")
    return array


def _shift(array: np.ndarray, axis: Any) -> np.ndarray:
    """The maximum's value (a float array, keepdims): a constant shift, so no comparison
    of recorded numbers is made (the result does not depend on it); 0 where it is not
    finite (all -inf, or inf)."""
    values = np.vectorize(_number, otypes=[float])(array) if array.size else \
        np.zeros(array.shape)
    with np.errstate(invalid="ignore"):
        m = np.max(values, axis=axis, keepdims=True) if values.size else np.zeros(())
    return np.where(np.isfinite(m), m, 0.0)


def logsumexp(a: Any, axis: Any = None, b: Any = None, keepdims: bool = False) -> Any:
    """``log(sum(b * exp(a)))`` over ``axis`` (None: all), without overflow (scipy's
    logsumexp; ``return_sign`` is not offered: with negative weights take the log of the
    sum yourself). Tensors go to ``ad.logsumexp`` (``b`` multiplies in as ``log(b)``).

    >>> import numpy as np
    >>> from easyad.scipy import special
    >>> round(float(special.logsumexp(np.array([1000.0, 1000.0]))) - 1000.0, 10)  # log 2
    0.6931471806
    """
    if isinstance(a, _TENSORS):
        if b is not None:
            a = a + np.log(np.asarray(b, dtype=np.float64)) if not isinstance(
                b, _TENSORS) else a + log(b)
        return _tensor_logsumexp(a, axis=axis, keepdims=keepdims)
    array = _objects(a)
    m = _shift(array, axis)
    terms = exp(array - m) if array.dtype.kind == "O" else np.exp(array - m)
    if b is not None:
        terms = terms * (b if isinstance(b, np.ndarray) else np.asarray(b, dtype=object)
                         if not isinstance(b, numbers.Real) else b)
    total = np.sum(terms, axis=axis, keepdims=True)
    result = log(total) + m
    if not keepdims:
        result = np.squeeze(result, axis=axis) if axis is not None else result.reshape(())
    return result[()] if isinstance(result, np.ndarray) and result.ndim == 0 else result


def softmax(x: Any, axis: Any = None) -> Any:
    """``exp(x) / sum(exp(x))`` over ``axis`` (None: all of x, as scipy), stably.

    >>> import numpy as np
    >>> from easyad.scipy import special
    >>> special.softmax(np.array([0.0, np.log(3.0)])).round(12).tolist()
    [0.25, 0.75]
    """
    if isinstance(x, _TENSORS):
        if axis is None:
            return _tensor_softmax(x.reshape(-1), axis=0).reshape(x.shape)
        return _tensor_softmax(x, axis=axis)
    return exp(_log_softmax_array(_objects(x), axis))


def log_softmax(x: Any, axis: Any = None) -> Any:
    """``x - logsumexp(x)`` over ``axis`` (None: all of x, as scipy).

    >>> import numpy as np
    >>> from easyad.scipy import special
    >>> special.log_softmax(np.array([0.0, 0.0])).round(12).tolist()
    [-0.69314718056, -0.69314718056]
    """
    if isinstance(x, _TENSORS):
        if axis is None:
            return _tensor_log_softmax(x.reshape(-1), axis=0).reshape(x.shape)
        return _tensor_log_softmax(x, axis=axis)
    return _log_softmax_array(_objects(x), axis)


def _log_softmax_array(array: np.ndarray, axis: Any) -> np.ndarray:
    return array - logsumexp(array, axis=axis, keepdims=True)
