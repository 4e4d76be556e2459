"""OpenCL C source for the tensor kernels, rendered from expression strings.

Elementwise kernels are not written per function: ``render_map`` turns any list of
expressions of the shared language (the rule table's values and partials, wrapped as
``mul0(g, partial)`` for vjps and ``mul0(partial, dx)`` for jvps) into one kernel, with the
helpers of ``easyad/_helpers.h`` (the header the C core includes too). Expressions are
rendered by ``easyad._expr`` (float kernels get float literals). Reductions, strided
copies, gathers and cross_entropy are fixed templates here (the matmul kernels are
``_kernels_matmul.py``); ``vector_helpers`` gives the same helpers on vectors, for the vector
loops of the fused kernels (``compiler/program/render_cl.py``) on CPU devices. Pure
strings: the OpenCL backend (``_opencl.py``) compiles them, once per device and source.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from easyad import _expr

# the one helpers header, shared with the C core (package data of easyad)
HELPERS = (Path(__file__).resolve().parent.parent / "_helpers.h").read_text(encoding="utf-8")

C_TYPES = {np.dtype(np.float64): "double", np.dtype(np.float32): "float",
           np.dtype(np.bool_): "uchar", np.dtype(np.uint8): "uchar",
           np.dtype(np.int64): "long"}


def c_type(dtype: np.dtype) -> str:
    return C_TYPES[np.dtype(dtype)]


def _memo(*tables: dict[str, Any]) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """A renderer rendering once per arguments and contents of the module ``tables`` it
    reads (a changed table renders anew). An eager operation renders its kernel's source
    to look the compiled kernel up by it: re-rendering (and re-hashing) several kilobytes
    per call cost more host time than the launch itself. The same string object comes
    back each time, so its hash is computed once."""
    def wrap(render: Callable[..., str]) -> Callable[..., str]:
        cache: dict[Any, str] = {}

        @functools.wraps(render)
        def rendered(*args: Any, **kwargs: Any) -> str:
            key = (args, tuple(kwargs.items()), *(tuple(t.items()) for t in tables))
            source = cache.get(key)
            if source is None:
                if len(cache) >= 512:     # arguments that keep changing: start again
                    cache.clear()
                source = cache[key] = render(*args, **kwargs)
            return source
        return rendered
    return wrap


def for_real(expression: str, real: str) -> str:
    """``expression`` as OpenCL C in ``real`` precision (float literals get an f, so a
    float32 kernel never computes in double)."""
    return _expr.render(expression, "c" if real == "double" else "opencl-float")


@_memo()
def preamble(real: str, width: int = 0, lanewise: frozenset[str] = frozenset()) -> str:
    """The kernels' first lines: real_t, the helpers, and with ``width`` the vector
    helpers of ``vector_helpers`` (``lanewise``: the math functions computed lane by lane
    there, as ``easyad_lw_<name>``)."""
    return ("//CL// easyad tensor kernels\n"
            "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
            f"typedef {real} real_t;\n" + HELPERS + "\n"
            + (vector_helpers(real, width, lanewise) if width else ""))


BINARY_MATH = frozenset({"atan2", "hypot"})     # the two-argument builtins vector loops call


def lanewise_math(names: frozenset[str], width: int) -> str:
    """``easyad_lw_<name>``: the builtin ``name`` on each lane of a vreal_t by itself (for
    a device whose vector version of it differs from its scalar one)."""
    lanes = "0123456789abcdef"[:width]
    out = []
    for name in sorted(names):
        if name in BINARY_MATH:
            body = "\n".join(f"    r.s{k} = {name}(x.s{k}, y.s{k});" for k in lanes)
            out.append(f"static inline vreal_t easyad_lw_{name}(vreal_t x, vreal_t y) {{\n"
                       f"    vreal_t r;\n{body}\n    return r;\n}}")
        else:
            body = "\n".join(f"    r.s{k} = {name}(x.s{k});" for k in lanes)
            out.append(f"static inline vreal_t easyad_lw_{name}(vreal_t x) {{\n"
                       f"    vreal_t r;\n{body}\n    return r;\n}}")
    return "\n".join(out) + ("\n" if out else "")


# the helpers of _helpers.h with no vector builtin (the scipy.special rows and fmax's
# pick), by arity: in vector loops each is the scalar helper lane by lane (easyad_v_*), so
# a vector loop gives their scalar loop's values bit for bit and the rest of the loop
# stays vector
LANEWISE_HELPERS = {"erfc": 1, "expit": 1, "logit": 1, "gammaln": 1, "digamma": 1,
                    "polygamma": 2, "xlogy": 2, "xlog1py": 2, "logaddexp": 2,
                    "logaddexp2": 2, "copysign": 2, "fmax": 2, "fmin": 2, "pick": 2}


def _lanewise_helpers(width: int) -> str:
    lanes = "0123456789abcdef"[:width]
    out = []
    for name, arity in sorted(LANEWISE_HELPERS.items()):
        args = "x.s{k}, y.s{k}" if arity == 2 else "x.s{k}"
        body = "\n".join(f"    r.s{k} = {name}({args.format(k=k)});" for k in lanes)
        params = "vreal_t x, vreal_t y" if arity == 2 else "vreal_t x"
        out.append(f"static inline vreal_t easyad_v_{name}({params}) {{\n"
                   f"    vreal_t r;\n{body}\n    return r;\n}}")
    return "\n".join(out) + "\n"


def vector_helpers(real: str, width: int, lanewise: frozenset[str] = frozenset()) -> str:
    """Types and helpers for loops over ``width`` lanes of real_t at once (CPU devices):
    ``vreal_t`` (the values), ``vmask_t`` (what comparing them gives: -1 or 0 a lane, of
    the real's size, as the vector ``?:`` wants), ``vbool_t`` (bools as in memory, 0 or
    1), ``vreal_mem``/``vbool_mem`` (the same vectors at any element: loads and stores
    through them are plain unaligned vector moves; PoCL builds that call vload/vstore out
    of line cannot slow them down), the conversions, and the helpers of ``_helpers.h``
    lane by lane (``easyad_v_*``: the same values; the vector ``?:`` is a select, both
    sides computed). After the helpers header: pow is its scalar helper there."""
    mask = f"{'long' if real == 'double' else 'int'}{width}"
    size = 8 if real == "double" else 4
    # pow lane by lane, by the scalar helper: PoCL 3.1's vector pow (double8) gets lanes
    # wrong where another lane of the vector is 0 or negative (measured; its vector exp,
    # sin, log... equal its scalar ones bit for bit)
    pow_lanes = "\n".join(f"    r.s{lane} = pow(x.s{lane}, y.s{lane});"
                           for lane in "0123456789abcdef"[:width])
    return f"""typedef {real}{width} vreal_t;
