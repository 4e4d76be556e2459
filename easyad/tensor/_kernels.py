"""OpenCL C source for the tensor kernels, rendered from expression strings.

Elementwise kernels are not written per function: ``render_map`` turns any list of
expressions of the shared language (the rule table's values and partials, wrapped as
``mul0(g, partial)`` for vjps and ``mul0(partial, dx)`` for jvps) into one kernel, with the
helpers of ``easyad/_helpers.h`` (the header the C core includes too). Expressions are
rendered by ``easyad._expr`` (float kernels get float literals). Reductions, strided
copies, gathers and the tiled matmul are
fixed templates here; ``vector_helpers`` gives the same helpers on vectors, for the vector
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
""" + lanewise_math(lanewise, width)


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


# Matmul for CPU devices: C = L R^T with L (M, K) and R (N, K) both read along K, so every
# load is a contiguous vector (double4: one AVX2 register, which every x86-64 PoCL target
# has). Each work-item keeps an RM x RN block of C in vector accumulators: 4 x 2 takes 8
# registers and 6 more for the loads, within AVX2's 16. No local memory, no barriers (PoCL
# runs the work-items of a group in a loop, and barriers would spill the accumulators).
# The block is written out statement by statement: PoCL keeps such accumulators in
# registers, where the same code with loops over arrays ran 3-5x slower.
MATMUL_NT_BLOCK = {"RM": 4, "RN": 2}
MATMUL_NT_GROUP = (16, 4)



def _hsum(real: str, width: int) -> str:
    """hsum(v): the sum of a vec_t's lanes, halving the vector each step."""
    lines, name, w = [], "v", width
    while w > 1:
        half = w // 2
        lo = "".join("0123456789abcdef"[i] for i in range(half))
        hi = "".join("0123456789abcdef"[i] for i in range(half, w))
        vector = f"{real}{half if half > 1 else ''}"
        lines.append(f"    const {vector} h{half} = {name}.s{lo} + {name}.s{hi};")
        name, w = f"h{half}", half
    return ("static inline real_t hsum(vec_t v) {\n" + "\n".join(lines)
            + f"\n    return {name};\n}}")


@_memo(MATMUL_NT_BLOCK)
def render_matmul_nt(real: str, vector_bytes: int = 32) -> str:
    """vector_bytes: the CPU's vector register (64 with AVX-512, 32 with AVX2); a wider
    vector than the CPU has is not just slow: PoCL may fail to build the kernel."""
    width = vector_bytes // (8 if real == "double" else 4)
    rm, rn = MATMUL_NT_BLOCK["RM"], MATMUL_NT_BLOCK["RN"]
    block = [(r, c) for r in range(rm) for c in range(rn)]
    zero = "\n".join(f"        vec_t a{r}_{c} = (vec_t)(0);" for r, c in block)
    # Vectors built from elements and multiply-adds written out, not vload/fma: some PoCL
    # builds call those builtins out of line (a call per load and per multiply-add, 10x
    # slower), while LLVM turns these into vector loads and FMAs (FP_CONTRACT is on).
    def load(base: str) -> str:
        elements = ", ".join(f"{base}[{e}]" for e in range(width))
        return f"(vec_t)({elements})"
    loads = "\n".join(
        [f"            __global const real_t* pl{r} = L + (long)(i0 + {r}) * K + k;"
         for r in range(rm)]
        + [f"            __global const real_t* pr{c} = R + (long)(j0 + {c}) * K + k;"
           for c in range(rn)]
        + [f"            const vec_t l{r} = {load(f'pl{r}')};" for r in range(rm)]
        + [f"            const vec_t r{c} = {load(f'pr{c}')};" for c in range(rn)])
    fmas = "\n".join(f"            a{r}_{c} += l{r} * r{c};" for r, c in block)
    stores = "\n".join(
        f"        {{ real_t s = hsum(a{r}_{c}); for (int kk = k; kk < K; ++kk) "
        f"s += L[(long)(i0 + {r}) * K + kk] * R[(long)(j0 + {c}) * K + kk]; "
        f"C[(long)(i0 + {r}) * N + j0 + {c}] = s; }}" for r, c in block)
    return preamble(real) + f"""typedef {real}{width} vec_t;
{_hsum(real, width)}
__kernel void easyad_matmul_nt(__global real_t* C, __global const real_t* restrict L,
                               __global const real_t* restrict R, const int M, const int N,
                               const int K, const long strideL, const long strideR)
{{
    const int j0 = get_global_id(0) * {rn}, i0 = get_global_id(1) * {rm};
    const long b = get_global_id(2);
    L += b * strideL;
    R += b * strideR;
    C += b * (long)M * N;
    if (i0 + {rm} <= M && j0 + {rn} <= N) {{
{zero}
        int k = 0;
        for (; k + {width} <= K; k += {width}) {{
{loads}
{fmas}
        }}
{stores}
    }} else {{   /* a block on the edge: element by element */
        for (int i = i0; i < min(i0 + {rm}, M); ++i)
            for (int j = j0; j < min(j0 + {rn}, N); ++j) {{
                real_t s = (real_t)0;
                for (int kk = 0; kk < K; ++kk)
                    s = fma(L[(long)i * K + kk], R[(long)j * K + kk], s);
                C[(long)i * N + j] = s;
            }}
    }}
}}
"""


