"""Pooling as table ops over the last d axes (d = ``len(kernel)``; every axis before them
is a batch or channel axis, as in torch's ``(N, C, H, W)`` and ``(C, H, W)``).

Windows: kernel K, stride s (default K), padding (lo, hi) per axis, dilation r; the
result's extent ``O = (S + lo + hi - r (K - 1) - 1) // s + 1`` per axis (torch's with
``ceil_mode=False``; padding at most half the kernel, as torch requires).

- ``max_pool(x)``: the maximum of each window (padding is -inf, never chosen). Ties: the
  first maximum in the window's row-major order takes the whole derivative, as torch's
  CPU kernel does (it replaces only on a strictly greater value); a NaN is the maximum,
  and the window's last NaN takes the derivative (torch's kernel replaces on a NaN too).
  The derivatives are two ops of the same windows, which read x only to find each
  window's choice:
  ``max_pool_gather(h, x)`` (h at the elements x's windows choose: max_pool's jvp, and
  ``max_pool(x) = max_pool_gather(x, x)``) and ``max_pool_scatter(g, x)`` (g added back
  at those elements: max_pool's vjp). Each is linear in its first operand and the
  other's adjoint; in x they are piecewise constant (derivative 0). So every order closes.
- ``avg_pool(x)``: each window's sum over the divisor: the window's size (torch's
  default, ``count_include_pad=True``) or its elements inside the input. Linear; its
  adjoint ``avg_pool_transpose(g; size=S)`` spreads each g over its window; each is the
  other's vjp.

numpy lowerings: a loop over the prod(K) window offsets, each a strided slice of the
padded input (max: running np.maximum; the choice: comparisons with the maximum; sums:
strided adds). The gather and the scatter turn each window's choice into a flat index
of the padded input and run one fancy index, one assignment (windows that do not
overlap) or one ``np.bincount`` (they do): the strided loop of masked adds they
replaced took 2x as long (64x32x28x28 float32, 2x2: 19 -> 11 ms with the choice). A
max over the kernel axes of one ``as_strided`` view of all windows, or argmax of the
windows copied, ran 3-4x slower. avg_pool runs on object
arrays too (the scalar engines); the max pools do not (their choice compares values:
use tensors). OpenCL: a kernel per op (``_conv_cl``), one work-item per element of the
result (the scatter and the transpose gather over the windows covering their element).
Batching: a batch axis before the last d axes needs no change of parameters.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad.errors import ShapeError
from easyad.ops import _conv_cl
from easyad.ops._apply import apply, call
from easyad.ops._table import Op, register

if TYPE_CHECKING:
    from easyad.tensor._opencl import OpenCLBackend


@dataclasses.dataclass(frozen=True)
class PoolParams:
    """``kernel`` fixes d; ``stride`` (``()``: the kernel), ``padding`` (d entries, or 2d:
    the low sides then the high sides) and ``dilation`` one entry per axis or one for all;
    ``size``: the transposes' result's spatial shape."""

    kernel: tuple[int, ...]
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    count_include_pad: bool = True
    size: tuple[int, ...] = ()
    lead: int = -1      # set by the rule: the first operand's axes before the pooled ones


def _spread(name: str, what: str, values: tuple[int, ...], d: int, default: Any,
            least: int) -> tuple[int, ...]:
    values = values or (default if isinstance(default, tuple) else (default,))
    if len(values) == 1:
        values = values * d
    if len(values) != d or min(values) < least:
        raise ValueError(f"{name}: {what} {values} must have 1 or {d} entries, each at "
                         f"least {least}")
    return tuple(values)


def _canonical(name: str, p: PoolParams) -> PoolParams:
    d = len(p.kernel)
    if d < 1 or min(p.kernel) < 1:
        raise ValueError(f"{name}: kernel {p.kernel} needs one positive extent per pooled "
                         f"axis")
    stride = _spread(name, "stride", p.stride, d, p.kernel, 1)
    dilation = _spread(name, "dilation", p.dilation, d, 1, 1)
    pad = p.padding or (0,)
    if len(pad) in (1, d):
        pad = _spread(name, "padding", pad, d, 0, 0) * 2
    elif len(pad) != 2 * d or min(pad) < 0:
        raise ValueError(f"{name}: padding {p.padding} must have 1, {d} or {2 * d} entries, "
                         f"none negative")
    if any(max(pad[i], pad[d + i]) * 2 > p.kernel[i] for i in range(d)):
        raise ValueError(f"{name}: padding {pad[:d]} must be at most half the kernel "
                         f"{p.kernel} (torch's rule: a window of padding alone has no value)")
    return PoolParams(p.kernel, stride, pad, dilation, p.count_include_pad, p.size, p.lead)


def _out(p: PoolParams, spatial: tuple[int, ...]) -> tuple[int, ...]:
    d = len(p.kernel)
    return tuple((spatial[i] + p.padding[i] + p.padding[d + i] - p.dilation[i] *
                  (p.kernel[i] - 1) - 1) // p.stride[i] + 1 for i in range(d))


def _checked(name: str, p: PoolParams, x: tuple[int, ...]) -> tuple[int, ...]:
    d = len(p.kernel)
    if len(x) < d:
        raise ShapeError(f"{name}: an operand of shape {x} has fewer than the {d} axes the "
                         f"kernel {p.kernel} pools (give (N, C, *spatial) or (C, *spatial))")
    o = _out(p, x[-d:])
    if min(o) < 1:
        raise ShapeError(f"{name}: the kernel {p.kernel} (dilation {p.dilation}) does not "
                         f"fit in the spatial shape {x[-d:]} with padding {p.padding}: use "
                         f"a smaller kernel or pad more")
    return o


def _pool_rule(name: str) -> Any:
    def rule(p: PoolParams, x: tuple[int, ...]) -> tuple[tuple[int, ...], PoolParams]:
        p = _canonical(name, dataclasses.replace(p, size=()))
        return (x[:-len(p.kernel)] + _checked(name, p, x),
                dataclasses.replace(p, lead=len(x) - len(p.kernel)))
    return rule


def _pair_rule(name: str, scatter: bool) -> Any:
    """gather(h, x) -> pooled shape; scatter(g, x) -> x's shape: x fixes the windows."""
    def rule(p: PoolParams, first: tuple[int, ...], x: tuple[int, ...]
             ) -> tuple[tuple[int, ...], PoolParams]:
        p = _canonical(name, dataclasses.replace(p, size=()))
        pooled = x[:-len(p.kernel)] + _checked(name, p, x)
        want = pooled if scatter else x
        if first != want:
            raise ShapeError(f"{name}: the first operand's shape {first} should be {want} "
                             f"(the pooled shape of x {x})" if scatter else
                             f"{name}: the first operand's shape {first} should be x's {x}")
        return (x if scatter else pooled), dataclasses.replace(p, lead=len(x) - len(p.kernel))
    return rule


