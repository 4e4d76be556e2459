"""The built-in table ops: each one registration (see ``_table``) and its public function.

- ``flip``: the order of the elements along some axes reversed. Linear; its own vjp; its
  lowering for every device is a composite (one strided copy with negative strides), so
  recorded programs fuse it like any view.
- ``concatenate``: operands joined along an axis (``ad.concatenate`` and ``ad.stack`` on
  tensors). Linear in all its operands; its vjp slices the adjoint; a composite (one
  assemble).
- ``cumsum``: running sums along one axis. Linear; its vjp is the running sum from the
  end (flip, cumsum, flip); an OpenCL kernel (one work-item per line along the axis, in
  order: the same additions as numpy's for each line) and a line loop (``Op.loop``), so a
  recorded program's fused C runs it as a C function.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad.ops._apply import apply, call
from easyad.ops._loops import axis_lines
from easyad.ops._table import Op, register
from easyad.tensor import _shapes, _structural
from easyad.tensor._generic import NUMPY_FUNCTIONS

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend
    from easyad.tensor._opencl import OpenCLBackend


def _axis(name: str, axis: int, ndim: int) -> int:
    """``axis`` of an operand of ``ndim`` axes made non-negative, or numpy's AxisError."""
    if not -ndim <= axis < ndim:
        raise np.exceptions.AxisError(f"{name}: axis {axis} is out of bounds for an array of "
                                      f"{ndim} dimension(s)")
    return axis % ndim


def _shifted(axis: int, batch_axis: int) -> int:
    """An operand's ``axis`` once a batch axis is inserted at ``batch_axis``."""
    return axis if axis < batch_axis else axis + 1


# ---- flip ----

@dataclasses.dataclass(frozen=True)
class FlipParams:
    axes: tuple[int, ...] | None = None      # None: every axis


def _flip_rule(p: FlipParams, shape: tuple[int, ...]) -> tuple[tuple[int, ...], FlipParams]:
    ndim = len(shape)
    axes = tuple(range(ndim)) if p.axes is None else \
        tuple(sorted(_axis("flip", a, ndim) for a in p.axes))
    if len(set(axes)) != len(axes):
        raise ValueError(f"flip: an axis is repeated in {p.axes}")
    return shape, FlipParams(axes)


def _flip_composite(be: Backend, p: FlipParams, buf: Any) -> Any:
    # a view that starts at the last element of each flipped axis and walks back
    shape, axes = tuple(buf.shape), p.axes or ()      # canonical: the rule named them
    strides = list(_shapes.contiguous_strides(shape))
    offset = sum((shape[a] - 1) * strides[a] for a in axes if shape[a])
    for a in axes:
        strides[a] = -strides[a]
    return be.strided(buf, offset, shape, tuple(strides))


FLIP: Op = register(Op(
    name="flip", params=FlipParams, rule=_flip_rule,
    numpy=lambda p, x: np.flip(x, axis=p.axes),
    vjp=lambda p, g, x, out: (apply(FLIP, p, (g,)),),
    batch=lambda p, b: (FlipParams(tuple(_shifted(a, b) for a in p.axes or ())), b),
    composite=_flip_composite, linear=True, objects=True,
    doc="the elements' order reversed along axes"))


def flip(x: Any, axis: Any = None) -> Any:
    """``x`` with the order of its elements reversed along ``axis`` (an int, a tuple of
    ints, or None for every axis), as ``numpy.flip``; on numbers, arrays, Tensors,
    TraceTensors and object arrays of Records or Traces, in every mode.

    >>> import numpy as np, easyad as ad
    >>> ad.flip(np.array([[1.0, 2.0], [3.0, 4.0]]), axis=1)
    array([[2., 1.],
           [4., 3.]])
    """
    axes = None if axis is None else ((axis,) if isinstance(axis, (int, np.integer))
                                      else tuple(axis))
    return call(FLIP, (x,), {"axes": axes})


# ---- cumsum ----

@dataclasses.dataclass(frozen=True)
class CumsumParams:
    axis: int


def _cumsum_rule(p: CumsumParams, shape: tuple[int, ...]
                 ) -> tuple[tuple[int, ...], CumsumParams]:
    if not shape:
        raise ValueError("cumsum: a 0-d operand has no axis (ad.cumsum(x) with axis=None "
                         "makes it 1-d first, as numpy does)")
    return shape, CumsumParams(_axis("cumsum", p.axis, len(shape)))


def _cumsum_vjp(p: CumsumParams, g: Any, x: Any, out: Any) -> tuple[Any]:
    # each input element reaches every later output: the running sum taken from the end
    back = FlipParams((p.axis,))
    return (apply(FLIP, back, (apply(CUMSUM, p, (apply(FLIP, back, (g,)),)),)),)


