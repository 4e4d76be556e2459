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

from easyad._levels import BatchedBase
from easyad.tensor import _structural
from easyad.tensor._base import TensorBase


def _is_tensor(x: Any) -> bool:
    return isinstance(x, (TensorBase, BatchedBase)) or type(x).__name__ == "TraceTensor"


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
        traced = next((t for t in tensors if type(t).__name__ == "TraceTensor"), None)
        if traced is not None:
            return type(traced).concatenate(tensors, axis)
        return _structural.TABLE_OPS["concatenate"](tensors, axis)     # the op table's
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
        traced = next((t for t in tensors if type(t).__name__ == "TraceTensor"), None)
        if traced is not None:
            return type(traced).stack(tensors, axis)
        if any(isinstance(t, BatchedBase) for t in tensors):
            return np.stack(tensors, axis=axis)     # vmap's batches: their own stack
        return _structural.stack(tensors, axis)
    return np.stack(tensors, axis=axis)


def _ravel(a: Any, order: str = "C") -> Any:
    if order != "C":
        raise TypeError(f"np.ravel(order={order!r}) is not supported on easyad tensors "
                        "(they are row-major): use t.reshape(-1)")
    return a.reshape(-1)


def _hstack(tensors: Any) -> Any:
    # numpy's rule: 1-D operands join along their only axis, others along axis 1
    tensors = [t if np.ndim(t) else t.reshape(1) for t in tensors]
    return concatenate(tensors, axis=0 if np.ndim(tensors[0]) == 1 else 1)


def _vstack(tensors: Any) -> Any:
    # numpy's rule: operands of fewer than 2 dimensions become rows (1, n)
    tensors = [t if np.ndim(t) >= 2 else t.reshape(1, -1) for t in tensors]
    return concatenate(tensors, axis=0)


def _where(c: Any, a: Any, b: Any) -> Any:
    for v in (c, a, b):
        if type(v).__name__ == "TraceTensor":
            return type(v)._where(c, a, b)
    return _structural.where(c, a, b)


def _dot(a: Any, b: Any) -> Any:
    # np.dot is matmul for 1-D and 2-D operands (and a product with a scalar)
    if np.ndim(a) == 0 or np.ndim(b) == 0:
        return a * b
    if np.ndim(a) > 2 or np.ndim(b) > 2:
        raise TypeError("np.dot of tensors takes 1-D or 2-D operands; use a @ b (matmul) "
                        "for stacks of matrices")
    return a @ b


NUMPY_FUNCTIONS = {
    np.sum: sum, np.mean: mean, np.amax: amax, np.amin: amin, np.max: amax, np.min: amin,
    np.concatenate: concatenate, np.stack: stack,
    np.where: lambda c, a, b: _where(c, a, b),
    np.reshape: lambda a, shape: a.reshape(shape),
    np.transpose: lambda a, axes=None: a.transpose(*(() if axes is None else (axes,))),
    np.dot: lambda a, b: _dot(a, b),
    np.shape: lambda a: a.shape, np.ndim: lambda a: a.ndim, np.size: lambda a: a.size,
    np.ravel: _ravel, np.hstack: _hstack, np.vstack: _vstack,
}


# ---- numpy's ufuncs and functions on tensors (Tensor and TraceTensor dispatch here) ----

_UFUNC_NAMES = {"negative": "__neg__", "add": "__add__", "subtract": "__sub__",
                "multiply": "__mul__", "divide": "__truediv__", "true_divide": "__truediv__",
                "power": "__pow__", "matmul": "__matmul__", "less": "__lt__",
                "less_equal": "__le__", "greater": "__gt__", "greater_equal": "__ge__",
                "equal": "__eq__", "not_equal": "__ne__"}
_REFLECTED = {"__add__": "__radd__", "__sub__": "__rsub__", "__mul__": "__rmul__",
              "__truediv__": "__rtruediv__", "__pow__": "__rpow__",
              "__matmul__": "__rmatmul__", "__lt__": "__gt__", "__le__": "__ge__",
              "__gt__": "__lt__", "__ge__": "__le__", "__eq__": "__eq__", "__ne__": "__ne__"}