def _transpose_rule(p: PoolParams, g: tuple[int, ...]) -> tuple[tuple[int, ...], PoolParams]:
    p = _canonical("avg_pool_transpose", p)
    d = len(p.kernel)
    if len(p.size) != d:
        raise ValueError(f"avg_pool_transpose: size={p.size} must give the {d} spatial "
                         f"extents of the result")
    o = _checked("avg_pool_transpose", p, g[:-d] + p.size)
    if o != g[-d:]:
        raise ShapeError(f"avg_pool_transpose: a result of spatial shape {p.size} pools to "
                         f"{o}, not the operand's {g[-d:]}")
    return g[:-d] + p.size, dataclasses.replace(p, lead=len(g) - d)


# ---- the numpy lowerings ----

def _flat(x: np.ndarray, d: int) -> np.ndarray:
    return x.reshape((-1,) + x.shape[x.ndim - d:])


def _padded(x: np.ndarray, p: PoolParams, fill: float) -> np.ndarray:
    d = len(p.kernel)
    if not any(p.padding):
        return x
    lo, hi = p.padding[:d], p.padding[d:]
    out = np.full(x.shape[:1] + tuple(s + a + b for s, a, b in zip(x.shape[1:], lo, hi)),
                  fill, dtype=x.dtype)
    out[(slice(None),) + tuple(slice(a, a + s) for a, s in zip(lo, x.shape[1:]))] = x
    return out


