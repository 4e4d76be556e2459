"""Sorting on the op table: ``sort`` and ``order_by``, and the integer-valued helpers
``argsort``, ``argmax``, ``argmin`` (not differentiable: numpy integer arrays).

Why table ops and not a gather: the permutation depends on the values. A gather with
indices computed on the host would freeze the order of the point where ``ad.record``
recorded it; as ops, replay sorts again at every point, and the vjp permutes back by the
order of the values it is given.

- ``sort(x, axis)``: numpy's stable sort. Its vjp puts each output's adjoint back where
  its element came from: ``order_by(g, x, inverse=True)``.
- ``order_by(v, key, axis, inverse)``: ``v``'s elements in the order that sorts ``key``
  along ``axis`` (``inverse``: put back from that order). Linear in ``v``; the order is
  piecewise constant in ``key``, whose derivative is zero (no cotangent, tangent
  ignored). Its vjp is itself with ``inverse`` flipped.

Ties: the stable order decides, so each element takes the adjoint of the slot it was
sorted into, tied elements included (two equal inputs get the adjoints of two
neighbouring outputs, in their original order). NaNs sort last, as in numpy.

No OpenCL kernel: on an OpenCL device both run numpy's sort on host copies (the op
table's host fallback), eager and in replayed programs.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad.ops._apply import apply, call
from easyad.ops._builtin import _axis, _shifted
from easyad.ops._table import Op, register
from easyad.tensor._base import read_keyed
from easyad.tensor._generic import NUMPY_FUNCTIONS, _is_tensor

if TYPE_CHECKING:
    from easyad.tensor._opencl import OpenCLBackend


@dataclasses.dataclass(frozen=True)
class SortParams:
    axis: int = -1


@dataclasses.dataclass(frozen=True)
class OrderParams:
    axis: int = -1
    inverse: bool = False


def _sort_rule(p: SortParams, shape: tuple[int, ...]) -> tuple[tuple[int, ...], SortParams]:
    if not shape:
        raise ValueError("sort: a 0-d operand has no axis (ad.sort(x, axis=None) makes it "
                         "1-d first, as numpy does)")
    return shape, SortParams(_axis("sort", p.axis, len(shape)))


def _order_rule(p: OrderParams, shape: tuple[int, ...], key: tuple[int, ...]
                ) -> tuple[tuple[int, ...], OrderParams]:
    if shape != key:
        raise ValueError(f"order_by: the values' shape {shape} differs from the key's {key}")
    if not shape:
        raise ValueError("order_by: 0-d operands have no axis")
    return shape, OrderParams(_axis("order_by", p.axis, len(shape)), p.inverse)


def _order(key: np.ndarray, axis: int) -> np.ndarray:
    # object arrays (Records, Traces) compare by value: the scalar engines guard the order
    return np.argsort(key, axis=axis, kind="stable")


def _order_numpy(p: OrderParams, v: np.ndarray, key: np.ndarray) -> np.ndarray:
    index = _order(key, p.axis)
    if not p.inverse:
        return np.take_along_axis(v, index, axis=p.axis)
    out = np.empty_like(v)
    np.put_along_axis(out, index, v, axis=p.axis)
    return out


# ---- the OpenCL kernel: sort and order_by on the device ----
# Each work item takes one element and counts the elements its line puts before it in
# numpy's stable order: smaller keys, and equal keys earlier in the line (-0.0 equals 0.0;
# NaN after every number, NaNs equal among themselves). That count is the element's
# place: order_by scatters the value there (inverse: gathers from there). O(n) work per
# element, all elements at once: lines longer than _LONGEST run on the host instead.
_ORDER_KERNEL = """
__kernel void easyad_order(__global const {v}* v, __global const {k}* key, __global {v}* out,
                           const long count, const long n, const long inner,
                           const int inverse) {{
    const long g = get_global_id(0);
    if (g >= count) return;
    const long rest = g % (n * inner), k = rest / inner;
    const long start = g - rest + rest % inner;
    const {k} a = key[g];
    long place = 0;
    for (long j = 0; j < n; j++) {{
        const {k} b = key[start + j * inner];
        const int before = (b < a) || (a != a && b == b);
        const int same = (b == a) || (a != a && b != b);
        place += before || (same && j < k);
    }}
    if (inverse) out[g] = v[start + place * inner];
    else out[start + place * inner] = v[g];
}}
"""
_LONGEST = 4096


def _ctype(dtype: Any) -> str:
    return {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}[np.dtype(dtype)]


def _order_opencl(be: OpenCLBackend, p: OrderParams, v: Any, key: Any) -> Any:
    shape = tuple(v.shape)
    n = shape[p.axis]
    if n > _LONGEST:            # O(n^2) a line: numpy's sort on host copies is faster
        hosts = [np.asarray(be.to_numpy(b)) for b in (v, key)]
        return be.asarray(_order_numpy(p, *hosts), v.dtype)
    tv, tk = _ctype(v.dtype), _ctype(key.dtype)
    head = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if "double" in (tv, tk) else ""
    kernel = be.kernel(head + _ORDER_KERNEL.format(v=tv, k=tk), "easyad_order",
                       [None, None, None, np.int64, np.int64, np.int64, np.int32])
    count = int(np.prod(shape))
    out = be._empty(shape, v.dtype)
    inner = int(np.prod(shape[p.axis + 1:]))
    be.launch(kernel, count, v.data, key.data, out.data, count, n, inner, int(p.inverse))
    return out


def _sort_opencl(be: OpenCLBackend, p: SortParams, x: Any) -> Any:
    return _order_opencl(be, OrderParams(p.axis, False), x, x)


def _sample_key(rng: Any, dtype: Any) -> np.ndarray:
    # ties (few distinct values), signed zeros and NaN: the stable order's cases
    key = rng.integers(-3, 4, size=(3, 70, 5)).astype(dtype)
    key[0, ::9, 1] = -0.0
    key[1, ::11, 2] = np.nan
    return key


ORDER_BY: Op = register(Op(
    name="order_by", params=OrderParams, rule=_order_rule, numpy=_order_numpy,
    vjp=lambda p, g, v, key, out: (
        apply(ORDER_BY, OrderParams(p.axis, not p.inverse), (g, key)), None),
    jvp=lambda p, tangents, v, key, out: apply(ORDER_BY, p, (tangents[0], key)),
    batch=lambda p, b: (OrderParams(_shifted(p.axis, b), p.inverse), b),
    dtype=lambda p, values, key: values, objects=True, opencl=_order_opencl,
    sample=lambda rng, dtype: ((rng.normal(size=(3, 70, 5)).astype(dtype),
                                _sample_key(rng, dtype)), {"axis": 1, "inverse": True}),
    doc="values in the order that sorts a key along an axis (or put back from it)"))


SORT: Op = register(Op(
    name="sort", params=SortParams, rule=_sort_rule,
    numpy=lambda p, x: np.take_along_axis(x, _order(x, p.axis), axis=p.axis),
    vjp=lambda p, g, x, out: (apply(ORDER_BY, OrderParams(p.axis, True), (g, x)),),
    jvp=lambda p, tangents, x, out: apply(ORDER_BY, OrderParams(p.axis, False),
                                          (tangents[0], x)),
    batch=lambda p, b: (SortParams(_shifted(p.axis, b)), b),
    objects=True, opencl=_sort_opencl,
    sample=lambda rng, dtype: ((_sample_key(rng, dtype),), {"axis": 1}),
    doc="sorted along an axis (stable)"))


def _flat(x: Any) -> Any:
    return x.reshape(-1) if hasattr(x, "reshape") and not isinstance(x, (list, tuple)) \
        else np.reshape(np.asarray(x), -1)


def sort(x: Any, axis: int | None = -1, kind: Any = None, order: Any = None) -> Any:
    """``x`` sorted along ``axis`` (None: flattened first), as ``numpy.sort`` with a
    stable sort whatever ``kind`` says; differentiable: each element's derivative is the
    one of the place it was sorted into (tied elements keep their order, so each gets
    its own place's).

    >>> import numpy as np, easyad as ad
    >>> lst = ad.WengertList()
    >>> t = ad.Tensor.variable(np.array([3.0, 1.0, 2.0]), lst)
    >>> s = ad.sort(t)
    >>> s.value.tolist(), ad.sum(s * np.array([1.0, 10.0, 100.0])).derivatives()[t].tolist()
    ([1.0, 2.0, 3.0], [100.0, 1.0, 10.0])
    """
    if order is not None:
        raise TypeError("sort: order= (structured arrays) is not supported on easyad "
                        "tensors; leave it out")
    if axis is None:
        x, axis = _flat(x), 0
    return call(SORT, (x,), {"axis": axis})


def order_by(values: Any, key: Any, axis: int = -1, inverse: bool = False) -> Any:
    """``values`` permuted along ``axis`` by the order that sorts ``key`` (stable), or put
    back from that order with ``inverse=True``: ``order_by(x, x)`` is ``sort(x)``. The
    derivative flows to ``values`` only (the order is piecewise constant in ``key``).

    >>> import numpy as np, easyad as ad
    >>> ad.order_by(np.array([10.0, 20.0, 30.0]), np.array([3.0, 1.0, 2.0]))
    array([20., 30., 10.])
    """
    return call(ORDER_BY, (values, key), {"axis": axis, "inverse": inverse})


def _indices(x: Any, key: Any) -> Any:
    """``key`` (an integer-valued function) of x's values: a tensor's read on the host
    (in a tensor recording, guarded on the indices only); an array (of numbers, or of
    Records/Traces, compared by value: scalar tapes guard each comparison) as it is."""
    if _is_tensor(x):
        return read_keyed(x, key)
    return key(np.asarray(x))


def argsort(x: Any, axis: int | None = -1, kind: Any = None, order: Any = None) -> Any:
    """The indices that sort ``x`` along ``axis``, as ``numpy.argsort`` (a stable sort
    whatever ``kind`` says): an integer numpy array, not differentiable.

    >>> import numpy as np, easyad as ad
    >>> ad.argsort(ad.Tensor.constant(np.array([3.0, 1.0, 2.0]))).tolist()
    [1, 2, 0]
    """
    if order is not None:
        raise TypeError("argsort: order= (structured arrays) is not supported on easyad "
                        "tensors; leave it out")
    return _indices(x, functools.partial(np.argsort, axis=axis, kind="stable"))


def argmax(x: Any, axis: int | None = None, keepdims: bool = False) -> Any:
    """The index of the largest element (the first of ties), as ``numpy.argmax``: integer
    numpy values, not differentiable (``ad.amax`` is the differentiable maximum).

    >>> import numpy as np, easyad as ad
    >>> int(ad.argmax(ad.Tensor.constant(np.array([1.0, 5.0, 5.0]))))
    1
    """
    return _indices(x, functools.partial(np.argmax, axis=axis, keepdims=keepdims))


def argmin(x: Any, axis: int | None = None, keepdims: bool = False) -> Any:
    """The index of the smallest element (the first of ties), as ``numpy.argmin``: integer
    numpy values, not differentiable (``ad.amin`` is the differentiable minimum).

    >>> import numpy as np, easyad as ad
    >>> ad.argmin(ad.Tensor.constant(np.array([[4.0, 1.0], [2.0, 5.0]])), axis=1).tolist()
    [1, 0]
    """
    return _indices(x, functools.partial(np.argmin, axis=axis, keepdims=keepdims))


NUMPY_FUNCTIONS.update({np.sort: sort, np.argsort: argsort, np.argmax: argmax,
                        np.argmin: argmin})
