"""The convolution ops on OpenCL as im2col and the backend's GEMM (``be.matmul``): the
route for GPUs, where ``_conv_cl``'s one work-item per result element, looping over its
window, leaves the device's arithmetic idle.

Columns: the padded windows of a chunk of ``nc`` samples as ``(C, *K, nc, *O)``, i.e.
``(G, Ci*prod(K), nc*L)`` with ``L = prod(O)`` (the batch inside each row, so the weight's
adjoint over the chunk is one product)::

    conv            y_g  = W_g (Co, Ci*K) @ cols_g (Ci*K, nc*L)          -> (N, Cout, *O)
    conv_weight     dW_g = g_g (Co, nc*L) @ cols_g^T (nc*L, Ci*K)         (summed over chunks)
    conv_transpose  dcols_g = W_g^T (Ci*K, Co) @ g_g (Co, nc*L), then col2im -> (N, C, *S)

``g_g`` is the result-shaped operand with its channels moved before the batch
(``to_groups``); ``from_groups`` moves them back. col2im runs one work-item per INPUT
element, summing the columns that read it in a fixed order: no atomics, deterministic.
The transposed operands are read in place by the GEMM (``transpose_a``/``transpose_b``).
The columns of a chunk stay under ``COLS_BUDGET`` bytes (chunks over the batch).

Which route: ``$EASYAD_OPENCL_CONV`` (``gemm`` or ``direct``), else by shape on every
device: ``gemm`` where the products have ``MIN_ROWS`` rows and ``MIN_DEPTH`` depth, the
direct kernels below (depthwise). Measured on PoCL (a loaded 2-core CPU, float32,
64x32x28x28, 3x3, padding 1): forward 338 vs 463 ms, forward+backward 655 vs 2091 ms;
float64 496 vs 796 and 1097 vs 3258 ms; a depthwise 3x3 the other way, 997 vs 195 ms.
"""
from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad.ops import _conv_cl

if TYPE_CHECKING:
    from easyad.tensor._opencl import OpenCLBackend

COLS_BUDGET = 256 << 20     # bytes of columns per chunk (tests lower it)
# the GEMM's rows (out channels per group) and depth (Ci * prod(K)) below which the direct
# kernels win: a depthwise 3x3 (1 row, depth 9) ran 10x slower as GEMMs on PoCL
MIN_ROWS, MIN_DEPTH = 4, 16
INT_LIMIT = 2**31 - 1       # the most elements an operand indexed in int may have

_KERNELS = """
/* index arithmetic in I: int where every index fits (64-bit division is slow on GPUs) */
#define G(v) ((I)(v))
#define SPLIT_I(E0, E1, E2, A0, A1, A2) \\
    const I A2 = id % G(E2); id /= G(E2); const I A1 = id % G(E1); id /= G(E1); \\
    const I A0 = id % G(E0); id /= G(E0);

/* columns (C, K0, K1, K2, nc, O0, O1, O2) of samples n0 .. n0 + nc of x (N, C, S0..2):
   zero where the window reads padding. A 3-d range (output position, sample, channel and
   window offset): what depends on the last two is the same along a work-group's row */
__kernel void easyad_im2col(__global const T* x, __global T* cols, const long total,
                            const long n0, const long nc, const long C, GEOM) {
    I id = G(get_global_id(0));
    if (id >= G(O0) * G(O1) * G(O2)) return;
    const I at = id;
    SPLIT_I(O0, O1, O2, o0, o1, o2)
    const I n = G(get_global_id(1));
    id = G(get_global_id(2));
    const I row = id * G(nc) + n;
    SPLIT_I(K0, K1, K2, k0, k1, k2)
    const I c = id;
    const I i0 = o0 * G(s0) - G(p0) + k0 * G(r0), i1 = o1 * G(s1) - G(p1) + k1 * G(r1),
            i2 = o2 * G(s2) - G(p2) + k2 * G(r2);
    T v = 0;
    if (i0 >= 0 && i0 < G(S0) && i1 >= 0 && i1 < G(S1) && i2 >= 0 && i2 < G(S2))
        v = x[((((G(n0) + n) * G(C) + c) * G(S0) + i0) * G(S1) + i1) * G(S2) + i2];
    cols[row * G(O0) * G(O1) * G(O2) + at] = v;
}

/* the adjoint of im2col: samples n0 .. n0 + nc of x (N, C, S0..2), each element the sum
   of the columns that read it, in a fixed order */
__kernel void easyad_col2im(__global const T* cols, __global T* x, const long total,
                            const long n0, const long nc, const long C, GEOM) {
    if ((long)get_global_id(0) >= total) return;
    I id = G(get_global_id(0));
    SPLIT_I(S0, S1, S2, i0, i1, i2)
    const I c = id % G(C), n = id / G(C);
    T acc = 0;
    for (I k0 = 0; k0 < G(K0); k0++) { const I t0 = i0 + G(p0) - k0 * G(r0);
      if (t0 < 0 || t0 % G(s0)) continue; const I o0 = t0 / G(s0); if (o0 >= G(O0)) continue;
      for (I k1 = 0; k1 < G(K1); k1++) { const I t1 = i1 + G(p1) - k1 * G(r1);
        if (t1 < 0 || t1 % G(s1)) continue; const I o1 = t1 / G(s1);
        if (o1 >= G(O1)) continue;
        for (I k2 = 0; k2 < G(K2); k2++) { const I t2 = i2 + G(p2) - k2 * G(r2);
          if (t2 < 0 || t2 % G(s2)) continue; const I o2 = t2 / G(s2);
          if (o2 >= G(O2)) continue;
          acc += cols[((((((c * G(K0) + k0) * G(K1) + k1) * G(K2) + k2) * G(nc) + n)
                        * G(O0) + o0) * G(O1) + o1) * G(O2) + o2];
    } } }
    x[n0 * C * S0 * S1 * S2 + get_global_id(0)] = acc;
}

/* samples n0 .. n0 + nc of a (N, C, L) as (C, nc, L) */
__kernel void easyad_to_groups(__global const T* a, __global T* out, const long total,
                               const long n0, const long nc, const long C, const long L) {
    if ((long)get_global_id(0) >= total) return;
    const I id = G(get_global_id(0));
    const I l = id % G(L), n = (id / G(L)) % G(nc), c = id / (G(L) * G(nc));
    out[id] = a[((G(n0) + n) * G(C) + c) * G(L) + l];
}

/* (C, nc, L) into samples n0 .. n0 + nc of y (N, C, L) */
__kernel void easyad_from_groups(__global const T* a, __global T* y, const long total,
                                 const long n0, const long nc, const long C, const long L) {
    if ((long)get_global_id(0) >= total) return;
    const I id = G(get_global_id(0));
    const I l = id % G(L), c = (id / G(L)) % G(C), n = id / (G(L) * G(C));
    y[n0 * C * L + get_global_id(0)] = a[(c * G(nc) + n) * G(L) + l];
}
"""