typedef {mask} vmask_t;
typedef uchar{width} vbool_t;
typedef vreal_t __attribute__((aligned({size}))) vreal_mem;
typedef vbool_t __attribute__((aligned(1))) vbool_mem;
#define EASYAD_TO_REAL convert_{real}{width}
#define EASYAD_TO_MASK convert_{mask}
#define EASYAD_TO_BOOL convert_uchar{width}
static inline vreal_t easyad_v_sign(vreal_t t) {{
    return t > (vreal_t)0 ? (vreal_t)1 : (t < (vreal_t)0 ? (vreal_t)-1 : t);
}}
static inline vreal_t easyad_v_heaviside(vreal_t t) {{
    return t > (vreal_t)0 ? (vreal_t)1
         : (t < (vreal_t)0 ? (vreal_t)0 : (t == (vreal_t)0 ? (vreal_t)0.5 : t));
}}
static inline vreal_t easyad_v_mul0(vreal_t a, vreal_t b) {{
    return EASYAD_MUL0(vreal_t, a, b);
}}
static inline vreal_t easyad_v_div0(vreal_t a, vreal_t b) {{
    return EASYAD_DIV0(vreal_t, a, b);
}}
static inline vreal_t easyad_v_maximum(vreal_t a, vreal_t b) {{
    return ((a != a) | (a >= b)) ? a : b;
}}
static inline vreal_t easyad_v_minimum(vreal_t a, vreal_t b) {{
    return ((a != a) | (a <= b)) ? a : b;
}}
static inline vreal_t easyad_v_pow(vreal_t x, vreal_t y) {{
    vreal_t r;
{pow_lanes}
    return r;
}}
""" + _lanewise_helpers(width) + lanewise_math(lanewise, width)


def _coordinates(ndim: int) -> list[str]:
    # flat output index I_ -> coordinates K_0..K_{ndim-1} of an output of dims D_0..
    lines = ["    long R_ = I_;"]
    for d in range(ndim - 1, 0, -1):
        lines.append(f"    const long K_{d} = R_ % D_{d}; R_ /= D_{d};")
    lines.append("    const long K_0 = R_;")
    return lines


def render_map(label: str, exprs: tuple[str, ...], operands: tuple[tuple[str, str, str], ...],
               outs: tuple[str, ...], ndim: int, real: str) -> str:
    """One elementwise kernel ``easyad_<label>``: ``out_k[i] = exprs[k]`` over operands.

    ``operands`` are ``(name, kind, ctype)``: kind "same" (a buffer of the output's shape),
    "strided" (a buffer read through strides S_<name>_d over ``ndim`` collapsed output dims,
    0 where it is broadcast), "first" (a 0-d buffer: its one element, for every output)
    or "scalar" (a kernel argument). The expressions read the operands by name.
    """
    params = [f"__global {t}* out{k}" for k, t in enumerate(outs)]
    body = []
    for name, kind, ctype in operands:
        if kind == "scalar":
            params.append(f"const real_t {name}")
        else:
            params.append(f"__global const {ctype}* restrict P_{name}")
    params.append("const long N_")
    if ndim:
        params += [f"const long D_{d}" for d in range(ndim)]
    for name, kind, _ in operands:
        if kind == "strided":
            params += [f"const long S_{name}_{d}" for d in range(ndim)]
    body += ["    const long I_ = get_global_id(0);", "    if (I_ >= N_) return;"]
    if any(kind == "strided" for _, kind, _ in operands):
        body += _coordinates(ndim)
    for name, kind, ctype in operands:
        if kind == "same":
            body.append(f"    const {ctype} {name} = P_{name}[I_];")
        elif kind == "first":
            body.append(f"    const {ctype} {name} = P_{name}[0];")
        elif kind == "strided":
            offset = " + ".join(f"K_{d} * S_{name}_{d}" for d in range(ndim))
            body.append(f"    const {ctype} {name} = P_{name}[{offset}];")
    for k, (expr, t) in enumerate(zip(exprs, outs)):
        body.append(f"    out{k}[I_] = ({t})({for_real(expr, real)});")
    return (preamble(real) + f"__kernel void easyad_{label}({', '.join(params)})\n{{\n"
            + "\n".join(body) + "\n}\n")


@_memo()
def render_reduce(op: str, real: str) -> str:
    """``out[o, c, i] = op over k in chunk c of x[o, k, i]``: one pass of a reduction over the
    middle axis of (outer, K, inner); passes repeat until one chunk is left."""
    combine = {"sum": "acc + v", "max": "maximum(acc, v)", "min": "minimum(acc, v)"}[op]
    start = {"sum": "(real_t)0", "max": "-INFINITY", "min": "INFINITY"}[op]
    return preamble(real) + f"""__kernel void easyad_reduce_{op}(__global real_t* out,
        __global const real_t* restrict x, const long K, const long inner, const long chunk,
        const long C, const long total)
{{
    const long gid = get_global_id(0);
    if (gid >= total) return;
    const long i = gid % inner;
    const long t = gid / inner;
    const long c = t % C;
    const long o = t / C;
    const long k1 = min(K, (c + 1) * chunk);
    __global const real_t* p = x + o * K * inner + i;
    real_t acc = {start};
    for (long k = c * chunk; k < k1; ++k) {{
        const real_t v = p[k * inner];
        acc = {combine};
    }}
    out[(o * C + c) * inner + i] = acc;
}}
"""


@_memo()
def render_strided(ctype: str, ndim: int, scatter: bool) -> str:
    """Copy between a contiguous buffer and a strided view (offset, dims D_, strides S_):
    gather ``out[i] = src[view(i)]``, or scatter ``dst[view(i)] = src[i]``."""
    params = ([f"__global {ctype}* dst", f"__global const {ctype}* restrict src",
               "const long offset", "const long N_"]
              + [f"const long D_{d}" for d in range(ndim)]
              + [f"const long S_{d}" for d in range(ndim)])
    view = " + ".join(["offset"] + [f"K_{d} * S_{d}" for d in range(ndim)])
    move = f"dst[{view}] = src[I_];" if scatter else f"dst[I_] = src[{view}];"
    name = "scatter" if scatter else "gather"
    return ("//CL// easyad strided copy\n#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
            f"__kernel void easyad_{name}({', '.join(params)})\n{{\n"
            "    const long I_ = get_global_id(0);\n    if (I_ >= N_) return;\n"
            + "\n".join(_coordinates(ndim) if ndim else []) + f"\n    {move}\n}}\n")


@_memo()
def render_take(ctype: str) -> str:
    return f"""//CL// easyad gather by index
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
__kernel void easyad_take(__global {ctype}* out, __global const {ctype}* restrict src,
                          __global const long* restrict index, const long N_)
{{
    const long i = get_global_id(0);
    if (i < N_) out[i] = src[index[i]];
}}
__kernel void easyad_put(__global {ctype}* out, __global const {ctype}* restrict src,
                         __global const long* restrict index, const long N_)
{{
    const long i = get_global_id(0);
    if (i < N_) out[index[i]] = src[i];
}}
"""


@_memo()
def render_cross_entropy(real: str) -> str:
    """cross_entropy with class indices in two kernels (the composed one takes twelve
    launches a step). ``easyad_ce_forward``, ONE work-group (of a power of two size,
    ``part`` its local sums): each work-item takes rows n, n + G, ..., keeps the row's
    shift m (the maximum where finite, else 0, as logsumexp shifts) and s = sum exp(z - m)
    for the vjp, and adds log(s) + m - z[n, target[n]]; the group's sum over G work-items
    divided by ``divisor`` is the loss. ``easyad_ce_vjp``: (exp(z - m) / s - onehot) * k
    per element."""
    return preamble(real) + """__kernel void easyad_ce_forward(__global real_t* loss,
        __global real_t* M, __global real_t* S, __global const real_t* restrict z,
        __global const long* restrict target, const long N, const long C,
        const real_t divisor, __local real_t* part)
{
    const int lid = get_local_id(0), G = get_local_size(0);
    real_t acc = (real_t)0;
    for (long n = lid; n < N; n += G) {
        __global const real_t* row = z + n * C;
        real_t m = -INFINITY;
        for (long c = 0; c < C; ++c)
            m = maximum(m, row[c]);
        if (!(m - m == (real_t)0))
            m = (real_t)0;
        real_t s = (real_t)0;
        for (long c = 0; c < C; ++c)
            s += exp(row[c] - m);
        M[n] = m;
        S[n] = s;
        acc += log(s) + m - row[target[n]];
    }
    part[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = G / 2; h > 0; h >>= 1) {
        if (lid < h)
            part[lid] += part[lid + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0)
        loss[0] = part[0] / divisor;
}
__kernel void easyad_ce_vjp(__global real_t* out, __global const real_t* restrict z,
        __global const real_t* restrict M, __global const real_t* restrict S,
        __global const long* restrict target, const long N_, const long C, const real_t k)
{
    const long i = get_global_id(0);
    if (i >= N_) return;
    const long n = i / C;
    const real_t h = (i - n * C == target[n]) ? (real_t)1 : (real_t)0;
    out[i] = (exp(z[i] - M[n]) / S[n] - h) * k;
}
"""

