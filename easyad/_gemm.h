/* Matrix products on AVX-512, for CPUs whose BLAS does not use it.
 *
 * numpy's OpenBLAS picks its kernels by CPU model; on CPUs newer than it knows (AMD Zen 5
 * with openblas 0.3.31) it falls back to its AVX2 (Haswell) kernels, half the machine's
 * vector width. These kernels run on 512-bit vectors whatever the model, and are used
 * (easyad/tensor/_blas.py) only where the CPU has AVX-512F and the BLAS runs one thread:
 * a many-threaded BLAS is faster on big products.
 *
 * C[M, N] = A[M, K] B[K, N] with any element strides for A and B (a transpose is a
 * stride), C row-major with leading dimension ldc. The loops: a panel of B (KC rows, NR
 * columns) is copied into aligned memory (zero past N), so the inner loop reads whole
 * aligned vectors (unaligned 64-byte loads cross cache lines: that alone cost 1.7x);
 * then each block of 4 rows of A runs the panel with 4 x 4 vector accumulators (16 of
 * the 32 registers), one broadcast of A per row and k. Rows are taken MC at a time, so
 * the rows of A that the panels of B pass over stay in the caches (2048^3, one core of
 * this Zen 5: 68 -> 107 GFLOP/s; numpy's OpenBLAS on its AVX2 kernels 61). */
#ifndef EASYAD_GEMM_H
#define EASYAD_GEMM_H

#include <string.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define EASYAD_GEMM_X86 1
#define EASYAD_GEMM_TARGET __attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma")))
#else
#define EASYAD_GEMM_X86 0
#define EASYAD_GEMM_TARGET
#endif

#define EASYAD_GEMM_KC 64
#define EASYAD_GEMM_MC 256

/* row r of a block into C: C takes it (first panel of K) or adds it; a partial last
 * panel of columns (nr < NR) goes through a spill */
#define EASYAD_GEMM_STORE(T, V, W, acc, r)                                             \
    {                                                                                  \
        T* c = C + (i + (r)) * ldc + j;                                                \
        if (nr == 4 * (W)) {                                                           \
            V* cv = (V*)c;                                                             \
            if (k0) { cv[0] += acc[0]; cv[1] += acc[1]; cv[2] += acc[2]; cv[3] += acc[3]; } \
            else { cv[0] = acc[0]; cv[1] = acc[1]; cv[2] = acc[2]; cv[3] = acc[3]; }   \
        } else {                                                                       \
            T spill[4 * (W)] __attribute__((aligned(64)));                             \
            V* sv = (V*)spill;                                                         \
            sv[0] = acc[0]; sv[1] = acc[1]; sv[2] = acc[2]; sv[3] = acc[3];            \
            for (long q = 0; q < nr; q++) c[q] = k0 ? c[q] + spill[q] : spill[q];      \
        }                                                                              \
    }

/* one block of R rows (R = 4 or 1) of A against the packed panel: acc += A B, then C
 * takes it (EASYAD_GEMM_STORE) */
#define EASYAD_GEMM_BLOCK(T, V, W, R)                                                  \
    {                                                                                  \
        V a0[4] = {{0}}, a1[4] = {{0}}, a2[4] = {{0}}, a3[4] = {{0}};                  \
        const T* arow = A + i * ai + k0 * ak;                                          \
        for (long k = 0; k < kc; k++) {                                                \
            const V* p = (const V*)(panel + k * 4 * W);                                \
            const V b0 = p[0], b1 = p[1], b2 = p[2], b3 = p[3];                        \
            const T x0 = arow[k * ak];                                                 \
            a0[0] += x0 * b0; a0[1] += x0 * b1; a0[2] += x0 * b2; a0[3] += x0 * b3;    \
            if (R > 1) {                                                               \
                const T x1 = arow[ai + k * ak], x2 = arow[2 * ai + k * ak],            \
                        x3 = arow[3 * ai + k * ak];                                    \
                a1[0] += x1 * b0; a1[1] += x1 * b1; a1[2] += x1 * b2; a1[3] += x1 * b3;\
                a2[0] += x2 * b0; a2[1] += x2 * b1; a2[2] += x2 * b2; a2[3] += x2 * b3;\
                a3[0] += x3 * b0; a3[1] += x3 * b1; a3[2] += x3 * b2; a3[3] += x3 * b3;\
            }                                                                          \
        }                                                                              \
        EASYAD_GEMM_STORE(T, V, W, a0, 0)                                              \
        if (R > 1) {                                                                   \
            EASYAD_GEMM_STORE(T, V, W, a1, 1)                                          \
            EASYAD_GEMM_STORE(T, V, W, a2, 2)                                          \
            EASYAD_GEMM_STORE(T, V, W, a3, 3)                                          \
        }                                                                              \
    }

/* One row of a B panel: nr columns of B (stride bn) then zeros up to the panel's width. */
#define EASYAD_GEMM_PANEL_ROW(dst, src, nr, bn, width)                                 \
    {                                                                                  \
        long q_ = 0;                                                                   \
        for (; q_ < (nr); q_++) (dst)[q_] = (src)[q_ * (bn)];                          \
        for (; q_ < (width); q_++) (dst)[q_] = 0;                                      \
    }

