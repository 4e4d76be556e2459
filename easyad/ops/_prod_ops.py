"""Products as table ops: ``prod`` (over axes), ``cumprod`` (running, along one axis) and
``recurrence`` (the first-order linear recurrence their derivatives need).

Exact where elements are zero: no derivative divides by ``x``.

- ``prod``: ``p = x_1 ... x_n`` over the reduced axes (moved last and flattened into one
  line of n). ``dp/dx_k = P_k S_k`` with the exclusive prefix ``P_k = x_1 ... x_(k-1)``
  and suffix ``S_k = x_(k+1) ... x_n`` (each an empty product 1 at the ends), which are
  ``cumprod`` shifted by one, from the start and (flip, cumprod, flip) from the end. With
  one zero ``x_j`` every ``P_k S_k`` but the j-th has the factor 0 and the j-th is the
  product of the others; with two zeros all are 0. vjp ``g P S`` (g broadcast), jvp
  ``sum(dx P S)``; both are easyad ops (cumprod's vjp included), so create_graph and
  Hessians follow.
- ``cumprod``: ``y_k = x_k y_(k-1)`` (``y_0 = x_0``) along the axis. Forward:
  ``dy_k = x_k dy_(k-1) + dx_k y_(k-1)``, i.e. ``recurrence(x, dx * Y)`` with
  ``Y = (1, y_0, ..., y_(n-2))`` (y shifted, the exclusive prefix products). Reverse:
  ``dL/dx_k = Y_k R_k`` with ``R_k = sum_(i>=k) g_i x_(k+1) ... x_i``, which satisfies
  ``R_k = g_k + x_(k+1) R_(k+1)``: the recurrence run from the end,
  ``R = flip(recurrence(shift(flip(x)), flip(g)))``.
- ``recurrence(a, b)``: ``o_k = a_k o_(k-1) + b_k`` along the axis, ``o_(-1) = 0`` (so
  ``a_0`` is never used). Linear in b; with ``c`` its recurrence run from the end
  (``c_k = h_k + a_(k+1) c_(k+1)``, as above): vjp ``(shift(o) c, c)``; jvp
  ``recurrence(a, db + da shift(o))``. Its own derivatives are recurrences: every order.

``shift`` moves the elements one place on along the axis, the first place filled (0, or
1 for ``Y``). numpy has no scan of a linear recurrence: its lowering doubles the span
(log2(n) rounds) on up to 8192 elements, and on more runs the loop in blocks of
32 places, all blocks at once, then the recurrence of the blocks' ends (with
each block's product of coefficients), then carries each block's start in; a result with
a value that is not finite is computed again by the plain loop (the rounds and blocks
multiply coefficients the loop never does, which may overflow; with inf or NaN among the
operands the loop's answer is the one given). OpenCL:
one work-item per line, in order, for all three. Recorded programs' fused C (``Op.loop``,
``_loops``): one C function a line loop, in order, in the element type (float32 rounds
each product as numpy's float32 cumprod): bit for bit the eager prod along one axis and
cumprod; the recurrence is the loop itself, which the host lowering's rounds equal to a
few ulp.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad.ops._apply import OpStep, apply
from easyad.ops._builtin import FLIP, FlipParams, _axis, _shifted
from easyad.ops._structural import ReduceParams, _reduce_batch
from easyad.ops._table import Op, get, register
from easyad.ops._loops import axis_lines
from easyad.tensor import _generic
from easyad.tensor import _shapes as shapes

if TYPE_CHECKING:
    from easyad.tensor._opencl import OpenCLBackend


def _line(axis: int, ndim: int, start: int | None, stop: int | None) -> tuple:
    return (slice(None),) * axis + (slice(start, stop),)


def _shift(v: Any, axis: int, fill: float) -> Any:
    """``v`` moved one place on along ``axis``: the first place ``fill``, the last dropped."""
    n = v.shape[axis]
    if n == 0:
        return v
    head = np.full(v.shape[:axis] + (1,) + v.shape[axis + 1:], fill,
                   dtype=v.dtype if v.dtype != object else np.float64)
    if n == 1:
        return v * 0.0 + head
    return _generic.concatenate([head, v[_line(axis, v.ndim, 0, n - 1)]], axis=axis)


def _flip(v: Any, axis: int) -> Any:
    return apply(FLIP, FlipParams((axis,)), (v,))


def _type(t: str) -> str:
    return "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if t == "double" else ""


def _ctype(dtype: Any) -> str:
    return {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}[np.dtype(dtype)]


def _lines(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    n = shape[axis]
    inner = math.prod(shape[axis + 1:])
    return (math.prod(shape) // n if n else 0), n, inner


class HostStep(OpStep):
    """prod's and cumprod's node: on host buffers (the numpy device) the vjp computed
    straight in numpy (``host_vjp``: the same formulas, no easyad operations in between);
    elsewhere, and for create_graph, the op's vjp as any OpStep."""

    __slots__ = ()

    def __call__(self, g: Any) -> tuple[Any, ...]:
        x, shape, dtype, index = self.operands[0]
        if not isinstance(x, np.ndarray) or x.dtype == object or \
                not isinstance(self.data, (np.ndarray, float, np.floating)):
            return super().__call__(g)
        if index < 0:
            return (None,)
        ct = _HOST_VJP[self.op.name](self.params, np.asarray(g, dtype=dtype), x,
                                     np.asarray(self.data))
        return (np.ascontiguousarray(ct, dtype=dtype),)


