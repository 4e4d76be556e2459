"""Convolution as table ops: ``conv``, ``conv_transpose`` and ``conv_weight``, three
bilinear ops whose derivatives are each other, so every order closes.

Layout (torch's): the input ``x`` is ``(..., C_in, *S)`` (any number of leading axes,
batch axes included: ``(N, C, H, W)`` and ``(C, H, W)`` alike), the weight ``w`` is
``(C_out, C_in / groups, *K)``; d = ``w.ndim - 2`` spatial axes. With stride s,
padding (lo, hi) per axis and dilation r, the result is ``(..., C_out, *O)``,
``O = (S + lo + hi - r (K - 1) - 1) // s + 1``, and (cross-correlation, as torch)::

    y[n, g*Co + o, p] = sum_(c, k) w[g*Co + o, c, k] xpad[n, g*Ci + c, p*s + k*r]

- ``conv(x, w)``: the above. vjp: ``conv_transpose(g, w)`` to x, ``conv_weight(x, g)``
  to w; jvp ``conv(dx, w) + conv(x, dw)``.
- ``conv_transpose(g, w; size=S)``: the adjoint of ``conv`` in x, ``(..., C_out, *O) ->
  (..., C_in, *S)`` (``size`` fixes S: several S give the same O). torch's
  ``conv_transpose2d`` is this op (its weight ``(in, out / groups, *K)`` is the conv's).
  Since ``<h, conv_transpose(g, w)> = <conv(h, w), g> = <conv_weight(h, g), w>``, its vjp
  is ``conv(h, w)`` to g and ``conv_weight(h, g)`` to w.
- ``conv_weight(x, g; size=K)``: the adjoint of ``conv`` in w (the leading axes summed):
  ``<k, conv_weight(x, g)> = <conv(x, k), g>``, so its vjp is ``conv_transpose(g, k)`` to x
  and ``conv(x, k)`` to g.

numpy lowering: float32 and float64 arrays take ``_conv_cpu`` (im2col a few images at
a time, the GEMM writing NCHW, the stride-1 transpose as a convolution with the flipped
kernel; 3x3 stride-1 2-D ones as Winograd F(2x2, 3x3), ``_conv_winograd``: see there).
Object arrays take the whole-batch form below, im2col: the padded
input's windows are one ``as_strided`` view
``(C, *K, N, *O)`` copied once into columns ``(G, Ci*prod(K), N*prod(O))``; the
convolution is then one BLAS GEMM per group with the weight as ``(Co, Ci*prod(K))``
(the result's channels then moved behind N: one copy). The transpose runs the GEMM the
other way and adds the columns back window offset by window offset (prod(K) strided
adds); the weight's adjoint is one GEMM per group over ``N * prod(O)``. The same code runs on
object arrays of Records and Traces (``as_strided`` and matmul take them), which makes the
op a composition of scalar operations for the scalar engines. OpenCL: im2col and the
backend's GEMM (``_conv_gemm_cl``), or for small products (depthwise) a kernel per op
(``_conv_cl``), one work-item per element of the result; ``$EASYAD_OPENCL_CONV`` forces.

Batching: the leading axes are batch axes already, so a batch axis of ``x`` among them
needs no change of parameters; a weight per example (per-example gradients in the weight
make one) is one convolution with the groups multiplied by the batch
(``_grouped_over_batch``).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad.errors import ShapeError
from easyad.ops import _conv_cl, _conv_cpu, _conv_gemm_cl
from easyad.ops._apply import OpStep, apply, call
from easyad.ops._table import Op, register

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend
    from easyad.tensor._opencl import OpenCLBackend


@dataclasses.dataclass(frozen=True)
class ConvParams:
    """The geometry. Each tuple has one entry per spatial axis, or one for all of them
    (``()``: the default, 1 or 0); ``padding`` has d entries (both sides) or 2d (every
    axis' low sides, then every axis' high sides). ``size``: conv_transpose's result's and
    conv_weight's kernel's spatial shape (unused by conv). The shape rule makes them all
    explicit (d entries, 2d for padding)."""

    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    groups: int = 1
    size: tuple[int, ...] = ()
    lead: int = -1      # set by the rule: the first operand's axes before the channels


def _spread(name: str, what: str, values: tuple[int, ...], d: int, default: int,
            least: int) -> tuple[int, ...]:
    if not values:
        values = (default,)
    if len(values) == 1:
        values = values * d
    if len(values) != d:
        raise ValueError(f"{name}: {what} has {len(values)} entries for {d} spatial axes "
                         f"(give one, or one per axis)")
    if any(v < least for v in values):
        raise ValueError(f"{name}: {what} {values} must be at least {least}")
    return values


def _canonical(name: str, p: ConvParams, d: int) -> ConvParams:
    stride = _spread(name, "stride", p.stride, d, 1, 1)
    dilation = _spread(name, "dilation", p.dilation, d, 1, 1)
    pad = p.padding or (0,)
    if len(pad) == 1 or len(pad) == d:
        pad = _spread(name, "padding", pad, d, 0, 0) * 2
    elif len(pad) != 2 * d or min(pad) < 0:
        raise ValueError(f"{name}: padding {p.padding} must be d entries (both sides) or 2d "
                         f"(the low sides, then the high sides), none negative; d = {d}")
    if p.groups < 1:
        raise ValueError(f"{name}: groups must be at least 1, got {p.groups}")
    return ConvParams(stride, pad, dilation, p.groups, p.size, p.lead)


def out_size(p: ConvParams, spatial: tuple[int, ...], kernel: tuple[int, ...]
             ) -> tuple[int, ...]:
    """The result's spatial shape (p canonical); negative or zero where nothing fits."""
    d = len(kernel)
    return tuple((spatial[i] + p.padding[i] + p.padding[d + i] - p.dilation[i] *
                  (kernel[i] - 1) - 1) // p.stride[i] + 1 for i in range(d))


def _check_input(name: str, role: str, x: tuple[int, ...], d: int, channels: int,
                 what: str) -> None:
    if len(x) < d + 1:
        raise ShapeError(f"{name}: the {role} of shape {x} needs {d + 1} axes at least "
                         f"(channels, then {d} spatial): add a channel axis (x[None]) or "
                         f"give a weight of {len(x) + 1} axes")
    if x[-d - 1] != channels:
        raise ShapeError(f"{name}: the {role} of shape {x} has {x[-d - 1]} channels (axis "
                         f"{-d - 1}) where {what} has {channels}: the channels come before "
                         f"the {d} spatial axes (NCHW), move them there")


def _weight(name: str, w: tuple[int, ...], groups: int) -> int:
    if len(w) < 3:
        raise ShapeError(f"{name}: the weight of shape {w} needs 3 axes at least "
                         f"(out channels, in channels / groups, kernel...)")
    if w[0] % groups:
        raise ShapeError(f"{name}: {w[0]} out channels (the weight's axis 0) do not split "
                         f"into groups={groups}")
    return len(w) - 2


def _fits(name: str, p: ConvParams, spatial: tuple[int, ...], kernel: tuple[int, ...]
          ) -> tuple[int, ...]:
    o = out_size(p, spatial, kernel)
    if min(o, default=1) < 1 or min(kernel, default=1) < 1:
        raise ShapeError(f"{name}: a kernel {kernel} with dilation {p.dilation} does not fit "
                         f"in the padded input {spatial} (padding {p.padding}): the result "
                         f"would be {o}; pad more or use a smaller kernel")
    return o


def _conv_rule(p: ConvParams, x: tuple[int, ...], w: tuple[int, ...]
               ) -> tuple[tuple[int, ...], ConvParams]:
    d = _weight("conv", w, p.groups)
    p = _canonical("conv", dataclasses.replace(p, size=()), d)
    _check_input("conv", "input", x, d, w[1] * p.groups,
                 f"the weight (in channels / groups {w[1]} x groups {p.groups})")
    return (x[:-d - 1] + (w[0],) + _fits("conv", p, x[-d:], w[2:]),
            dataclasses.replace(p, lead=len(x) - d - 1))


def _transpose_rule(p: ConvParams, g: tuple[int, ...], w: tuple[int, ...]
                    ) -> tuple[tuple[int, ...], ConvParams]:
    d = _weight("conv_transpose", w, p.groups)
    p = _canonical("conv_transpose", p, d)
    _check_input("conv_transpose", "input", g, d, w[0], "the weight (axis 0)")
    if len(p.size) != d:
        raise ValueError(f"conv_transpose: size={p.size} must give the result's {d} spatial "
                         f"extents")
    o = _fits("conv_transpose", p, p.size, w[2:])
    if o != g[-d:]:
        raise ShapeError(f"conv_transpose: a result of spatial shape {p.size} convolves to "
                         f"{o}, not the input's {g[-d:]}: size must be one the convolution "
                         f"maps to the input's shape (output_padding < stride)")
    return (g[:-d - 1] + (w[1] * p.groups,) + p.size,
            dataclasses.replace(p, lead=len(g) - d - 1))


def _weight_rule(p: ConvParams, x: tuple[int, ...], g: tuple[int, ...]
                 ) -> tuple[tuple[int, ...], ConvParams]:
    d = len(p.size)
    if d < 1:
        raise ValueError("conv_weight: size= must give the kernel's spatial extents")
    p = _canonical("conv_weight", p, d)
    if len(x) < d + 1 or len(g) != len(x) or g[:-d - 1] != x[:-d - 1]:
        raise ShapeError(f"conv_weight: the input {x} and the adjoint {g} need the same "
                         f"leading axes and {d + 1} more each")
    if x[-d - 1] % p.groups or g[-d - 1] % p.groups:
        raise ShapeError(f"conv_weight: channels {x[-d - 1]} and {g[-d - 1]} do not split "
                         f"into groups={p.groups}")
    o = _fits("conv_weight", p, x[-d:], p.size)
    if o != g[-d:]:
        raise ShapeError(f"conv_weight: the adjoint's spatial shape {g[-d:]} is not the "
                         f"convolution's {o}")
    return (g[-d - 1], x[-d - 1] // p.groups) + p.size, p


# ---- the numpy lowering ----

def _flat(x: np.ndarray, d: int) -> np.ndarray:
    """x as (N, C, *S): the leading axes as one."""
    return x.reshape((-1,) + x.shape[-d - 1:])


def _padded(x: np.ndarray, p: ConvParams, d: int) -> np.ndarray:
    if not any(p.padding):
        return x
    lo, hi = p.padding[:d], p.padding[d:]
    out = np.zeros(x.shape[:2] + tuple(s + a + b for s, a, b in zip(x.shape[2:], lo, hi)),
                   dtype=x.dtype)
    if x.dtype == object:
        out[...] = 0.0
    out[(slice(None),) * 2 + tuple(slice(a, a + s) for a, s in zip(lo, x.shape[2:]))] = x
    return out


def _columns(x: np.ndarray, p: ConvParams, kernel: tuple[int, ...], groups: int
             ) -> np.ndarray:
    """The windows of x (N, C, *S), padded, as columns ``(G, Ci*prod(K), N*prod(O))``: one
    copy of one ``as_strided`` view, ready for one GEMM per group (a few large GEMMs run
    far better than N small ones on a loaded machine's BLAS threads)."""
    d = len(kernel)
    xp = np.ascontiguousarray(_padded(x, p, d))
    o = out_size(p, x.shape[2:], kernel)
    st = xp.strides
    kst = tuple(st[2 + i] * p.dilation[i] for i in range(d))
    ost = tuple(st[2 + i] * p.stride[i] for i in range(d))
    n, c = xp.shape[:2]
    view = np.lib.stride_tricks.as_strided(
        xp, (c,) + kernel + (n,) + o, (st[1],) + kst + (st[0],) + ost, writeable=False)
    return _scratch(view).reshape(groups, -1, n * math.prod(o))


_SCRATCH = threading.local()


def _scratch(view: np.ndarray) -> np.ndarray:
    """``view`` copied into this thread's scratch buffer for its dtype, made once and
    grown as needed: the columns are used at once by the GEMM and dropped, and a fresh
    buffer of tens of MB costs its page faults again at every call (measured: the copy
    into a new array 31 ms, into a kept one 16 ms, 58 MB float32). Callers use the
    result before the next call in the same thread (no op calls back into easyad)."""
    if view.dtype == object:
        return np.ascontiguousarray(view)
    kept = getattr(_SCRATCH, "buffers", None)
    if kept is None:
        kept = _SCRATCH.buffers = {}
    size = view.size
    buf = kept.get(view.dtype)
    if buf is None or buf.size < size:
        buf = kept[view.dtype] = np.empty(size, dtype=view.dtype)
    out = buf[:size].reshape(view.shape)
    np.copyto(out, view)
    return out


def _by_group(a: np.ndarray, groups: int) -> np.ndarray:
    """(N, C, *O) as (G, C / G, N*prod(O)) (the channels first: one copy)."""
    n, c = a.shape[:2]
    return np.ascontiguousarray(np.moveaxis(a, 1, 0)).reshape(groups, c // groups, -1)


def _from_groups(y: np.ndarray, n: int, spatial: tuple[int, ...]) -> np.ndarray:
    """(G, C / G, N*prod(O)) back to (N, C, *O)."""
    return np.ascontiguousarray(np.moveaxis(y.reshape((-1, n) + spatial), 0, 1))


def _conv_numpy(p: ConvParams, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    d = w.ndim - 2
    o = out_size(p, tuple(x.shape[-d:]), tuple(w.shape[2:]))
    if _conv_cpu.takes(x, w):
        return _conv_cpu.conv(p, x, w, o)
    xf = _flat(x, d)
    cols = _columns(xf, p, w.shape[2:], p.groups)
    y = np.matmul(w.reshape(p.groups, w.shape[0] // p.groups, -1), cols)   # (G, Co, N*O)
    return _from_groups(y, xf.shape[0], o).reshape(x.shape[:-d - 1] + (w.shape[0],) + o)


def _add_back(cols: np.ndarray, p: ConvParams, spatial: tuple[int, ...],
              kernel: tuple[int, ...], o: tuple[int, ...]) -> np.ndarray:
    """The adjoint of ``_columns``: cols (C, *K, N, *O) added into the padded input at each
    window offset, the padding cut off, as (N, C, *S)."""
    d = len(kernel)
    c, n = cols.shape[0], cols.shape[1 + d]
    lo = p.padding[:d]
    full = tuple(s + a + b for s, a, b in zip(spatial, lo, p.padding[d:]))
    xp = np.zeros((c, n) + full, dtype=cols.dtype)
    if cols.dtype == object:
        xp[...] = 0.0
    for k in itertools.product(*(range(k) for k in kernel)):
        at = tuple(slice(k[i] * p.dilation[i],
                         k[i] * p.dilation[i] + (o[i] - 1) * p.stride[i] + 1, p.stride[i])
                   for i in range(d))
        xp[(slice(None), slice(None)) + at] += cols[(slice(None),) + k]
    if any(p.padding):
        xp = xp[(slice(None),) * 2 + tuple(slice(a, a + s) for a, s in zip(lo, spatial))]
    return np.ascontiguousarray(np.moveaxis(xp, 0, 1))


def _transpose_numpy(p: ConvParams, g: np.ndarray, w: np.ndarray) -> np.ndarray:
    if _conv_cpu.takes(g, w):
        return _conv_cpu.conv_transpose(p, g, w)
    d = w.ndim - 2
    gf = _flat(g, d)
    kernel, o = w.shape[2:], gf.shape[2:]
    groups = p.groups
    wm = np.ascontiguousarray(w.reshape(groups, w.shape[0] // groups, -1).swapaxes(1, 2))
    cols = np.matmul(wm, _by_group(gf, groups))                    # (G, Ci*K, N*O)
    cols = cols.reshape((w.shape[1] * groups,) + kernel + (gf.shape[0],) + o)
    x = _add_back(cols, p, p.size, kernel, o)
    return x.reshape(g.shape[:-d - 1] + x.shape[1:])


def _weight_numpy(p: ConvParams, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    if _conv_cpu.takes(x, g):
        return _conv_cpu.conv_weight(p, x, g)
    d = len(p.size)
    xf, gf = _flat(x, d), _flat(g, d)
    groups = p.groups
    cols = _columns(xf, p, p.size, groups)                       # (G, Ci*K, N*O)
    gm = _by_group(gf, groups)
    # (Ci*K, N*O) @ (N*O, Co) per group, then transposed: OpenBLAS runs this orientation
    # 5-7x faster than (Co, N*O) @ (N*O, Ci*K) (measured: 46 vs 325 ms at 64x32x28x28)
    w = np.stack([(cols[k] @ gm[k].T).T for k in range(groups)])   # (G, Co, Ci*K)
    return w.reshape((gf.shape[1], xf.shape[1] // groups) + p.size)


# ---- the derivatives: each op's are the other two ----

def _conv_vjp(p: ConvParams, g: Any, x: Any, w: Any, out: Any,
              needs: tuple[bool, bool] = (True, True)) -> tuple[Any, Any]:
    d = len(w.shape) - 2
    return (apply(CONV_TRANSPOSE, dataclasses.replace(p, size=tuple(x.shape[-d:])), (g, w))
            if needs[0] else None,
            apply(CONV_WEIGHT, dataclasses.replace(p, size=tuple(w.shape[2:])), (x, g))
            if needs[1] else None)


def _conv_jvp(p: ConvParams, t: tuple[Any, Any], x: Any, w: Any, out: Any) -> Any:
    return apply(CONV, p, (t[0], w)) + apply(CONV, p, (x, t[1]))


def _transpose_vjp(p: ConvParams, h: Any, g: Any, w: Any, out: Any,
                   needs: tuple[bool, bool] = (True, True)) -> tuple[Any, Any]:
    plain = dataclasses.replace(p, size=())
    return (apply(CONV, plain, (h, w)) if needs[0] else None,
            apply(CONV_WEIGHT, dataclasses.replace(p, size=tuple(w.shape[2:])), (h, g))
            if needs[1] else None)


def _transpose_jvp(p: ConvParams, t: tuple[Any, Any], g: Any, w: Any, out: Any) -> Any:
    return apply(CONV_TRANSPOSE, p, (t[0], w)) + apply(CONV_TRANSPOSE, p, (g, t[1]))


def _weight_vjp(p: ConvParams, k: Any, x: Any, g: Any, out: Any,
                needs: tuple[bool, bool] = (True, True)) -> tuple[Any, Any]:
    d = len(p.size)
    return (apply(CONV_TRANSPOSE, dataclasses.replace(p, size=tuple(x.shape[-d:])), (g, k))
            if needs[0] else None,
            apply(CONV, dataclasses.replace(p, size=()), (x, k)) if needs[1] else None)


def _weight_jvp(p: ConvParams, t: tuple[Any, Any], x: Any, g: Any, out: Any) -> Any:
    return apply(CONV_WEIGHT, p, (t[0], g)) + apply(CONV_WEIGHT, p, (x, t[1]))


def _step(name: str) -> Any:
    """The node's step: OpStep, whose vjp computes only the cotangents of operands on the
    tape (a convolution of data, the first layer's, needs no input cotangent: its
    conv_transpose, as costly as the convolution, is skipped)."""
    def make(p: ConvParams, cls: type, be: Backend, operands: list[Any], bufs: Any, out: Any,
             shape: tuple[int, ...], dtype: Any) -> OpStep:
        op = _OPS[name]
        needs = tuple(o.index >= 0 for o in operands)
        if not all(needs):
            vjp = op.vjp
            op = dataclasses.replace(op, vjp=lambda q, g, *xs: vjp(q, g, *xs, needs=needs))
        # no output kept: the three convolutions' vjps never read it (so the output's
        # buffer is its tensor's alone: nn's bias goes into it, and it is freed sooner)
        return OpStep(op, p, cls, be, operands, None, shape, dtype)
    return make


def _leading_batch(name: str) -> Any:
    def batch(p: ConvParams, axis: int) -> tuple[ConvParams, int]:
        # (the rule ran on one slice: a batch axis among its leading axes, or in front of
        # the channels, is one more leading axis; elsewhere it would be read as a channel
        # or spatial axis)
        if not 0 <= axis <= p.lead:
            raise NotImplementedError(f"{name}'s batching rule takes a batch axis before "
                                      f"the channels (axis 0 to {p.lead} of the input): "
                                      f"move it there first")
        return p, axis
    batch.__doc__ = f"{name}'s batching rule: a batch axis before the channels"
    # (vmap: the input carries the batch, the weight is one for every example; a weight
    # per example, as per-example gradients in it make, is the grouped convolution below)
    batch.first_operand_only = True         # type: ignore[attr-defined]
    batch.per_example_weight = _grouped_over_batch   # type: ignore[attr-defined]
    return batch


def _move(a: Any, source: int, destination: int) -> Any:
    order = list(range(len(np.shape(a) if isinstance(a, np.ndarray) else a.shape)))
    order.insert(destination, order.pop(source))
    return a.transpose(order) if isinstance(a, np.ndarray) else a.transpose(*order)


def _grouped_over_batch(op: Op, p: ConvParams, x: Any, w: Any, size: int) -> Any:
    """conv or conv_transpose of B inputs ``(B, *lead, C, *S)`` with B weights ``(B, O,
    ...)`` as one convolution of B times the groups: example b's channels are the b-th
    block of ``B*C`` channels and its weight the b-th block of ``B*O`` rows, so each group
    sees one example's input and weight only (the derivatives are conv's own)."""
    shape = tuple(x.shape)
    lead = len(shape) - len(tuple(w.shape)) + 1          # (B, *lead, C, *S): lead axes
    d = len(tuple(w.shape)) - 3
    xs = _move(x, 0, lead).reshape(shape[1:lead + 1] + (size * shape[lead + 1],)
                                   + shape[lead + 2:])
    ws = w.reshape((size * w.shape[1],) + tuple(w.shape[2:]))
    y = apply(op, dataclasses.replace(p, groups=p.groups * size), (xs, ws))
    out = tuple(y.shape)
    y = y.reshape(out[:lead] + (size, out[lead] // size) + out[lead + 1:])
    assert len(tuple(y.shape)) == lead + 2 + d
    return _move(y, lead, 0)


def _no_batch(p: ConvParams, axis: int) -> tuple[ConvParams, int]:
    raise NotImplementedError("conv_weight sums over its operands' leading axes: a batch "
                              "axis of them has no rule (map over it instead)")


# ---- OpenCL: im2col and the GEMM (``_conv_gemm_cl``) where the products are large
# enough, else a kernel per op (``_conv_cl``: one work-item per result element) ----

def _cl(name: str, which: str) -> Any:
    def lower(be: OpenCLBackend, p: ConvParams, a: Any, b: Any) -> Any:
        shape, _ = RULES[name](p, tuple(a.shape), tuple(b.shape))
        done = _conv_gemm_cl.run(be, which, p, a, b, shape)
        if done is not None:
            return done
        d = len(p.size)          # (conv_weight; the others read d from the weight)
        if which == "conv":
            d = len(b.shape) - 2
            x_spatial, out_spatial, kernel = tuple(a.shape[-d:]), shape[-d:], b.shape[2:]
            c, cout, ci = a.shape[-d - 1], b.shape[0], b.shape[1]
        elif which == "transpose":
            d = len(b.shape) - 2
            x_spatial, out_spatial, kernel = p.size, tuple(a.shape[-d:]), b.shape[2:]
            c, cout, ci = shape[-d - 1], b.shape[0], b.shape[1]
        else:
            x_spatial, out_spatial, kernel = tuple(a.shape[-d:]), tuple(b.shape[-d:]), p.size
            c, cout, ci = a.shape[-d - 1], b.shape[-d - 1], shape[1]
        geom = _conv_cl.geometry(x_spatial, tuple(kernel), tuple(out_spatial), p.stride,
                                 p.padding[:d], p.dilation)
        ints = [c, cout, ci, cout // p.groups]
        if which == "weight":
            ints = [math.prod(a.shape[:-d - 1])] + ints
        return _conv_cl.launch(be, "easyad_" + name, [a, b], shape, a.dtype, ints, [], geom)
    return lower


def _sample(which: str) -> Any:
    def one(rng: Any, dtype: Any, kw: dict[str, Any], xs: tuple[int, ...],
            ws: tuple[int, ...], gs: tuple[int, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        x, w, g = (rng.normal(size=s).astype(dtype) for s in (xs, ws, gs))
        if which == "conv":
            return (x, w), kw
        if which == "transpose":
            return (g, w), {**kw, "size": xs[2:]}
        return (x, g), {**kw, "size": ws[2:]}

    def sample(rng: Any, dtype: Any) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        # the direct kernels' route (3 out channels a group), then the GEMM's (4, depth 18)
        return [one(rng, dtype, {"stride": (2, 1), "padding": (1, 0, 1, 2),
                                 "dilation": (1, 2), "groups": 2},
                    (2, 4, 7, 6), (6, 2, 3, 2), (2, 6, 4, 6)),
                one(rng, dtype, {"stride": (2, 1), "padding": (1,), "dilation": (1, 2),
                                 "groups": 2}, (2, 4, 7, 6), (8, 2, 3, 3), (2, 8, 4, 4))]
    return sample


CONV: Op = register(Op(
    name="conv", params=ConvParams, rule=_conv_rule, numpy=_conv_numpy,
    vjp=_conv_vjp, jvp=_conv_jvp, batch=_leading_batch("conv"), objects=True,
    opencl=_cl("conv", "conv"), sample=_sample("conv"), step=_step("conv"),
    doc="N-d convolution (cross-correlation), torch's layout"))

CONV_TRANSPOSE: Op = register(Op(
    name="conv_transpose", params=ConvParams, rule=_transpose_rule, numpy=_transpose_numpy,
    vjp=_transpose_vjp, jvp=_transpose_jvp, batch=_leading_batch("conv_transpose"),
    objects=True, opencl=_cl("conv_transpose", "transpose"), sample=_sample("transpose"),
    step=_step("conv_transpose"),
    doc="the transpose (adjoint in the input) of conv"))

CONV_WEIGHT: Op = register(Op(
    name="conv_weight", params=ConvParams, rule=_weight_rule, numpy=_weight_numpy,
    vjp=_weight_vjp, jvp=_weight_jvp, batch=_no_batch, objects=True,
    opencl=_cl("conv_weight", "weight"), sample=_sample("weight"), step=_step("conv_weight"),
    doc="the adjoint of conv in its weight"))


_OPS = {"conv": CONV, "conv_transpose": CONV_TRANSPOSE, "conv_weight": CONV_WEIGHT}
RULES = {"conv": _conv_rule, "conv_transpose": _transpose_rule, "conv_weight": _weight_rule}


def _tuple(v: Any) -> tuple[int, ...]:
    return (v,) if isinstance(v, (int, np.integer)) else tuple(v)


def conv(x: Any, w: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
         groups: int = 1) -> Any:
    """The convolution (cross-correlation, as torch's) of ``x`` ``(..., C_in, *S)`` with
    ``w`` ``(C_out, C_in / groups, *K)``, in every mode; ``padding`` per axis (both sides)
    or as 2d entries (the low sides, then the high sides). No bias (add it).

    >>> import numpy as np, easyad as ad
    >>> ad.ops.conv(np.arange(5.0)[None], np.array([[[1.0, -1.0]]]))
    array([[-1., -1., -1., -1.]])
    """
    return call(CONV, (x, w), {"stride": _tuple(stride), "padding": _tuple(padding),
                               "dilation": _tuple(dilation), "groups": groups})


def conv_transpose(g: Any, w: Any, size: Any, stride: Any = 1, padding: Any = 0,
                   dilation: Any = 1, groups: int = 1) -> Any:
    """The transpose of ``conv`` in its input: ``g`` ``(..., C_out, *O)`` to
    ``(..., C_in, *size)``, ``w`` as conv's (torch's ``conv_transpose`` weight). ``size``
    is the result's spatial shape (the convolution with these parameters maps it to O).

    >>> import numpy as np, easyad as ad
    >>> ad.ops.conv_transpose(np.ones((1, 2)), np.array([[[1.0, -1.0]]]), size=(3,))
    array([[ 1.,  0., -1.]])
    """
    return call(CONV_TRANSPOSE, (g, w), {
        "stride": _tuple(stride), "padding": _tuple(padding), "dilation": _tuple(dilation),
        "groups": groups, "size": _tuple(size)})