# Tiled matmul (for GPUs): each work-group computes a TM x TN tile of C for one batch entry, staging
# TK-deep slabs of A and B in local memory; each work-item owns a WM x WN block of the tile
# in registers. Batch entries of A or B may be shared (batch stride 0).
MATMUL_TILE = {"TM": 64, "TN": 64, "TK": 16, "WM": 4, "WN": 4}


@_memo(MATMUL_TILE)
def render_matmul(real: str) -> str:
    t = MATMUL_TILE
    return preamble(real) + f"""#define TM {t['TM']}
#define TN {t['TN']}
#define TK {t['TK']}
#define WM {t['WM']}
#define WN {t['WN']}
#define LM (TM / WM)
#define LN (TN / WN)
__kernel __attribute__((reqd_work_group_size(LN, LM, 1)))
void easyad_matmul(__global real_t* C, __global const real_t* restrict A,
                   __global const real_t* restrict B, const int M, const int N, const int K,
                   const long strideA, const long strideB)
{{
    __local real_t As[TK][TM];
    __local real_t Bs[TK][TN];
    const int ln = get_local_id(0), lm = get_local_id(1);
    const int m0 = get_group_id(1) * TM, n0 = get_group_id(0) * TN;
    const long b = get_global_id(2);
    A += b * strideA;
    B += b * strideB;
    C += b * (long)M * N;
    real_t acc[WM][WN];
    for (int i = 0; i < WM; ++i)
        for (int j = 0; j < WN; ++j)
            acc[i][j] = (real_t)0;
    const int lid = lm * LN + ln;
    for (int k0 = 0; k0 < K; k0 += TK) {{
        for (int e = lid; e < TK * TM; e += LM * LN) {{
            const int kk = e % TK, mm = e / TK;
            const int gm = m0 + mm, gk = k0 + kk;
            As[kk][mm] = (gm < M && gk < K) ? A[(long)gm * K + gk] : (real_t)0;
        }}
        for (int e = lid; e < TK * TN; e += LM * LN) {{
            const int nn = e % TN, kk = e / TN;
            const int gn = n0 + nn, gk = k0 + kk;
            Bs[kk][nn] = (gn < N && gk < K) ? B[(long)gk * N + gn] : (real_t)0;
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < TK; ++kk) {{
            real_t a[WM], bb[WN];
            for (int i = 0; i < WM; ++i) a[i] = As[kk][lm + i * LM];
            for (int j = 0; j < WN; ++j) bb[j] = Bs[kk][ln + j * LN];
            for (int i = 0; i < WM; ++i)
                for (int j = 0; j < WN; ++j)
                    acc[i][j] = fma(a[i], bb[j], acc[i][j]);
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    for (int i = 0; i < WM; ++i) {{
        const int gm = m0 + lm + i * LM;
        if (gm >= M) continue;
        for (int j = 0; j < WN; ++j) {{
            const int gn = n0 + ln + j * LN;
            if (gn < N) C[(long)gm * N + gn] = acc[i][j];
        }}
    }}
}}
"""