_GEOM_ARGS = [np.int64] * 18


def route(t: Any) -> str:
    """``gemm`` or ``direct`` for the op of geometry ``t`` (the module docstring)."""
    choice = os.environ.get("EASYAD_OPENCL_CONV") or (
        "gemm" if t.co >= MIN_ROWS and t.ci * t.k >= MIN_DEPTH else "direct")
    if choice not in ("gemm", "direct"):
        raise ValueError(f"EASYAD_OPENCL_CONV is {choice!r}: expected 'gemm' (im2col and "
                         f"the GEMM) or 'direct' (a kernel per op), or unset (chosen by "
                         f"shape)")
    return choice


def _kernel(be: OpenCLBackend, dtype: Any, name: str, geometry: bool, wide: bool) -> Any:
    """Kernel ``name``; ``wide``: its indices in long (some operand holds 2^31 elements)."""
    index = "#define I long\n" if wide else "#define I int\n"
    return be.kernel(_conv_cl.header(dtype) + index + _KERNELS, name,
                     [None, None] + [np.int64] * 4 + (_GEOM_ARGS if geometry else
                                                      [np.int64]))


def _chunks(n: int, per_sample: int) -> list[tuple[int, int]]:
    """(first sample, count) pairs covering n samples, each under COLS_BUDGET bytes of
    columns (at least one sample a chunk)."""
    step = max(1, min(n, COLS_BUDGET // max(per_sample, 1)))
    return [(n0, min(step, n - n0)) for n0 in range(0, n, step)]


class _Geometry:
    """One op's shapes: N samples of C channels and spatial S, weight (Cout, Ci, *K),
    result spatial O, G groups; ``geom`` the 18 longs of ``_conv_cl``."""

    def __init__(self, p: Any, n: int, c: int, cout: int, ci: int,
                 spatial: tuple[int, ...], kernel: tuple[int, ...], out: tuple[int, ...]
                 ) -> None:
        d = len(kernel)
        self.n, self.c, self.cout, self.ci, self.g = n, c, cout, ci, p.groups
        self.co = cout // p.groups
        self.k, self.s, self.ell = math.prod(kernel), math.prod(spatial), math.prod(out)
        # int indices unless an operand (input, result, all the columns) outgrows them
        self.wide = max(n * c * self.s, n * cout * self.ell, n * c * self.k * self.ell,
                        cout * ci * self.k) > INT_LIMIT
        self.geom = _conv_cl.geometry(spatial, kernel, out, p.stride, p.padding[:d],
                                      p.dilation)

    def chunks(self, itemsize: int) -> list[tuple[int, int]]:
        return _chunks(self.n, self.c * self.k * self.ell * itemsize)


def _im2col(be: OpenCLBackend, x: Any, t: _Geometry, n0: int, nc: int) -> Any:
    cols = be._empty((t.g, t.ci * t.k, nc * t.ell), x.dtype)
    total = t.c * t.k * nc * t.ell
    k = _kernel(be, x.dtype, "easyad_im2col", True, t.wide)
    width = min(64, be.group, -(-t.ell // 8) * 8)
    k(be.queue, (-(-t.ell // width) * width, nc, t.c * t.k), (width, 1, 1), x.data,
      cols.data, total, n0, nc, t.c, *t.geom)
    return cols


def _to_groups(be: OpenCLBackend, a: Any, t: _Geometry, n0: int, nc: int) -> Any:
    """Samples n0.. of the result-shaped a (N, Cout, *O) as (G, Co, nc*L)."""
    if t.n == 1 and t.g == 1:         # (1, Cout, L) is already that layout
        return be.reshape(a, (1, t.cout, t.ell))
    out = be._empty((t.g, t.co, nc * t.ell), a.dtype)
    total = t.cout * nc * t.ell
    k = _kernel(be, a.dtype, "easyad_to_groups", False, t.wide)
    be.launch(k, total, a.data, out.data, total, n0, nc, t.cout, t.ell)
    return out


def _geometry(which: str, p: Any, a: Any, b: Any, shape: tuple[int, ...]) -> _Geometry:
    if which == "weight":         # conv_weight(x, g) -> (Cout, Ci, *K)
        d = len(p.size)
        return _Geometry(p, math.prod(a.shape[:-d - 1]), a.shape[-d - 1], b.shape[-d - 1],
                         shape[1], tuple(a.shape[-d:]), tuple(p.size), tuple(b.shape[-d:]))
    d = len(b.shape) - 2
    if which == "conv":           # conv(x, w) -> (..., Cout, *O)
        return _Geometry(p, math.prod(a.shape[:-d - 1]), a.shape[-d - 1], b.shape[0],
                         b.shape[1], tuple(a.shape[-d:]), tuple(b.shape[2:]),
                         tuple(shape[-d:]))
    return _Geometry(p, math.prod(a.shape[:-d - 1]), shape[-d - 1], b.shape[0], b.shape[1],
                     tuple(p.size), tuple(b.shape[2:]), tuple(a.shape[-d:]))


def run(be: OpenCLBackend, which: str, p: Any, a: Any, b: Any, shape: tuple[int, ...]) -> Any:
    """Op ``which`` (``conv``, ``transpose``, ``weight``) of operands a, b by im2col and the
    GEMM, or None where the direct kernels are to run (``route``; empty operands)."""
    if not (math.prod(shape) and a.size and b.size):
        return None
    t = _geometry(which, p, a, b, shape)
    if route(t) == "direct":
        return None
    return {"conv": _conv, "transpose": _transpose, "weight": _weight}[which](
        be, t, a, b, shape)


def _conv(be: OpenCLBackend, t: _Geometry, x: Any, w: Any, shape: tuple[int, ...]) -> Any:
    wm = be.reshape(w, (t.g, t.co, t.ci * t.k))
    parts = t.chunks(x.dtype.itemsize)
    if parts == [(0, 1)] and t.g == 1:      # one sample: the product is the result
        return be.reshape(be.matmul(wm, _im2col(be, x, t, 0, 1)), shape)
    y = be._empty(shape, x.dtype)
    k = _kernel(be, x.dtype, "easyad_from_groups", False, t.wide)
    for n0, nc in parts:
        yg = be.matmul(wm, _im2col(be, x, t, n0, nc))          # (G, Co, nc*L)
        total = t.cout * nc * t.ell
        be.launch(k, total, yg.data, y.data, total, n0, nc, t.cout, t.ell)
    return y


def _transpose(be: OpenCLBackend, t: _Geometry, g: Any, w: Any, shape: tuple[int, ...]) -> Any:
    wm = be.reshape(w, (t.g, t.co, t.ci * t.k))
    x = be._empty(shape, g.dtype)
    k = _kernel(be, g.dtype, "easyad_col2im", True, t.wide)
    for n0, nc in t.chunks(g.dtype.itemsize):
        dcols = be.matmul(wm, _to_groups(be, g, t, n0, nc), transpose_a=True)
        total = nc * t.c * t.s
        be.launch(k, total, dcols.data, x.data, total, n0, nc, t.c, *t.geom)
    return x


def _weight(be: OpenCLBackend, t: _Geometry, x: Any, g: Any, shape: tuple[int, ...]) -> Any:
    total = None
    for n0, nc in t.chunks(x.dtype.itemsize):
        part = be.matmul(_to_groups(be, g, t, n0, nc), _im2col(be, x, t, n0, nc),
                         transpose_b=True)                         # (G, Co, Ci*K)
        total = part if total is None else be.map(
            "add", ("x + y",), {"x": total, "y": part}, part.shape, (part.dtype,))[0]
    return be.reshape(total, shape)