_CUMSUM_KERNEL = """
__kernel void easyad_cumsum(__global const {t}* x, __global {t}* y, const long lines,
                            const long n, const long inner) {{
    const long line = get_global_id(0);
    if (line >= lines) return;
    const long o = line / inner, i = line % inner;
    const long start = o * n * inner + i;
    {t} total = x[start];                    /* not 0 + x: numpy keeps a first -0.0 */
    y[start] = total;
    for (long k = 1; k < n; k++) {{          /* in order: numpy's additions, line by line */
        total += x[start + k * inner];
        y[start + k * inner] = total;
    }}
}}
"""


def _cumsum_opencl(be: OpenCLBackend, p: CumsumParams, buf: Any) -> Any:
    shape = tuple(buf.shape)
    t = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}[np.dtype(buf.dtype)]
    source = ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if t == "double" else "") + \
        _CUMSUM_KERNEL.format(t=t)
    kernel = be.kernel(source, "easyad_cumsum", [None, None, np.int64, np.int64, np.int64])
    n = shape[p.axis]
    inner = math.prod(shape[p.axis + 1:])
    lines = math.prod(shape) // n if n else 0
    out = be._empty(shape, buf.dtype)
    be.launch(kernel, lines, buf.data, out.data, lines, n, inner)
    return out


CUMSUM: Op = register(Op(
    name="cumsum", params=CumsumParams, rule=_cumsum_rule,
    numpy=lambda p, x: np.cumsum(x, axis=p.axis),
    vjp=_cumsum_vjp,
    batch=lambda p, b: (CumsumParams(_shifted(p.axis, b)), b),
    opencl=_cumsum_opencl, linear=True, objects=True,
    loop=lambda p, shapes, t: axis_lines(shapes[0], (p.axis,), t, "cumsum"),
    sample=lambda rng, dtype: ((rng.normal(size=(3, 70, 5)).astype(dtype),), {"axis": 1}),
    doc="running sums along an axis"))


def cumsum(x: Any, axis: int | None = None) -> Any:
    """The running sums of ``x`` along ``axis`` (None: of the flattened ``x``), as
    ``numpy.cumsum``; on arrays, Tensors, TraceTensors and object arrays of Records or
    Traces, in every mode.

    >>> import numpy as np, easyad as ad
    >>> ad.cumsum(np.array([[1.0, 2.0], [3.0, 4.0]]), axis=0)
    array([[1., 2.],
           [4., 6.]])
    """
    if axis is None:
        x = x.reshape(-1) if hasattr(x, "reshape") and not isinstance(x, (list, tuple)) \
            else np.reshape(np.asarray(x), -1)
        axis = 0
    return call(CUMSUM, (x,), {"axis": axis})


# ---- concatenate (and stack, which concatenates operands given a new axis) ----

@dataclasses.dataclass(frozen=True)
class ConcatenateParams:
    axis: int = 0


def _concatenate_rule(p: ConcatenateParams, *shape_list: tuple[int, ...]
                      ) -> tuple[tuple[int, ...], ConcatenateParams]:
    shape, axis = _shapes.concatenate("concatenate", list(shape_list), p.axis)
    return shape, ConcatenateParams(axis)


def _concatenate_composite(be: Backend, p: ConcatenateParams, *bufs: Any) -> Any:
    # each operand written into its part of the result (one assemble)
    first = tuple(bufs[0].shape)
    shape = first[:p.axis] + (sum(b.shape[p.axis] for b in bufs),) + first[p.axis + 1:]
    strides = list(_shapes.contiguous_strides(shape))
    parts, start = [], 0
    for b in bufs:
        parts.append((start * strides[p.axis], tuple(b.shape), tuple(strides), b))
        start += b.shape[p.axis]
    return be.assemble(shape, bufs[0].dtype, parts)


def _concatenate_vjp(p: ConcatenateParams, g: Any, *xs_and_out: Any) -> tuple[Any, ...]:
    # each operand's span of the adjoint along the axis
    xs = xs_and_out[:-1]
    lead = (slice(None),) * p.axis
    cts, start = [], 0
    for x in xs:
        size = x.shape[p.axis]
        cts.append(g[lead + (slice(start, start + size),)])
        start += size
    return tuple(cts)


CONCATENATE: Op = register(Op(
    name="concatenate", params=ConcatenateParams, rule=_concatenate_rule,
    numpy=lambda p, *xs: np.concatenate(xs, axis=p.axis),
    vjp=_concatenate_vjp,
    batch=lambda p, b: (ConcatenateParams(_shifted(p.axis, b)), b),
    composite=_concatenate_composite, linear=True, objects=True,
    doc="operands joined along an axis"))


# the tensor layer's joins call the table (it sits below: the call is registered there)
_structural.TABLE_OPS["concatenate"] = \
    lambda tensors, axis: call(CONCATENATE, tuple(tensors), {"axis": axis})

# numpy's functions on Tensors and TraceTensors (their __array_function__ reads this)
NUMPY_FUNCTIONS[np.flip] = flip
NUMPY_FUNCTIONS[np.cumsum] = cumsum
