"""OpenCL kernels of the convolution and pooling ops (``_conv``, ``_pool``): one
work-item per element of the result, each looping over what it reads, in the order the
numpy lowering's definition gives (not its BLAS's: sums agree to rounding).

Geometry: up to 3 spatial axes; fewer are padded in front with axes of extent 1 (kernel
1, stride 1, padding 0, dilation 1), so one kernel serves 1-, 2- and 3-d. Every kernel
takes the 18 longs ``S0..2, K0..2, O0..2, s0..2, p0..2, r0..2`` (input extents, kernel,
result extents, stride, low padding, dilation) after its own arguments.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from easyad.tensor._opencl import OpenCLBackend

_GEOM = ", ".join(f"const long {n}{i}" for n in "SKOspr" for i in range(3))

_SOURCE = """
#define GEOM {geom}
#define T {t}

/* the window offset (k0, k1, k2) of output (o0, o1, o2) reads input (i0, i1, i2) */
#define WINDOW_LOOP(BODY) \\
    for (long k0 = 0; k0 < K0; k0++) {{ const long i0 = o0 * s0 - p0 + k0 * r0; \\
      if (i0 < 0 || i0 >= S0) continue; \\
      for (long k1 = 0; k1 < K1; k1++) {{ const long i1 = o1 * s1 - p1 + k1 * r1; \\
        if (i1 < 0 || i1 >= S1) continue; \\
        for (long k2 = 0; k2 < K2; k2++) {{ const long i2 = o2 * s2 - p2 + k2 * r2; \\
          if (i2 < 0 || i2 >= S2) continue; \\
          BODY }} }} }}

/* the outputs (o0, o1, o2) whose window offset (k0, k1, k2) reads input (i0, i1, i2) */
#define COVER_LOOP(BODY) \\
    for (long k0 = 0; k0 < K0; k0++) {{ const long t0 = i0 + p0 - k0 * r0; \\
      if (t0 < 0 || t0 % s0) continue; const long o0 = t0 / s0; if (o0 >= O0) continue; \\
      for (long k1 = 0; k1 < K1; k1++) {{ const long t1 = i1 + p1 - k1 * r1; \\
        if (t1 < 0 || t1 % s1) continue; const long o1 = t1 / s1; if (o1 >= O1) continue; \\
        for (long k2 = 0; k2 < K2; k2++) {{ const long t2 = i2 + p2 - k2 * r2; \\
          if (t2 < 0 || t2 % s2) continue; const long o2 = t2 / s2; if (o2 >= O2) continue; \\
          BODY }} }} }}

#define SPLIT(E0, E1, E2, A0, A1, A2) \\
    const long A2 = id % E2; id /= E2; const long A1 = id % E1; id /= E1; \\
    const long A0 = id % E0; id /= E0;
"""

_KERNELS = """
__kernel void easyad_conv(__global const T* x, __global const T* w, __global T* y,
                          const long total, const long C, const long Cout, const long Ci,
                          const long Co, GEOM) {{
    long id = get_global_id(0);
    if (id >= total) return;
    SPLIT(O0, O1, O2, o0, o1, o2)
    const long co = id % Cout, n = id / Cout, grp = co / Co;
    T acc = 0;
    for (long ci = 0; ci < Ci; ci++) {{
        const long xb = (n * C + grp * Ci + ci) * S0, wb = (co * Ci + ci) * K0;
        WINDOW_LOOP(acc += w[((wb + k0) * K1 + k1) * K2 + k2] *
                           x[((xb + i0) * S1 + i1) * S2 + i2];)
    }}
    y[get_global_id(0)] = acc;
}}

__kernel void easyad_conv_transpose(__global const T* g, __global const T* w,
                                    __global T* x, const long total, const long C,
                                    const long Cout, const long Ci, const long Co, GEOM) {{
    long id = get_global_id(0);
    if (id >= total) return;
    SPLIT(S0, S1, S2, i0, i1, i2)
    const long c = id % C, n = id / C, grp = c / Ci, ci = c % Ci;
    T acc = 0;
    for (long cl = 0; cl < Co; cl++) {{
        const long co = grp * Co + cl;
        const long gb = (n * Cout + co) * O0, wb = (co * Ci + ci) * K0;
        COVER_LOOP(acc += w[((wb + k0) * K1 + k1) * K2 + k2] *
                           g[((gb + o0) * O1 + o1) * O2 + o2];)
    }}
    x[get_global_id(0)] = acc;
}}

__kernel void easyad_conv_weight(__global const T* x, __global const T* g, __global T* w,
                                 const long total, const long N, const long C,
                                 const long Cout, const long Ci, const long Co, GEOM) {{
    long id = get_global_id(0);
    if (id >= total) return;
    SPLIT(K0, K1, K2, k0, k1, k2)
    const long ci = id % Ci, co = id / Ci, c = (co / Co) * Ci + ci;
    T acc = 0;
    for (long n = 0; n < N; n++) {{
        const long xb = (n * C + c) * S0, gb = (n * Cout + co) * O0;
        for (long o0 = 0; o0 < O0; o0++) {{ const long i0 = o0 * s0 - p0 + k0 * r0;
          if (i0 < 0 || i0 >= S0) continue;
          for (long o1 = 0; o1 < O1; o1++) {{ const long i1 = o1 * s1 - p1 + k1 * r1;
            if (i1 < 0 || i1 >= S1) continue;
            for (long o2 = 0; o2 < O2; o2++) {{ const long i2 = o2 * s2 - p2 + k2 * r2;
              if (i2 < 0 || i2 >= S2) continue;
              acc += x[((xb + i0) * S1 + i1) * S2 + i2] * g[((gb + o0) * O1 + o1) * O2 + o2];
        }} }} }}
    }}
    w[get_global_id(0)] = acc;
}}