def array_ufunc(cls: type, ufunc: Any, method: str, inputs: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
    """``np.exp(t)``, ``a + t`` with an ndarray ``a``...: the method of ``cls`` (a tensor
    class) that the ufunc names, reflected when the tensor is the right operand."""
    if method != "__call__" or kwargs:
        return NotImplemented
    name = _UFUNC_NAMES.get(ufunc.__name__, ufunc.__name__)
    if len(inputs) == 1 and isinstance(inputs[0], cls):
        method_ = getattr(cls, name, None)
        return NotImplemented if method_ is None else method_(inputs[0])
    if len(inputs) == 2:
        a, b = inputs
        if isinstance(a, cls):
            method_ = getattr(cls, name, None)
            return NotImplemented if method_ is None else method_(a, b)
        method_ = getattr(cls, _REFLECTED.get(name, "_r" + name), None)
        return NotImplemented if method_ is None else method_(b, a)
    return NotImplemented


def array_function(func: Any, args: Any, kwargs: Any) -> Any:
    """``np.<func>(tensor, ...)``: easyad's function of ``NUMPY_FUNCTIONS``, or a
    TypeError naming ``func`` and the closest easyad function (numpy's own message would
    only say that no implementation was found)."""
    implementation = NUMPY_FUNCTIONS.get(func)
    if implementation is None:
        raise TypeError(unsupported_message(func))
    return implementation(*args, **kwargs)  # type: ignore[operator]


def numpy_name(func: Any) -> str:
    """``np.linalg.solve`` for numpy.linalg.solve: how a user spells a numpy function."""
    module = getattr(func, "__module__", None) or "numpy"
    module = "np" + module[len("numpy"):] if module.startswith("numpy") else module
    if module.startswith("np._") or module.startswith("np.lib"):   # numpy's inner modules
        module = "np"
    return f"{module}.{getattr(func, '__name__', repr(func))}"


# numpy functions whose closest easyad function a spelling match would miss
_NEAREST = {"nanprod": "ad.prod", "nansum": "ad.sum", "nanmean": "ad.mean",
            "nanmax": "ad.amax", "nanmin": "ad.amin", "nanvar": "ad.var", "nanstd": "ad.std",
            "nancumsum": "ad.cumsum", "nancumprod": "ad.cumprod",
            "cumulative_sum": "ad.cumsum", "cumulative_prod": "ad.cumprod",
            "average": "ad.mean", "ptp": "ad.amax", "vdot": "ad.inner",
            "hstack": "ad.concatenate", "vstack": "ad.concatenate", "column_stack": "ad.stack",
            "ravel": "t.reshape(-1)", "fliplr": "ad.flip", "flipud": "ad.flip",
            "rot90": "ad.flip", "argpartition": "ad.argsort", "partition": "ad.sort",
            "nanargmax": "ad.argmax", "nanargmin": "ad.argmin", "select": "ad.where",
            "piecewise": "ad.where", "atleast_2d": "ad.expand_dims", "diff": "ad.roll",
            "matrix_transpose": "ad.swapaxes", "permute_dims": "ad.moveaxis"}


def unsupported_message(func: Any) -> str:
    """What ``np.<func>(tensor)`` raises when ``func`` is not in ``NUMPY_FUNCTIONS``."""
    import difflib

    from easyad import _rules
    name = getattr(func, "__name__", "")
    # easyad's functions of numpy's names (ad.prod...) and the rule table's (ad.sin...)
    ours = {f.__name__ for f in NUMPY_FUNCTIONS.values()
            if getattr(f, "__name__", "<lambda>") != "<lambda>"}
    ours |= {r.name for r in _rules.RULES if r.generic}
    close = difflib.get_close_matches(name, sorted(ours), n=1, cutoff=0.88)
    nearest = _NEAREST.get(name) or (f"ad.{close[0]}" if close else None)
    hint = (f"the closest easyad function is {nearest}" if nearest else
            "no easyad function is close: compose it of easyad operations, or make it an "
            "ad.ArrayPrimitive with its own vjp (docs/user-operations.md)")
    return (f"{numpy_name(func)} is not supported on easyad tensors; {hint} (the numpy "
            f"functions tensors answer: docs/tensors.md, 'numpy's functions on tensors')")


def supported_numpy_functions() -> str:
    """The numpy functions tensors answer, as docs/tensors.md lists them (a test checks
    that the docs hold exactly this text; printed by
    ``python -c "import easyad.tensor._generic as g; print(g.supported_numpy_functions())"``)."""
    names = sorted({numpy_name(f) for f in NUMPY_FUNCTIONS})
    lines, line = [], ""
    for name in names:
        item = f"`{name}`"
        if line and len(line) + len(item) + 2 > 88:
            lines.append(line + ",")
            line = ""
        line = f"{line}, {item}" if line else item
    return "\n".join(lines + [line]) + "."