# GEMM for GPUs (render_gemm): C = op(A) op(B), with A read as (M, K) or, transposed, as
# (K, M), and B as (K, N) or (N, K): the layout is a compile-time switch, so a transposed
# operand is read where it lies instead of being copied first. A work-group of
# (BN/RN) x (BM/RM) work-items computes a BM x BN tile of C; each work-item keeps an
# RM x RN block in registers, as rows of V-wide vectors. BK-deep slabs of A and B are
# staged in local memory, k-major (As[k][m], Bs[k][n]), so the inner loop reads V-wide
# vectors there; PAD keeps the rows V-aligned and staggers them across banks (the k-major
# stores of an operand read along k would otherwise hit one bank). The next slab is read
# from global memory into registers while the current one is multiplied (the global
# latency hides behind the multiply-adds). Global reads are scalar but coalesced: consecutive
# work-items read consecutive addresses along the operand's contiguous axis. Rows and
# columns beyond M or N are clamped (read, computed, never stored), so only K needs a
# check, once per slab. DB: two slabs in local memory, so one barrier a slab instead of
# two (the next slab is stored into the other while this one is read). With SPLIT the
# group's third index also picks a K range and the tile is written to its own slice of
# C (the caller sums the slices).
# Block sizes per real type and shape class: "big" 128x128 (float, 8x8 per work-item,
# as the fast CUDA SGEMMs do), "mid" 64x64 for products that would leave 128x128
# tiles too few to fill the device, "tall"/"wide" for a side of a few columns/rows (the
# 10-class layers of an MLP), where a 64-wide tile would compute mostly padding.
GEMM_CONFIGS = {
    "float": {
        "big": {"BM": 128, "BN": 128, "BK": 8, "RM": 8, "RN": 8, "V": 4, "PAD": 4, "DB": 1},
        "mid": {"BM": 64, "BN": 64, "BK": 16, "RM": 4, "RN": 4, "V": 4, "PAD": 4, "DB": 1},
        "tall": {"BM": 64, "BN": 16, "BK": 16, "RM": 4, "RN": 4, "V": 4, "PAD": 4},
        "wide": {"BM": 16, "BN": 64, "BK": 16, "RM": 4, "RN": 4, "V": 4, "PAD": 4},
    },
    # double: half the registers per value, so 4x4 blocks of double2 rows
    "double": {
        "big": {"BM": 64, "BN": 64, "BK": 8, "RM": 4, "RN": 4, "V": 2, "PAD": 2},
        "mid": {"BM": 64, "BN": 64, "BK": 8, "RM": 4, "RN": 4, "V": 2, "PAD": 2},
        "tall": {"BM": 64, "BN": 16, "BK": 8, "RM": 4, "RN": 2, "V": 2, "PAD": 2},
        "wide": {"BM": 16, "BN": 64, "BK": 8, "RM": 2, "RN": 4, "V": 2, "PAD": 2},
    },
}


def gemm_group(cfg: dict[str, int]) -> tuple[int, int]:
    """The work-group of a GEMM config: (work-items along N, along M)."""
    return cfg["BN"] // cfg["RN"], cfg["BM"] // cfg["RM"]