def _offsets(p: PoolParams, o: tuple[int, ...]) -> Any:
    """Each window offset k (row-major) and the strided slice of the padded input it
    reads in every window."""
    d = len(p.kernel)
    for k in itertools.product(*(range(n) for n in p.kernel)):
        yield k, (slice(None),) + tuple(
            slice(k[i] * p.dilation[i], k[i] * p.dilation[i] + (o[i] - 1) * p.stride[i] + 1,
                  p.stride[i]) for i in range(d))


def _crop(xp: np.ndarray, p: PoolParams, spatial: tuple[int, ...]) -> np.ndarray:
    d = len(p.kernel)
    if not any(p.padding):
        return xp
    return xp[(slice(None),) + tuple(slice(a, a + s) for a, s in zip(p.padding[:d], spatial))]


def _max_numpy(p: PoolParams, x: np.ndarray) -> np.ndarray:
    d = len(p.kernel)
    xf = _flat(x, d)
    o = _out(p, x.shape[-d:])
    xp = _padded(xf, p, -np.inf)
    out = None
    for _, where in _offsets(p, o):      # (np.maximum propagates NaN, as torch's max)
        out = xp[where].copy() if out is None else np.maximum(out, xp[where], out=out)
    return out.reshape(x.shape[:-d] + o)


def _choice(p: PoolParams, xf: np.ndarray, o: tuple[int, ...]) -> np.ndarray:
    """Each window's first maximum, as the row-major offset within the window, (N, *O):
    the maximum first, then each offset from the last to the first marks where it is met
    (the first one written last). A window holding a NaN takes its last NaN, as torch's
    kernel (which replaces on a strictly greater value or a NaN)."""
    xp = _padded(xf, p, -np.inf)
    most = None
    for _, where in _offsets(p, o):
        most = xp[where].copy() if most is None else np.maximum(most, xp[where], out=most)
    # one byte an offset where it fits (less to write); the last offset is the default
    # (some offset holds the maximum: a window's NaNs are settled below)
    offsets = list(_offsets(p, o))
    at = np.full((xf.shape[0],) + o, len(offsets) - 1,
                 dtype=np.uint8 if len(offsets) < 256 else np.intp)
    met = np.empty(at.shape, dtype=bool)
    for j, (_, where) in reversed(list(enumerate(offsets))[:-1]):
        np.equal(xp[where], most, out=met)
        np.copyto(at, j, where=met)
    if np.isnan(most).any():       # (rare) NaN windows: the last NaN
        for j, (_, where) in enumerate(offsets):
            np.copyto(at, j, where=np.isnan(xp[where]))
    return at


def _chosen(p: PoolParams, xf: np.ndarray, o: tuple[int, ...]) -> np.ndarray:
    """Each window's choice as a flat index into the padded input (N, *P), shape (N, *O):
    the window's corner plus the chosen offset, both from small index tables."""
    d = len(p.kernel)
    full = tuple(s + a + b for s, a, b in zip(xf.shape[1:], p.padding[:d], p.padding[d:]))
    steps = np.array([math.prod(full[i + 1:]) for i in range(d)], dtype=np.intp)
    offsets = np.array([sum(k[i] * p.dilation[i] * steps[i] for i in range(d))
                        for k in itertools.product(*(range(n) for n in p.kernel))],
                       dtype=np.intp)
    corner = np.zeros(o, dtype=np.intp)
    for i in range(d):
        corner += (np.arange(o[i], dtype=np.intp) * (p.stride[i] * steps[i])).reshape(
            (-1,) + (1,) * (d - 1 - i))
    at = offsets[_choice(p, xf, o)]
    at += corner
    at += (np.arange(xf.shape[0], dtype=np.intp) * math.prod(full)).reshape(
        (-1,) + (1,) * d)
    return at


def _gather_numpy(p: PoolParams, h: np.ndarray, x: np.ndarray) -> np.ndarray:
    d = len(p.kernel)
    xf, hf = _flat(x, d), _flat(h, d)
    o = _out(p, x.shape[-d:])
    hp = _padded(hf, p, 0.0)
    out = hp.reshape(-1)[_chosen(p, xf, o)].astype(np.result_type(h, x), copy=False)
    return out.reshape(x.shape[:-d] + o)


