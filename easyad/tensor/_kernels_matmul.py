"""The OpenCL matrix-product kernels, rendered as text: ``render_matmul_nt`` (CPU devices:
both operands read along K as vectors), ``render_matmul`` (the older tiled GPU kernel) and
``render_gemm`` (GPUs: transposed operands read in place, tile configurations
``GEMM_CONFIGS`` chosen by ``gemm_plan``, split K). The kernel family with tuning tables
of its own, apart from the elementwise, reduction and data-movement kernels of
``_kernels.py``, whose memo and preamble it uses. The backend launches them
(``_cl_matmul.py``).
"""
from __future__ import annotations

import os

from easyad.tensor._kernels import _memo, preamble

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


# Variants of the float 128x128 tile that may suit a GPU better ("big-bk16": 16-deep slabs,
# fewer barriers, twice the local memory; "big-1buf": one slab in local memory, two
# barriers a slab). ``EASYAD_OPENCL_GEMM_BIG`` names the one gemm_plan uses for "big";
# benchmarks/gpu_gemm.py times them all and prints the fastest. Default "big-1buf": the
# fastest summed over the MLP's big products on an H200 (2.51 vs 2.53 ms for "big" and
# 3.01 for "big-bk16"; benchmarks/results/gpu.md) and on the forward product of an H100.
GEMM_CONFIGS["float"]["big-bk16"] = dict(GEMM_CONFIGS["float"]["big"], BK=16)
GEMM_CONFIGS["float"]["big-1buf"] = dict(GEMM_CONFIGS["float"]["big"], DB=0)
BIG_VARIANTS = ("big", "big-bk16", "big-1buf")


def _big(real: str) -> str:
    """The config gemm_plan uses for a big product: ``EASYAD_OPENCL_GEMM_BIG`` (float only)
    or "big-1buf"; "big" for double."""
    choice = os.environ.get("EASYAD_OPENCL_GEMM_BIG") or "big-1buf"
    if choice not in BIG_VARIANTS:
        raise ValueError(f"EASYAD_OPENCL_GEMM_BIG is {choice!r}: expected one of "
                         f"{', '.join(BIG_VARIANTS)}")
    return choice if real == "float" else "big"


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
        name = _big(real) if tiles("big") >= units else "mid"
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