#define EASYAD_GEMM_DEFINE(NAME, T, W)                                                 \
typedef T NAME##_vec __attribute__((vector_size((W) * sizeof(T)), aligned(sizeof(T))));\
static EASYAD_GEMM_TARGET void NAME(long M, long N, long K, const T* A, long ai,       \
                                    long ak, const T* B, long bk, long bn, T* C,       \
                                    long ldc) {                                        \
    T panel[EASYAD_GEMM_KC * 4 * (W)] __attribute__((aligned(64)));                    \
    for (long i0 = 0; i0 < M; i0 += EASYAD_GEMM_MC) {                                  \
    const long m1 = M - i0 < EASYAD_GEMM_MC ? M : i0 + EASYAD_GEMM_MC;                 \
    for (long j = 0; j < N; j += 4 * (W)) {                                            \
        const long nr = N - j < 4 * (W) ? N - j : 4 * (W);                             \
        if (K == 0) {                                                                  \
            for (long i = i0; i < m1; i++)                                             \
                for (long q = 0; q < nr; q++) C[i * ldc + j + q] = 0;                  \
        }                                                                              \
        for (long k0 = 0; k0 < K; k0 += EASYAD_GEMM_KC) {                              \
            const long kc = K - k0 < EASYAD_GEMM_KC ? K - k0 : EASYAD_GEMM_KC;         \
            for (long k = 0; k < kc; k++)                                              \
                EASYAD_GEMM_PANEL_ROW(panel + k * 4 * (W), B + (k0 + k) * bk + j * bn, \
                                      nr, bn, 4 * (W))                                 \
            long i = i0;                                                               \
            for (; i + 4 <= m1; i += 4) EASYAD_GEMM_BLOCK(T, NAME##_vec, W, 4)         \
            for (; i < m1; i++) EASYAD_GEMM_BLOCK(T, NAME##_vec, W, 1)                 \
        }                                                                              \
    }                                                                                  \
    }                                                                                  \
}

/* The same product from B packed once (easyad_gemm_pack_*: panel after panel, each K
 * rows of NR columns, zero past N) for a B used by many products, as an LSTM's W_hh is by
 * every step: its panels are then read, not copied, by each product, each over the
 * whole of K (12% faster than KC at a time for (64, 1024) @ (1024, 256)). Bp is 64-byte
 * aligned (aligned_alloc). */
#define EASYAD_GEMM_DEFINE_PACKED(NAME, T, W)                                          \
static EASYAD_GEMM_TARGET void NAME##_pack(long N, long K, const T* B, long bk, long bn,\
                                           T* Bp) {                                    \
    for (long j = 0; j < N; j += 4 * (W)) {                                            \
        const long nr = N - j < 4 * (W) ? N - j : 4 * (W);                             \
        T* dst = Bp + (j / (4 * (W))) * K * 4 * (W);                                    \
        for (long k = 0; k < K; k++, dst += 4 * (W))                                   \
            EASYAD_GEMM_PANEL_ROW(dst, B + k * bk + j * bn, nr, bn, 4 * (W))           \
    }                                                                                  \
}                                                                                      \
static EASYAD_GEMM_TARGET void NAME##_packed(long M, long N, long K, const T* A,       \
                                             long ai, long ak, const T* Bp, T* C,      \
                                             long ldc) {                               \
    for (long i0 = 0; i0 < M; i0 += EASYAD_GEMM_MC) {                                  \
    const long m1 = M - i0 < EASYAD_GEMM_MC ? M : i0 + EASYAD_GEMM_MC;                 \
    for (long j = 0; j < N; j += 4 * (W)) {                                            \
        const long nr = N - j < 4 * (W) ? N - j : 4 * (W);                             \
        if (K == 0) {                                                                  \
            for (long i = i0; i < m1; i++)                                             \
                for (long q = 0; q < nr; q++) C[i * ldc + j + q] = 0;                  \
        }                                                                              \
        if (K > 0) {              /* the whole of K at once: C stored once, not    \
                                     added to K/KC times (the panel is in place) */    \
            const long k0 = 0, kc = K;                                                 \
            const T* panel = Bp + (j / (4 * (W))) * K * 4 * (W);                        \
            long i = i0;                                                               \
            for (; i + 4 <= m1; i += 4) EASYAD_GEMM_BLOCK(T, NAME##_vec, W, 4)         \
            for (; i < m1; i++) EASYAD_GEMM_BLOCK(T, NAME##_vec, W, 1)                 \
        }                                                                              \
    }                                                                                  \
    }                                                                                  \
}

#if EASYAD_GEMM_X86
EASYAD_GEMM_DEFINE(easyad_gemm_f64, double, 8)
EASYAD_GEMM_DEFINE(easyad_gemm_f32, float, 16)
EASYAD_GEMM_DEFINE_PACKED(easyad_gemm_f32, float, 16)

/* whether this CPU runs the kernels (AVX-512F, VL, DQ and FMA) */
static int easyad_gemm_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")
        && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
}
#else
static void easyad_gemm_f64(long M, long N, long K, const double* A, long ai, long ak,
                            const double* B, long bk, long bn, double* C, long ldc) {}
static void easyad_gemm_f32(long M, long N, long K, const float* A, long ai, long ak,
                            const float* B, long bk, long bn, float* C, long ldc) {}
static void easyad_gemm_f32_pack(long N, long K, const float* B, long bk, long bn,
                                 float* Bp) {}
static void easyad_gemm_f32_packed(long M, long N, long K, const float* A, long ai,
                                   long ak, const float* Bp, float* C, long ldc) {}
static int easyad_gemm_supported(void) { return 0; }
#endif

#endif