def _scatter_numpy(p: PoolParams, g: np.ndarray, x: np.ndarray) -> np.ndarray:
    """One vectorised scatter of g at the chosen elements' flat indices. Windows that do
    not overlap (stride > dilation (kernel - 1) on every axis): each element is chosen
    at most once, an assignment. Overlapping ones: ``np.bincount`` sums each element's
    shares; it adds in float64, in the order of its indices, which are given windows
    last to first, so an element's shares come in the order of their offsets in the
    window as a strided-add loop over the offsets would add them: float64 agrees with
    that loop bitwise; float32's sum is rounded once from float64 (at most as far from
    the exact sum as float32 summation: an ulp or less for the few shares a window
    overlap gives)."""
    d = len(p.kernel)
    xf = _flat(x, d)
    o = _out(p, x.shape[-d:])
    dtype = np.result_type(g, x)
    full = xf.shape[:1] + tuple(s + a + b for s, a, b in zip(
        xf.shape[1:], p.padding[:d], p.padding[d:]))
    at = _chosen(p, xf, o).reshape(-1)
    gf = g.reshape(-1)
    if all(s > r * (k - 1) for s, r, k in zip(p.stride, p.dilation, p.kernel)):
        xp = np.zeros(math.prod(full), dtype=dtype)
        xp[at] = gf
    elif dtype in (np.float32, np.float64):
        xp = np.bincount(at[::-1], weights=gf[::-1], minlength=math.prod(full))
        xp = xp.astype(dtype, copy=False)
    else:                  # (complex) np.add.at: slow, but exact in any dtype
        xp = np.zeros(math.prod(full), dtype=dtype)
        np.add.at(xp, at, gf)
    return np.ascontiguousarray(_crop(xp.reshape(full), p, xf.shape[1:])).reshape(x.shape)


def _divisor(p: PoolParams, spatial: tuple[int, ...], o: tuple[int, ...]) -> Any:
    """Each window's divisor: its size, or (count_include_pad=False) how many of its
    elements lie inside the input, as an array of shape O."""
    if p.count_include_pad or not any(p.padding):
        return float(math.prod(p.kernel))
    ones = _padded(np.ones((1,) + spatial), p, 0.0)
    count = sum(ones[where] for _, where in _offsets(p, o))
    return count[0]


def _avg_numpy(p: PoolParams, x: np.ndarray) -> np.ndarray:
    d = len(p.kernel)
    xf = _flat(x, d)
    o = _out(p, x.shape[-d:])
    xp = _padded(xf, p, 0.0)
    total = None
    for _, where in _offsets(p, o):
        total = xp[where].copy() if total is None else total + xp[where]
    return (total / _divisor(p, x.shape[-d:], o)).reshape(x.shape[:-d] + o)


def _avg_transpose_numpy(p: PoolParams, g: np.ndarray) -> np.ndarray:
    d = len(p.kernel)
    gf = _flat(g, d)
    o = gf.shape[1:]
    share = gf / _divisor(p, p.size, o)
    lo, hi = p.padding[:d], p.padding[d:]
    xp = np.zeros(gf.shape[:1] + tuple(s + a + b for s, a, b in zip(p.size, lo, hi)),
                  dtype=gf.dtype)
    if gf.dtype == object:
        xp[...] = 0.0
    for _, where in _offsets(p, o):
        xp[where] += share
    return np.ascontiguousarray(_crop(xp, p, p.size)).reshape(g.shape[:-d] + p.size)


# ---- registrations ----

def _batch(p: PoolParams, axis: int) -> tuple[PoolParams, int]:
    # a batch axis before the pooled ones is one more leading axis; among them it would
    # be pooled
    if not 0 <= axis <= p.lead:
        raise NotImplementedError(f"pooling's batching rule takes a batch axis before the "
                                  f"{len(p.kernel)} pooled axes (axis 0 to {p.lead}): move "
                                  f"it there first")
    return p, axis