/* the element of window (n, o) that max pooling chooses: the first strict maximum, or
   the last NaN (torch's rule); -1 for a window of padding alone (the rule forbids it) */
long easyad_choice(__global const T* x, const long n, const long o0, const long o1,
                   const long o2, GEOM) {{
    long at = -1; T best = 0;
    WINDOW_LOOP(const long e = ((n * S0 + i0) * S1 + i1) * S2 + i2; const T v = x[e];
                if (at < 0 || v > best || isnan(v)) {{ at = e; best = v; }})
    return at;
}}

__kernel void easyad_max_pool_gather(__global const T* h, __global const T* x,
                                     __global T* y, const long total, GEOM) {{
    long id = get_global_id(0);
    if (id >= total) return;
    SPLIT(O0, O1, O2, o0, o1, o2)
    const long at = easyad_choice(x, id, o0, o1, o2, S0, S1, S2, K0, K1, K2, O0, O1, O2,
                                  s0, s1, s2, p0, p1, p2, r0, r1, r2);
    y[get_global_id(0)] = at < 0 ? (T)0 : h[at];
}}

__kernel void easyad_max_pool_scatter(__global const T* g, __global const T* x,
                                      __global T* out, const long total, GEOM) {{
    long id = get_global_id(0);
    if (id >= total) return;
    const long me = id;
    SPLIT(S0, S1, S2, i0, i1, i2)
    const long n = id;
    T acc = 0;
    COVER_LOOP(if (easyad_choice(x, n, o0, o1, o2, S0, S1, S2, K0, K1, K2, O0, O1, O2,
                                 s0, s1, s2, p0, p1, p2, r0, r1, r2) == me)
                   acc += g[((n * O0 + o0) * O1 + o1) * O2 + o2];)
    out[me] = acc;
}}

/* avg_pool's divisor of window o: its size, or its elements inside the input */
T easyad_divisor(const int include_pad, const long o0, const long o1, const long o2, GEOM) {{
    if (include_pad) return (T)(K0 * K1 * K2);
    long count = 0;
    WINDOW_LOOP(count++;)
    return (T)count;
}}

__kernel void easyad_avg_pool(__global const T* x, __global T* y, const long total,
                              const int include_pad, GEOM) {{
    long id = get_global_id(0);
    if (id >= total) return;
    SPLIT(O0, O1, O2, o0, o1, o2)
    const long n = id;
    T acc = 0;
    WINDOW_LOOP(acc += x[((n * S0 + i0) * S1 + i1) * S2 + i2];)
    y[get_global_id(0)] = acc / easyad_divisor(include_pad, o0, o1, o2, S0, S1, S2, K0, K1,
                                               K2, O0, O1, O2, s0, s1, s2, p0, p1, p2, r0,
                                               r1, r2);
}}

__kernel void easyad_avg_pool_transpose(__global const T* g, __global T* out,
                                        const long total, const int include_pad, GEOM) {{
    long id = get_global_id(0);
    if (id >= total) return;
    SPLIT(S0, S1, S2, i0, i1, i2)
    const long n = id;
    T acc = 0;
    COVER_LOOP(acc += g[((n * O0 + o0) * O1 + o1) * O2 + o2] /
                      easyad_divisor(include_pad, o0, o1, o2, S0, S1, S2, K0, K1, K2, O0,
                                     O1, O2, s0, s1, s2, p0, p1, p2, r0, r1, r2);)
    out[get_global_id(0)] = acc;
}}
"""


def header(dtype: Any) -> str:
    """The geometry macros (GEOM, T, WINDOW_LOOP, COVER_LOOP, SPLIT) for ``dtype``: the
    head of every convolution program (``_conv_gemm_cl``'s too)."""
    t = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}[np.dtype(dtype)]
    head = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if t == "double" else ""
    return head + _SOURCE.format(geom=_GEOM, t=t)


def _source(dtype: Any) -> str:
    return header(dtype) + _KERNELS.format()


def _three(values: tuple[int, ...], fill: int) -> tuple[int, ...]:
    return (fill,) * (3 - len(values)) + tuple(values)


def geometry(spatial: tuple[int, ...], kernel: tuple[int, ...], out: tuple[int, ...],
             stride: tuple[int, ...], low: tuple[int, ...], dilation: tuple[int, ...]
             ) -> list[int]:
    """The 18 geometry longs, the spatial axes padded in front to 3."""
    if len(kernel) > 3:
        raise NotImplementedError("the OpenCL kernels take up to 3 spatial axes")
    return [*_three(spatial, 1), *_three(kernel, 1), *_three(out, 1), *_three(stride, 1),
            *_three(low, 0), *_three(dilation, 1)]


def launch(be: OpenCLBackend, name: str, bufs: list[Any], shape: tuple[int, ...], dtype: Any,
           ints: list[int], flags: list[int], geom: list[int]) -> Any:
    """Kernel ``name`` over the elements of a new result of ``shape``: the buffers, the
    element count, ``ints`` (longs), ``flags`` (ints), then the geometry."""
    kernel = be.kernel(_source(dtype), name, [None] * (len(bufs) + 1) + [np.int64] *
                       (1 + len(ints)) + [np.int32] * len(flags) + [np.int64] * 18)
    out = be._empty(shape, dtype)
    total = math.prod(shape)
    be.launch(kernel, total, *[b.data for b in bufs], out.data, total, *ints, *flags,
              *geom)
    return out