def _host_step(name: str) -> Any:
    return lambda p, cls, be, ops, bufs, out, shape, dtype: HostStep(
        get(name), p, cls, be, ops, out, shape, dtype)


def _exclusive(line: np.ndarray) -> np.ndarray:
    """The products of the earlier elements along the last axis (1 at the start)."""
    out = np.empty_like(line)
    out[..., 0] = 1.0
    np.cumprod(line[..., :-1], axis=-1, out=out[..., 1:])
    return out


def _prod_host_vjp(p: Any, g: np.ndarray, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    axes = p.axes or ()
    if x.size == 0:
        return np.zeros_like(x)
    rest = tuple(k for k in range(x.ndim) if k not in axes)
    order = rest + axes
    moved = x if order == tuple(range(x.ndim)) else np.transpose(x, order)
    line = moved.reshape(moved.shape[:len(rest)] + (-1,))
    both = (_exclusive(line) * _exclusive(line[..., ::-1])[..., ::-1]).reshape(moved.shape)
    if moved is not x:
        both = np.transpose(both, np.argsort(order))
    return both * g.reshape(_kept_shape(p, x.shape))


def _cumprod_host_vjp(p: Any, g: np.ndarray, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    if x.shape[p.axis] == 0:
        return np.zeros_like(x)
    last = p.axis == x.ndim - 1
    if not last:
        x, out, g = (np.moveaxis(v, p.axis, -1) for v in (x, out, g))
    coeff = np.empty_like(x)
    coeff[..., 0] = 0.0
    coeff[..., 1:] = x[..., :0:-1]
    back = _recurrence_last(coeff, g[..., ::-1])[..., ::-1]
    shifted = np.empty_like(out)
    shifted[..., 0] = 1.0
    shifted[..., 1:] = out[..., :-1]
    ct = shifted * back
    return ct if last else np.moveaxis(ct, -1, p.axis)


# ---- recurrence ----

@dataclasses.dataclass(frozen=True)
class AxisParams:
    axis: int


def _recurrence_rule(p: AxisParams, a: tuple[int, ...], b: tuple[int, ...]
                     ) -> tuple[tuple[int, ...], AxisParams]:
    if a != b:
        raise ValueError(f"recurrence: the coefficients' shape {a} differs from the "
                         f"terms' shape {b} (broadcast them first)")
    if not a:
        raise ValueError("recurrence: a 0-d operand has no axis")
    return a, AxisParams(_axis("recurrence", p.axis, len(a)))


def _recurrence_loop(a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
    out = np.array(b, dtype=np.result_type(a, b), copy=True)
    am, om = np.moveaxis(a, axis, 0), np.moveaxis(out, axis, 0)
    for k in range(1, om.shape[0]):
        om[k] = am[k] * om[k - 1] + om[k]
    return out


_BLOCK = 32


def _doubling(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # log2(n) rounds: after one, o_k covers the last 2*span terms (coefficients' products
    # in `big`): (A, B) after (A', B') is (A A', A B' + B)
    n, span = a.shape[-1], 1
    big, acc = a.copy(), b.copy()
    while span < n:
        acc[..., span:] = acc[..., span:] + big[..., span:] * acc[..., :n - span]
        big[..., span:] = big[..., span:] * big[..., :n - span]
        span *= 2
    return acc


def _scan_last(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The recurrence along the last axis. Small arrays: doubling rounds (fewer numpy
    calls); large ones in blocks (fewer passes over memory): the loop inside every block
    at once (``_BLOCK`` steps over all blocks), then the blocks' ends (a recurrence over
    blocks, with each block's coefficient product), then each block's start carried in."""
    n = a.shape[-1]
    if n <= 2 * _BLOCK or a.size <= 8192:
        return _doubling(a, b)
    return _blocks(a, b)


def _blocks(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = a.shape[-1]
    nb = -(-n // _BLOCK)
    lead = a.shape[:-1]
    if nb * _BLOCK != n:             # padded at the end: later places change no earlier one
        pad = [(0, 0)] * (a.ndim - 1) + [(0, nb * _BLOCK - n)]
        a, b = np.pad(a, pad), np.pad(b, pad)
    blocks_a = a.reshape(*lead, nb, _BLOCK)
    out = np.array(b, copy=True).reshape(*lead, nb, _BLOCK)
    for k in range(1, _BLOCK):
        out[..., k] += blocks_a[..., k] * out[..., k - 1]
    coeff = np.cumprod(blocks_a, axis=-1)      # a block's start's factor at each place
    ends = _scan_last(coeff[..., -1], out[..., -1])
    out[..., 1:, :] += coeff[..., 1:, :] * ends[..., :-1, None]
    return out.reshape(*lead, nb * _BLOCK)[..., :n]


def _recurrence_last(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The recurrence of float arrays along their last axis (a new array)."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = _scan_last(a, b)
    if not np.isfinite(out).all():    # the rounds' or blocks' products may overflow: the loop
        out = _recurrence_loop(a, b, a.ndim - 1)
    return out


def _recurrence_numpy(p: AxisParams, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype == object or b.dtype == object:     # Records, Traces: the loop, n products
        return _recurrence_loop(np.asarray(a, dtype=object), np.asarray(b, dtype=object),
                                p.axis)
    dtype = np.result_type(a, b)
    a, b = a.astype(dtype, copy=False), b.astype(dtype, copy=False)
    if p.axis == a.ndim - 1:
        return _recurrence_last(a, b)
    out = _recurrence_last(np.moveaxis(a, p.axis, -1), np.moveaxis(b, p.axis, -1))
    return np.ascontiguousarray(np.moveaxis(out, -1, p.axis))


def _recurrence_from_end(a: Any, h: Any, axis: int) -> Any:
    # c_k = h_k + a_(k+1) c_(k+1): the recurrence of the flipped operands, coefficients
    # shifted one place (flip(a)'s j-th belongs to place j+1 of the flipped recurrence)
    coeff = _shift(_flip(a, axis), axis, 0.0)
    return _flip(apply(RECURRENCE, AxisParams(axis), (coeff, _flip(h, axis))), axis)


def _recurrence_vjp(p: AxisParams, g: Any, a: Any, b: Any, out: Any) -> tuple[Any, Any]:
    c = _recurrence_from_end(a, g, p.axis)
    return _shift(out, p.axis, 0.0) * c, c


def _recurrence_jvp(p: AxisParams, tangents: Any, a: Any, b: Any, out: Any) -> Any:
    da, db = tangents
    return apply(RECURRENCE, p, (a, db + da * _shift(out, p.axis, 0.0)))


_RECURRENCE_KERNEL = """
__kernel void easyad_recurrence(__global const {t}* a, __global const {t}* b,
                                __global {t}* y, const long lines, const long n,
                                const long inner) {{
    const long line = get_global_id(0);
    if (line >= lines) return;
    const long start = (line / inner) * n * inner + line % inner;
    {t} o = b[start];
    y[start] = o;
    for (long k = 1; k < n; k++) {{
        const long at = start + k * inner;
        o = a[at] * o + b[at];
        y[at] = o;
    }}
}}
"""


def _recurrence_opencl(be: OpenCLBackend, p: AxisParams, a: Any, b: Any) -> Any:
    t = _ctype(a.dtype)
    kernel = be.kernel(_type(t) + _RECURRENCE_KERNEL.format(t=t), "easyad_recurrence",
                       [None, None, None, np.int64, np.int64, np.int64])
    lines, n, inner = _lines(tuple(a.shape), p.axis)
    out = be._empty(tuple(a.shape), a.dtype)
    be.launch(kernel, lines, a.data, b.data, out.data, lines, n, inner)
    return out


RECURRENCE: Op = register(Op(
    name="recurrence", params=AxisParams, rule=_recurrence_rule,
    numpy=_recurrence_numpy, vjp=_recurrence_vjp, jvp=_recurrence_jvp,
    batch=lambda p, b: (AxisParams(_shifted(p.axis, b)), b),
    opencl=_recurrence_opencl, objects=True,
    loop=lambda p, shapes, t: axis_lines(shapes[0], (p.axis,), t, "recurrence"),
    sample=lambda rng, dtype: ((rng.uniform(-1.2, 1.2, size=(3, 70, 5)).astype(dtype),
                                rng.normal(size=(3, 70, 5)).astype(dtype)), {"axis": 1}),
    doc="o_k = a_k o_(k-1) + b_k along an axis"))


def recurrence(a: Any, b: Any, axis: int = -1) -> Any:
    """``o_k = a_k o_(k-1) + b_k`` along ``axis`` with ``o_(-1) = 0`` (``a``'s first
    element along the axis is not used): a first-order linear recurrence, in every mode.

    >>> import numpy as np
    >>> from easyad.ops._prod_ops import recurrence
    >>> recurrence(np.array([9.0, 2.0, 3.0]), np.array([1.0, 1.0, 1.0])).tolist()
    [1.0, 3.0, 10.0]
    """
    from easyad.ops._apply import call
    return call(RECURRENCE, (a, b), {"axis": axis})


# ---- cumprod ----

def _cumprod_rule(p: AxisParams, shape: tuple[int, ...]) -> tuple[tuple[int, ...], AxisParams]:
    if not shape:
        raise ValueError("cumprod: a 0-d operand has no axis (ad.cumprod(x) with axis=None "
                         "makes it 1-d first, as numpy does)")
    return shape, AxisParams(_axis("cumprod", p.axis, len(shape)))


def _cumprod_vjp(p: AxisParams, g: Any, x: Any, out: Any) -> tuple[Any]:
    return (_shift(out, p.axis, 1.0) * _recurrence_from_end(x, g, p.axis),)


def _cumprod_jvp(p: AxisParams, tangents: Any, x: Any, out: Any) -> Any:
    return apply(RECURRENCE, p, (x, tangents[0] * _shift(out, p.axis, 1.0)))


_CUMPROD_KERNEL = """
__kernel void easyad_cumprod(__global const {t}* x, __global {t}* y, const long lines,
                             const long n, const long inner) {{
    const long line = get_global_id(0);
    if (line >= lines) return;
    const long start = (line / inner) * n * inner + line % inner;
    {t} total = x[start];
    y[start] = total;
    for (long k = 1; k < n; k++) {{          /* in order: numpy's products, line by line */
        total *= x[start + k * inner];
        y[start + k * inner] = total;
    }}
}}
"""


def _cumprod_opencl(be: OpenCLBackend, p: AxisParams, buf: Any) -> Any:
    t = _ctype(buf.dtype)
    kernel = be.kernel(_type(t) + _CUMPROD_KERNEL.format(t=t), "easyad_cumprod",
                       [None, None, np.int64, np.int64, np.int64])
    lines, n, inner = _lines(tuple(buf.shape), p.axis)
    out = be._empty(tuple(buf.shape), buf.dtype)
    be.launch(kernel, lines, buf.data, out.data, lines, n, inner)
    return out


CUMPROD: Op = register(Op(
    name="cumprod", params=AxisParams, rule=_cumprod_rule,
    numpy=lambda p, x: np.cumprod(x, axis=p.axis),
    vjp=_cumprod_vjp, jvp=_cumprod_jvp,
    batch=lambda p, b: (AxisParams(_shifted(p.axis, b)), b),
    opencl=_cumprod_opencl, objects=True, step=_host_step("cumprod"),
    loop=lambda p, shapes, t: axis_lines(shapes[0], (p.axis,), t, "cumprod"),
    sample=lambda rng, dtype: ((rng.uniform(0.5, 1.5, size=(3, 70, 5)).astype(dtype),),
                               {"axis": 1}),
    doc="running products along an axis"))


# ---- prod ----

def _others(p: ReduceParams, x: Any) -> Any:
    """Each element's product of the other elements over the reduced axes, in ``x``'s
    shape (exclusive prefix times exclusive suffix: no division)."""
    axes = p.axes or ()
    rest = tuple(k for k in range(x.ndim) if k not in axes)
    if len(axes) == 1:
        line, a = x, axes[0]
    else:                        # the reduced axes last, as one
        line = x.transpose(*rest, *axes) if rest + axes != tuple(range(x.ndim)) else x
        line = line.reshape(*line.shape[:len(rest)], -1)
        a = len(rest)
    prefix = _shift(apply(CUMPROD, AxisParams(a), (line,)), a, 1.0)
    suffix = _flip(_shift(apply(CUMPROD, AxisParams(a), (_flip(line, a),)), a, 1.0), a)
    both = prefix * suffix
    if len(axes) == 1:
        return both
    moved = tuple(x.shape[k] for k in rest) + tuple(x.shape[k] for k in axes)
    both = both.reshape(*moved)
    order = rest + axes
    back = tuple(order.index(k) for k in range(x.ndim))
    return both.transpose(*back) if back != tuple(range(x.ndim)) else both


def _kept_shape(p: ReduceParams, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if k in (p.axes or ()) else n for k, n in enumerate(shape))


def _prod_vjp(p: ReduceParams, g: Any, x: Any, out: Any) -> tuple[Any]:
    kept = _kept_shape(p, x.shape)
    g = g.reshape(kept) if hasattr(g, "reshape") else g
    return (g * _others(p, x),)


def _prod_jvp(p: ReduceParams, tangents: Any, x: Any, out: Any) -> Any:
    return _generic.sum(tangents[0] * _others(p, x), axis=p.axes, keepdims=p.keepdims)


_PROD_KERNEL = """
__kernel void easyad_prod(__global const {t}* x, __global {t}* y, const long lines,
                          const long n, const long inner) {{
    const long line = get_global_id(0);
    if (line >= lines) return;
    const long start = (line / inner) * n * inner + line % inner;
    {t} total = 1;
    for (long k = 0; k < n; k++) total *= x[start + k * inner];
    y[line] = total;
}}
"""


def _prod_opencl(be: OpenCLBackend, p: ReduceParams, buf: Any) -> Any:
    shape, axes = tuple(buf.shape), p.axes or ()
    out_shape = _prod_rule(p, shape)[0]
    rest = tuple(k for k in range(len(shape)) if k not in axes)
    if axes and axes != tuple(range(axes[0], axes[-1] + 1)):
        # the reduced axes made adjacent (last) by one strided copy
        order = rest + axes
        strides = _strides(shape)
        buf = be.strided(buf, 0, tuple(shape[k] for k in order),
                         tuple(strides[k] for k in order))
        shape, axes = tuple(buf.shape), tuple(range(len(rest), len(shape)))
    n = math.prod(shape[k] for k in axes)
    inner = math.prod(shape[axes[-1] + 1:]) if axes else 1
    lines = math.prod(shape) // n if n else math.prod(out_shape)
    t = _ctype(buf.dtype)
    kernel = be.kernel(_type(t) + _PROD_KERNEL.format(t=t), "easyad_prod",
                       [None, None, np.int64, np.int64, np.int64])
    out = be._empty(out_shape, buf.dtype)
    if lines:
        be.launch(kernel, lines, buf.data, out.data, lines, n, inner)
    return out


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _prod_rule(p: ReduceParams, shape: tuple[int, ...]
               ) -> tuple[tuple[int, ...], ReduceParams]:
    # a sum's shapes (an empty product is 1, as an empty sum is 0)
    axes = shapes.normalize_axes("prod", p.axes, len(shape))
    return shapes.reduce(shape, axes, p.keepdims), ReduceParams(axes, p.keepdims)


PROD: Op = register(Op(
    name="prod", params=ReduceParams, rule=_prod_rule,
    numpy=lambda p, x: np.multiply.reduce(x, axis=p.axes, keepdims=p.keepdims),
    vjp=_prod_vjp, jvp=_prod_jvp, batch=_reduce_batch,
    opencl=_prod_opencl, objects=True, step=_host_step("prod"),
    loop=lambda p, shapes, t: axis_lines(shapes[0], p.axes or (), t, "prod"),
    sample=lambda rng, dtype: ((rng.uniform(0.5, 1.5, size=(3, 70, 5)).astype(dtype),),
                               {"axes": (0, 2), "keepdims": False}),
    doc="products along axes (derivatives exact with zeros)"))

_HOST_VJP = {"prod": _prod_host_vjp, "cumprod": _cumprod_host_vjp}