def _cl(kernel: str, scatter: bool = False, transpose: bool = False) -> Any:
    """The OpenCL lowering (``_conv_cl``): the pooled axes' geometry, the leading axes as
    one (the kernels' n)."""
    def lower(be: OpenCLBackend, p: PoolParams, *bufs: Any) -> Any:
        d = len(p.kernel)
        first = tuple(bufs[0].shape)
        if transpose:
            spatial, o, shape = p.size, first[-d:], first[:-d] + p.size
        else:
            x = tuple(bufs[-1].shape)
            spatial, o = x[-d:], _out(p, x[-d:])
            shape = x if scatter else x[:-d] + o
        geom = _conv_cl.geometry(spatial, p.kernel, o, p.stride, p.padding[:d], p.dilation)
        flags = [int(p.count_include_pad)] if kernel.startswith("easyad_avg") else []
        ins = list(bufs) if kernel != "easyad_max_pool_gather" or len(bufs) == 2 else \
            [bufs[0], bufs[0]]
        return _conv_cl.launch(be, kernel, ins, shape, bufs[0].dtype, [], flags, geom)
    return lower


def _sample(which: str) -> Any:
    def sample(rng: Any, dtype: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        x = rng.normal(size=(2, 3, 7, 6)).astype(dtype)
        x[0, 0, :2, :2] = 1.0                                      # a tie
        kw = {"kernel": (3, 2), "stride": (2, 1), "padding": (1, 1)}
        if which == "max":
            return (x,), {**kw, "dilation": (1, 2)}
        kw2 = {**kw, "dilation": (1, 2)}
        if which in ("gather", "scatter"):
            h = rng.normal(size=(2, 3, 4, 6) if which == "scatter" else x.shape).astype(dtype)
            return (h, x), kw2
        if which == "avg":
            return (x,), {**kw, "count_include_pad": False}
        return (rng.normal(size=(2, 3, 4, 7)).astype(dtype),), \
            {**kw, "count_include_pad": False, "size": (7, 6)}
    return sample


MAX_POOL: Op = register(Op(
    name="max_pool", params=PoolParams, rule=_pool_rule("max_pool"), numpy=_max_numpy,
    vjp=lambda p, g, x, out: (apply(MAX_POOL_SCATTER, p, (g, x)),),
    jvp=lambda p, t, x, out: apply(MAX_POOL_GATHER, p, (t[0], x)),
    batch=_batch, opencl=_cl("easyad_max_pool_gather"), sample=_sample("max"),
    doc="the maximum of each window (ties: the first)"))

MAX_POOL_GATHER: Op = register(Op(
    name="max_pool_gather", params=PoolParams, rule=_pair_rule("max_pool_gather", False),
    numpy=_gather_numpy,
    vjp=lambda p, g, h, x, out: (apply(MAX_POOL_SCATTER, p, (g, x)), None),
    jvp=lambda p, t, h, x, out: apply(MAX_POOL_GATHER, p, (t[0], x)),
    batch=_batch, opencl=_cl("easyad_max_pool_gather"), sample=_sample("gather"),
    doc="h at the elements x's max pool chooses"))

MAX_POOL_SCATTER: Op = register(Op(
    name="max_pool_scatter", params=PoolParams, rule=_pair_rule("max_pool_scatter", True),
    numpy=_scatter_numpy,
    vjp=lambda p, k, g, x, out: (apply(MAX_POOL_GATHER, p, (k, x)), None),
    jvp=lambda p, t, g, x, out: apply(MAX_POOL_SCATTER, p, (t[0], x)),
    batch=_batch, opencl=_cl("easyad_max_pool_scatter", scatter=True),
    sample=_sample("scatter"), doc="g added at the elements x's max pool chooses"))


def _avg_vjp(p: PoolParams, g: Any, x: Any, out: Any) -> tuple[Any]:
    d = len(p.kernel)
    return (apply(AVG_POOL_TRANSPOSE, dataclasses.replace(p, size=tuple(x.shape[-d:])),
                  (g,)),)


AVG_POOL: Op = register(Op(
    name="avg_pool", params=PoolParams, rule=_pool_rule("avg_pool"), numpy=_avg_numpy,
    vjp=_avg_vjp, batch=_batch, linear=True, objects=True,
    opencl=_cl("easyad_avg_pool"), sample=_sample("avg"), doc="the mean of each window"))

AVG_POOL_TRANSPOSE: Op = register(Op(
    name="avg_pool_transpose", params=PoolParams, rule=_transpose_rule,
    numpy=_avg_transpose_numpy,
    vjp=lambda p, h, g, out: (apply(AVG_POOL, dataclasses.replace(p, size=()), (h,)),),
    batch=_batch, linear=True, objects=True,
    opencl=_cl("easyad_avg_pool_transpose", transpose=True), sample=_sample("transpose"),
    doc="avg_pool's adjoint"))


def _tuple(v: Any) -> tuple[int, ...]:
    return (v,) if isinstance(v, (int, np.integer)) else tuple(v)


def _params(kernel: Any, stride: Any, padding: Any, dilation: Any) -> dict[str, Any]:
    return {"kernel": _tuple(kernel), "stride": () if stride is None else _tuple(stride),
            "padding": _tuple(padding), "dilation": _tuple(dilation)}


def max_pool(x: Any, kernel: Any, stride: Any = None, padding: Any = 0,
             dilation: Any = 1) -> Any:
    """The maximum of each window over the last ``len(kernel)`` axes of ``x`` (stride
    default: the kernel), in every mode; ties give the derivative to the first maximum.

    >>> import numpy as np, easyad as ad
    >>> ad.ops.max_pool(np.array([[1.0, 3.0, 2.0, 2.0]]), (2,))
    array([[3., 2.]])
    """
    return call(MAX_POOL, (x,), _params(kernel, stride, padding, dilation))


def avg_pool(x: Any, kernel: Any, stride: Any = None, padding: Any = 0,
             count_include_pad: bool = True) -> Any:
    """The mean of each window over the last ``len(kernel)`` axes of ``x`` (the padding
    counted in the divisor unless ``count_include_pad=False``), in every mode.

    >>> import numpy as np, easyad as ad
    >>> ad.ops.avg_pool(np.array([[1.0, 3.0, 2.0, 2.0]]), (2,))
    array([[2., 2.]])
    """
    kw = _params(kernel, stride, padding, 1)
    kw["count_include_pad"] = bool(count_include_pad)
    return call(AVG_POOL, (x,), kw)


def _bins(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in): torch's adaptive bins, window i = [floor(i n/m), ceil((i+1) n/m)),
    each row its window's mean."""
    a = np.zeros((n_out, n_in))
    for i in range(n_out):
        lo, hi = (i * n_in) // n_out, -((-(i + 1) * n_in) // n_out)
        a[i, lo:hi] = 1.0 / (hi - lo)
    return a


def adaptive_avg_pool(x: Any, size: Any) -> Any:
    """The mean over torch's adaptive windows of the last ``len(size)`` axes of ``x``, to
    the spatial shape ``size`` (an entry None keeps that axis). A composition, not a
    table op: the pooling is separable, one matmul per axis with a constant matrix of
    window means, so every engine differentiates it already.

    >>> import numpy as np, easyad as ad
    >>> ad.ops.adaptive_avg_pool(np.array([[1.0, 3.0, 2.0]]), (2,))
    array([[2. , 2.5]])
    """
    size = _tuple(size) if not isinstance(size, (tuple, list)) else tuple(size)
    shape = tuple(x.shape)
    d = len(size)
    if len(shape) < d:
        raise ShapeError(f"adaptive_avg_pool: an operand of shape {shape} has fewer than "
                         f"the {d} axes of output size {size}")
    out = x
    for i, m in enumerate(size):
        n = shape[len(shape) - d + i]
        m = n if m is None else int(m)
        if m < 1 or n < 1:
            raise ShapeError(f"adaptive_avg_pool: output size {size} and input extents "
                             f"{shape[-d:]} must be positive")
        if m == n:
            continue
        axis = len(shape) - d + i
        # the axis moved last, a matmul with the window means, moved back
        last = axis == len(shape) - 1
        moved = out if last else np.swapaxes(out, axis, -1)
        moved = moved @ _bins(n, m).T.astype(getattr(x, "dtype", np.float64))
        out = moved if last else np.swapaxes(moved, axis, -1)
    return out