def gemm_plan(real: str, batch: int, M: int, N: int, K: int, units: int) -> tuple[str, int]:
    """(config name in GEMM_CONFIGS, K slices) for a product on a device of ``units``
    compute units: the largest tile that still gives every unit a work-group, a thin tile
    for a side of at most 32 (a 64-wide one would compute mostly padding), and K split
    into slices (summed by one more launch) when even then most units would idle."""
    configs = GEMM_CONFIGS[real]

    def tiles(name: str) -> int:
        c = configs[name]
        return -(-M // c["BM"]) * -(-N // c["BN"]) * batch
    if N <= 32 < M:
        name = "tall"
    elif M <= 32 < N:
        name = "wide"
    else:
        name = "big" if tiles("big") >= units else "mid"
    # a slice of K is worth its share of the extra launch only if long (>= 512)
    n = tiles(name)
    split = min(-(-2 * units // n), K // 512) if 2 * n <= units else 1
    return name, max(split, 1)


def _gemm_loads(name: str, along_k: bool, tile: str, ext: str, stride: str,
                cfg: dict[str, int], threads: int, origin: str
                ) -> tuple[list[str], list[str], list[str]]:
    """Code that reads operand ``name``'s slab (tile x BK) into registers and stores it
    k-major in local memory: (setup, global loads at k0, local stores). ``along_k``: the
    operand's rows run along K (A untransposed, B transposed); ``ext``: its extent along
    the tile axis (M or N); ``stride``: its row length."""
    bt, bk = cfg[tile], cfg["BK"]
    count = bt * bk // threads
    low = name.lower()
    setup, loads, stores = [], [], []
    if along_k:            # rows of the tile axis, each BK contiguous along k
        assert threads % bk == 0 and bt % (threads // bk) == 0, cfg
        step = threads // bk
        setup.append(f"    const int {low}k = lid % {bk}, {low}t = lid / {bk};")
        for i in range(count):
            setup.append(f"    __global const real_t* p{low}{i} = {name} + (long)min("
                         f"{origin} + {low}t + {i * step}, {ext} - 1) * {stride} + {low}k;")
            loads.append(f"            r{low}{i} = {low}k + k0 < KE ? p{low}{i}[k0] : (real_t)0;")
            stores.append(f"        {low}l[({low}k) * LD{name} + {low}t + {i * step}] = r{low}{i};")
    else:                  # rows of k, each contiguous along the tile axis
        assert threads % bt == 0, cfg
        step = threads // bt
        assert bk % step == 0, cfg
        setup.append(f"    const int {low}t = lid % {bt}, {low}k = lid / {bt};")
        setup.append(f"    __global const real_t* p{low} = {name} + min({origin} + {low}t, "
                     f"{ext} - 1);")
        for i in range(count):
            kk = f"{low}k + {i * step}"
            loads.append(f"            r{low}{i} = {kk} + k0 < KE ? "
                         f"p{low}[(long)({kk} + k0) * {stride}] : (real_t)0;")
            stores.append(f"        {low}l[({kk}) * LD{name} + {low}t] = r{low}{i};")
    setup.append(f"    real_t {', '.join(f'r{low}{i}' for i in range(count))};")
    return setup, loads, stores


def render_gemm(real: str, cfg: dict[str, int], trans_a: bool, trans_b: bool,
                split: bool = False) -> str:
    """Kernel easyad_gemm(C, A, B, M, N, K, strideA, strideB, KS): C (batch, M, N) =
    op(A) op(B) per batch entry (a stride of 0 shares an operand). With ``split`` the
    third group index is batch * S + s and slice s sums k in [s KS, (s + 1) KS) into
    C + s * batch * M * N; without it KS is ignored."""
    bm, bn, bk, rm, rn, v = (cfg[k] for k in ("BM", "BN", "BK", "RM", "RN", "V"))
    tx, ty = gemm_group(cfg)
    threads = tx * ty
    assert rm % v == 0 and rn % v == 0, cfg
    assert (bm + cfg["PAD"]) % v == 0 and (bn + cfg["PAD"]) % v == 0, cfg
    gm, gn = rm // v, rn // v            # vector groups per work-item along M and N
    sa, la, ta = _gemm_loads("A", not trans_a, "BM", "M", "M" if trans_a else "K", cfg,
                             threads, "m0")
    sb, lb, tb = _gemm_loads("B", trans_b, "BN", "N", "K" if trans_b else "N", cfg, threads,
                             "n0")
    vec = f"{real}{v}"
    lanes = "0123456789abcdef"[:v]
    acc = [(r, g) for r in range(rm) for g in range(gn)]
    zero = "\n".join(f"    {vec} c{r}_{g} = ({vec})(0);" for r, g in acc)
    reads = "\n".join(
        [f"            const {vec} a{g} = As[kk][{g * ty} + ty];" for g in range(gm)]
        + [f"            const {vec} b{g} = Bs[kk][{g * tx} + tx];" for g in range(gn)])
    fmas = "\n".join(f"            c{r}_{g} = fma(({vec})(a{r // v}.s{lanes[r % v]}), b{g}, "
                     f"c{r}_{g});" for r, g in acc)

    def row(r: int) -> str:
        return f"m0 + {(r // v) * (bm // gm)} + ty * {v} + {r % v}"

    def col(g: int) -> str:
        return f"n0 + {g * (bn // gn)} + tx * {v}"
    full = "\n".join(f"        vstore{v}(c{r}_{g}, 0, C + (long)({row(r)}) * N + {col(g)});"
                     for r, g in acc)
    edge = "\n".join(
        f"        if ({row(r)} < M) {{ "
        + " ".join(f"if ({col(g)} + {e} < N) C[(long)({row(r)}) * N + {col(g)} + {e}] = "
                   f"c{r}_{g}.s{lanes[e]};" for e in range(v)) + " }"
        for r, g in acc)
    if split:
        place = """    const long z = get_group_id(2);
    const long b = z / S, s = z % S;
    const int kb = (int)s * KS;
    const int KE = min(KS, K - kb);
    C += s * nb * (long)M * N;"""
        shift = (f"    A += {'(long)kb * M' if trans_a else 'kb'};\n"
                 f"    B += {'kb' if trans_b else '(long)kb * N'};")
    else:
        place = "    const long b = get_group_id(2);\n    const int KE = K;"
        shift = ""
    nl = "\n"
    prefetch = f"""        if (k0 + {bk} < KE) {{{{   /* the next slab, read while this is used */
            const int k1 = k0 + {bk};
{nl.join(la).replace('k0', 'k1')}
{nl.join(lb).replace('k0', 'k1')}
        }}}}"""
    bufs = 2 if cfg.get("DB") else 1
    if bufs == 1:
        loop = f"""    for (; k0 < KE; k0 += {bk}) {{{{
{nl.join(ta)}
{nl.join(tb)}
        barrier(CLK_LOCAL_MEM_FENCE);
{prefetch}
        #pragma unroll
        for (int kk = 0; kk < {bk}; ++kk) {{{{
{reads}
{fmas}
        }}}}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}}}"""
    else:   # two slabs in local memory: one barrier a slab (the next is stored in the other)
        loop = f"""{nl.join(ta)}
{nl.join(tb)}
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int p = 0; k0 < KE; k0 += {bk}, p ^= 1) {{{{
{prefetch}
        const int kp = p * {bk};
        #pragma unroll
        for (int kk = 0; kk < {bk}; ++kk) {{{{
{reads.replace('s[kk]', 's[kp + kk]')}
{fmas}
        }}}}
        if (k0 + {bk} < KE) {{{{
            al = (__local real_t*)As + (p ^ 1) * {bk} * LDA;
            bl = (__local real_t*)Bs + (p ^ 1) * {bk} * LDB;
{nl.join(ta)}
{nl.join(tb)}
        }}}}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}}}"""
    loop = loop.replace("{{", "{").replace("}}", "}")
    return preamble(real) + f"""typedef {vec} vec_t;
#define LDA {bm + cfg['PAD']}
#define LDB {bn + cfg['PAD']}
__kernel __attribute__((reqd_work_group_size({tx}, {ty}, 1)))
void easyad_gemm(__global real_t* C, __global const real_t* restrict A,
                 __global const real_t* restrict B, const int M, const int N, const int K,
                 const long strideA, const long strideB, const int KS, const int S,
                 const long nb)
{{
    __local vec_t As[{bufs * bk}][LDA / {v}];
    __local vec_t Bs[{bufs * bk}][LDB / {v}];
    __local real_t* al = (__local real_t*)As;
    __local real_t* bl = (__local real_t*)Bs;
    const int tx = get_local_id(0), ty = get_local_id(1);
    const int lid = ty * {tx} + tx;
    const int m0 = get_group_id(1) * {bm}, n0 = get_group_id(0) * {bn};
{place}
    A += b * strideA;
    B += b * strideB;
    C += b * (long)M * N;
{shift}
{nl.join(sa)}
{nl.join(sb)}
{zero}
    int k0 = 0;
{nl.join(la)}
{nl.join(lb)}
{loop}    if (m0 + {bm} <= M && n0 + {bn} <= N) {{
{full}
    }} else {{
{edge}
    }}
}}
"""
