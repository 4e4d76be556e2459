/* Winograd F(2x2, 3x3) transforms for the 3x3, stride-1 convolutions of ops/_conv_cpu.py
 * (see ops/_conv_winograd.py for the algebra and where they are used).
 *
 * Every output tile of 2x2 reads a 4x4 tile of the padded input, starting at (2ty, 2tx).
 * The transforms of a tile are sums and differences only (no rounding beyond the adds'),
 * written plane by plane: plane xi = 4k + l of V, M or Q holds entry (k, l) of every
 * tile, ``T`` tiles a channel, so the products between them are 16 GEMMs. An image's
 * tiles are a grid of th rows of ``tw + 1``: the last column of each row is a spare tile
 * (the padding's zeros; ignored by the output transform, zero in Q so the weight's
 * gradient never sees it), which makes tile t + 1 the next column and t + tw + 1 the next
 * row for every t, so each plane is one loop over all its tiles (gcc vectorises it;
 * loops over one row of 14 tiles did not pay: 4.1 -> 2.3 ms for the input transform of
 * 64 images of 32 channels 28x28, one core).
 *
 * - easyad_wino_in:  V[xi][c][t] = (B^T d B)[k][l] for the input tile d of image i, channel
 *   c (t = (i th + ty) (tw + 1) + tx); x is read as zero outside rows [0, Hv) and columns
 *   [0, Wv) (Hv < H where a negative padding cuts the input), padded by lo_h/lo_w.
 * - easyad_wino_out: y[i][c][2ty + a][2tx + b] = (A^T m A)[a][b] for M's tile m, dropping
 *   rows/columns past Oh/Ow (an odd size's last tile); returns 1 where any tile (the
 *   spare and dropped entries too: erring towards a recomputation) is not finite, so
 *   the caller needs no pass of its own over y.
 * - easyad_wino_grad: Q[xi][c][t] = (A gg A^T)[k][l], gg the 2x2 tile of g (zero past
 *   Oh/Ow): the weight gradient's transform of the cotangent.
 *
 * With B^T = [[1,0,-1,0],[0,1,1,0],[0,-1,1,0],[0,1,0,-1]], A^T = [[1,1,1,0],[0,1,-1,-1]].
 * A plane is first split into its four phases (even/odd rows x even/odd columns of the
 * padded plane, zeros where nothing is copied): the 16 entries of tile t are then
 * phase[t], phase[t + 1], phase[t + tw + 1], phase[t + tw + 2] of the four phases.
 * ivdep: the 16 planes are one array at a run-time stride, which gcc cannot prove apart
 * (they never overlap: P >= tiles). */
#ifndef EASYAD_WINOGRAD_H
#define EASYAD_WINOGRAD_H

#include <stdlib.h>
#include <string.h>

/* gather a plane's rows into the four phase planes (row parity, column parity) of the
 * padded plane, each (rows) x (w1) with w1 = tw + 1; what stays unwritten is zero */
/* AVX2 clones (8 lanes instead of SSE2's 4; picked at load time by the CPU, glibc's ifunc):
 * the transforms 2.3 -> 2.1 (input), 2.0 -> 1.5 (output), 2.0 -> 1.7 ms (cotangent) on the
 * case above. Sums and differences only, so no contraction into FMA: the same bits. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define EASYAD_WINO_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define EASYAD_WINO_CLONES
#endif

/* The part of an input window the tiles read: padding lo_h/lo_w may be negative (a crop);
 * r0/c0: where the valid rows/columns start in the padded frame, q0/s0: the first row
 * and column of the input read, rows/cols: how many (the tiles' 2(th+1) x 2(tw+1) frame
 * bounds them). */
typedef struct { long r0, c0, q0, s0, rows, cols; } easyad_wino_window;

static inline easyad_wino_window easyad_wino_window_of(long Hv, long Wv, long lo_h, long lo_w,
                                                       long th, long tw) {
    easyad_wino_window w;
    w.c0 = lo_w > 0 ? lo_w : 0;
    w.s0 = w.c0 - lo_w;
    w.cols = Wv - w.s0;
    if (w.cols > 2 * (tw + 1) - w.c0) w.cols = 2 * (tw + 1) - w.c0;
    if (w.cols < 0) w.cols = 0;
    w.r0 = lo_h > 0 ? lo_h : 0;
    w.q0 = w.r0 - lo_h;
    w.rows = Hv - w.q0;
    if (w.rows > 2 * (th + 1) - w.r0) w.rows = 2 * (th + 1) - w.r0;
    if (w.rows < 0) w.rows = 0;
    return w;
}

#define EASYAD_WINO_DEFINE(T_, SUF)                                                     \
/* ld: the distance between a phase's elements (1; 8 where eight channels interleave, \
   easyad_wino_in_t); a constant at every call, so the inlined copy keeps it so */      \
static inline void easyad_wino_phases_##SUF(const T_* restrict src, long rows, long cols,\
                                            long W, long r0, long c0, long w1,          \
                                            T_* restrict p, long phase, long ld) {      \
    for (long r = 0; r < rows; r++) {                                                   \
        long pr = r0 + r;                                                               \
        const T_* restrict s = src + r * W;                                             \
        T_* restrict even = p + (((pr & 1) * 2) * phase + (pr >> 1) * w1) * ld;         \
        T_* restrict odd = even + phase * ld;                                           \
        long j0 = c0 & 1;      /* s[j] lands in column c0 + j: even when j = j0 mod 2 */ \
        T_* restrict a = j0 ? odd : even;                                               \
        T_* restrict b = j0 ? even : odd;                                               \
        long h = c0 >> 1;                                                               \
        for (long j = 0; 2 * j < cols; j++)                                             \
            a[(h + j) * ld] = s[2 * j];                                                 \
        for (long j = 0; 2 * j + 1 < cols; j++)                                         \
            b[(h + j + j0) * ld] = s[2 * j + 1];                                        \
    }                                                                                   \
}                                                                                       \
                                                                                        \
EASYAD_WINO_CLONES                                                                      \
static int easyad_wino_in_##SUF(const T_* x, long n, long C, long H, long W, long Hv,   \
                                long Wv, long lo_h, long lo_w, long th, long tw,        \
                                T_* V, long T) {                                        \
    long w1 = tw + 1, phase = (th + 1) * w1, tiles = th * w1;                           \
    /* (+1: the last, spare tile's d33 is element `phase` of the last phase) */        \
    T_* p = (T_*)calloc((size_t)(4 * phase + 1), sizeof(T_));                           \
    if (!p) return -1;                                                                  \
    easyad_wino_window win = easyad_wino_window_of(Hv, Wv, lo_h, lo_w, th, tw);         \
    const T_* restrict p00 = p;                                                         \
    const T_* restrict p01 = p + phase;                                                 \
    const T_* restrict p10 = p + 2 * phase;                                             \
    const T_* restrict p11 = p + 3 * phase;                                             \
    for (long i = 0; i < n; i++)                                                        \
        for (long c = 0; c < C; c++) {                                                  \
            easyad_wino_phases_##SUF(x + (i * C + c) * H * W + win.q0 * W + win.s0,     \
                                     win.rows, win.cols, W, win.r0, win.c0, w1, p,      \
                                     phase, 1);                                         \
            T_* v = V + c * T + i * tiles;                                              \
            long P = C * T;                                                             \
            T_ *restrict v0 = v, *restrict v1 = v + P, *restrict v2 = v + 2 * P;        \
            T_ *restrict v3 = v + 3 * P, *restrict v4 = v + 4 * P;                      \
            T_ *restrict v5 = v + 5 * P, *restrict v6 = v + 6 * P;                      \
            T_ *restrict v7 = v + 7 * P, *restrict v8 = v + 8 * P;                      \
            T_ *restrict v9 = v + 9 * P, *restrict v10 = v + 10 * P;                    \
            T_ *restrict v11 = v + 11 * P, *restrict v12 = v + 12 * P;                  \
            T_ *restrict v13 = v + 13 * P, *restrict v14 = v + 14 * P;                  \
            T_ *restrict v15 = v + 15 * P;                                              \
            _Pragma("GCC ivdep") for (long f = 0; f < tiles; f++) {                   \
                long g = f + w1;                                                        \
                /* d[r][s]: row r from phase r & 1 (a tile row down for r >= 2), column \
                   s likewise; a = B^T d, then v = a B */                               \
                T_ d00 = p00[f], d01 = p01[f], d02 = p00[f + 1], d03 = p01[f + 1];      \
                T_ d10 = p10[f], d11 = p11[f], d12 = p10[f + 1], d13 = p11[f + 1];      \
                T_ d20 = p00[g], d21 = p01[g], d22 = p00[g + 1], d23 = p01[g + 1];      \
                T_ d30 = p10[g], d31 = p11[g], d32 = p10[g + 1], d33 = p11[g + 1];      \
                T_ a00 = d00 - d20, a01 = d01 - d21, a02 = d02 - d22, a03 = d03 - d23;  \
                T_ a10 = d10 + d20, a11 = d11 + d21, a12 = d12 + d22, a13 = d13 + d23;  \
                T_ a20 = d20 - d10, a21 = d21 - d11, a22 = d22 - d12, a23 = d23 - d13;  \
                T_ a30 = d10 - d30, a31 = d11 - d31, a32 = d12 - d32, a33 = d13 - d33;  \
                v0[f] = a00 - a02;  v1[f] = a01 + a02;  v2[f] = a02 - a01;  v3[f] = a01 - a03; \
                v4[f] = a10 - a12;  v5[f] = a11 + a12;  v6[f] = a12 - a11;  v7[f] = a11 - a13; \
                v8[f] = a20 - a22;  v9[f] = a21 + a22;  v10[f] = a22 - a21; v11[f] = a21 - a23; \
                v12[f] = a30 - a32; v13[f] = a31 + a32; v14[f] = a32 - a31; v15[f] = a31 - a33; \
            }                                                                           \
        }                                                                               \
    free(p);                                                                            \
    return 0;                                                                           \
}                                                                                       \
                                                                                        \
EASYAD_WINO_CLONES                                                                      \
static int easyad_wino_out_##SUF(const T_* M, long n, long C, long th, long tw, long T, \
                                 T_* y, long Oh, long Ow) {                             \
    long w1 = tw + 1, tiles = th * w1;                                                  \
    T_* q = (T_*)malloc(sizeof(T_) * (size_t)(4 * tiles));                              \
    if (!q) return -1;                                                                  \
    T_* restrict q00 = q;                                                               \
    T_* restrict q01 = q + tiles;                                                       \
    T_* restrict q10 = q + 2 * tiles;                                                   \
    T_* restrict q11 = q + 3 * tiles;                                                   \
    long P = C * T;                                                                     \
    int finite = 1;                                                                     \
    for (long i = 0; i < n; i++)                                                        \
        for (long c = 0; c < C; c++) {                                                  \
            const T_* m = M + c * T + i * tiles;                                        \
            const T_ *restrict m0 = m, *restrict m1 = m + P, *restrict m2 = m + 2 * P;  \
            const T_ *restrict m3 = m + 3 * P, *restrict m4 = m + 4 * P;                \
            const T_ *restrict m5 = m + 5 * P, *restrict m6 = m + 6 * P;                \
            const T_ *restrict m7 = m + 7 * P, *restrict m8 = m + 8 * P;                \
            const T_ *restrict m9 = m + 9 * P, *restrict m10 = m + 10 * P;              \
            const T_ *restrict m11 = m + 11 * P, *restrict m12 = m + 12 * P;            \
            const T_ *restrict m13 = m + 13 * P, *restrict m14 = m + 14 * P;            \
            const T_ *restrict m15 = m + 15 * P;                                        \
            _Pragma("GCC ivdep") for (long f = 0; f < tiles; f++) {                   \
                /* p = A^T m over the rows, then A over the columns */                  \
                T_ p00 = m0[f] + m4[f] + m8[f], p10 = m4[f] - m8[f] - m12[f];           \
                T_ p01 = m1[f] + m5[f] + m9[f], p11 = m5[f] - m9[f] - m13[f];           \
                T_ p02 = m2[f] + m6[f] + m10[f], p12 = m6[f] - m10[f] - m14[f];         \
                T_ p03 = m3[f] + m7[f] + m11[f], p13 = m7[f] - m11[f] - m15[f];         \
                q00[f] = p00 + p01 + p02;                                               \
                q01[f] = p01 - p02 - p03;                                               \
                q10[f] = p10 + p11 + p12;                                               \
                q11[f] = p11 - p12 - p13;                                               \
                /* s - s is 0 unless an entry is inf or NaN (or their sum overflows): an \
                   integer AND, which gcc vectorises where a float sum would not be */  \
                T_ s = q00[f] + q01[f] + q10[f] + q11[f];                               \
                finite &= (s - s == 0);                                                 \
            }                                                                           \
            T_* plane = y + (i * C + c) * Oh * Ow;                                      \
            for (long r = 0; r < Oh; r++) {                                             \
                T_* restrict row = plane + r * Ow;                                      \
                const T_* restrict e = (r & 1 ? q10 : q00) + (r >> 1) * w1;             \
                const T_* restrict o = (r & 1 ? q11 : q01) + (r >> 1) * w1;             \
                for (long j = 0; 2 * j < Ow; j++) row[2 * j] = e[j];                    \
                for (long j = 0; 2 * j + 1 < Ow; j++) row[2 * j + 1] = o[j];            \
            }                                                                           \
        }                                                                               \
    free(q);                                                                            \
    return finite ? 0 : 1;                                                              \
}                                                                                       \
                                                                                        \
EASYAD_WINO_CLONES                                                                      \
static int easyad_wino_grad_##SUF(const T_* g, long n, long C, long Oh, long Ow,        \
                                  long th, long tw, long T, T_* Q) {                    \
    long w1 = tw + 1, tiles = th * w1;                                                  \
    T_* p = (T_*)calloc((size_t)(4 * tiles), sizeof(T_));                               \
    if (!p) return -1;                                                                  \
    const T_* restrict g00 = p;                                                         \
    const T_* restrict g01 = p + tiles;                                                 \
    const T_* restrict g10 = p + 2 * tiles;                                             \
    const T_* restrict g11 = p + 3 * tiles;                                             \
    long P = C * T;                                                                     \
    for (long i = 0; i < n; i++)                                                        \
        for (long c = 0; c < C; c++) {                                                  \
            easyad_wino_phases_##SUF(g + (i * C + c) * Oh * Ow, Oh, Ow, Ow, 0, 0, w1,   \
                                     p, tiles, 1);                                      \
            T_* q = Q + c * T + i * tiles;                                              \
            T_ *restrict q0 = q, *restrict q1 = q + P, *restrict q2 = q + 2 * P;        \
            T_ *restrict q3 = q + 3 * P, *restrict q4 = q + 4 * P;                      \
            T_ *restrict q5 = q + 5 * P, *restrict q6 = q + 6 * P;                      \
            T_ *restrict q7 = q + 7 * P, *restrict q8 = q + 8 * P;                      \
            T_ *restrict q9 = q + 9 * P, *restrict q10 = q + 10 * P;                    \
            T_ *restrict q11 = q + 11 * P, *restrict q12 = q + 12 * P;                  \
            T_ *restrict q13 = q + 13 * P, *restrict q14 = q + 14 * P;                  \
            T_ *restrict q15 = q + 15 * P;                                              \
            _Pragma("GCC ivdep") for (long f = 0; f < tiles; f++) {                   \
                /* rows of A gg: g0, g0 + g1, g0 - g1, -g1; then the same on columns */ \
                T_ a0 = g00[f], b0 = g01[f], a1 = g10[f], b1 = g11[f];                  \
                T_ r0 = a0, s0 = b0, r1 = a0 + a1, s1 = b0 + b1;                        \
                T_ r2 = a0 - a1, s2 = b0 - b1, r3 = -a1, s3 = -b1;                      \
                q0[f] = r0;  q1[f] = r0 + s0;  q2[f] = r0 - s0;  q3[f] = -s0;           \
                q4[f] = r1;  q5[f] = r1 + s1;  q6[f] = r1 - s1;  q7[f] = -s1;           \
                q8[f] = r2;  q9[f] = r2 + s2;  q10[f] = r2 - s2; q11[f] = -s2;          \
                q12[f] = r3; q13[f] = r3 + s3; q14[f] = r3 - s3; q15[f] = -s3;          \
            }                                                                           \
        }                                                                               \
    free(p);                                                                            \
    return 0;                                                                           \
}


/* easyad_wino_in_t: the input transform of easyad_wino_in into a tile-major V (16, T, C),
 * V[xi][t][c], for C a multiple of 8: the weight's gradient multiplies Q (C_out x T) by
 * it, and OpenBLAS (one thread, 32 x 210 by 210 x 32) runs that product at ~170 GFLOP/s
 * against ~110 for Q times a transposed (16, C, T) V (its packing of a transposed B).
 * Eight channels go at a time, their phases interleaved (element e of channel k at
 * 8 e + k), so the tile loop reads and writes eight adjacent channels (one AVX2 vector).
 * The tile-major writes cost: 34 against 22 us an image (32 channels 28x28) for the
 * transform, ~12 us, against ~25 us gained by the product (16 channels at a time, or
 * all of them, ran slower: 45 and 51 us). */
#define EASYAD_WINO_DEFINE_T(T_, SUF)                                                   \
EASYAD_WINO_CLONES                                                                      \
static int easyad_wino_in_t_##SUF(const T_* x, long n, long C, long H, long W, long Hv, \
                                  long Wv, long lo_h, long lo_w, long th, long tw,      \
                                  T_* V, long T) {                                      \
    if (C % 8) return -2;                                                               \
    long w1 = tw + 1, phase = (th + 1) * w1, tiles = th * w1;                           \
    T_* p = (T_*)calloc((size_t)(32 * phase + 8), sizeof(T_));   /* +8: see above */  \
    if (!p) return -1;                                                                  \
    easyad_wino_window win = easyad_wino_window_of(Hv, Wv, lo_h, lo_w, th, tw);         \
    const T_* restrict p00 = p;                                                         \
    const T_* restrict p01 = p + 8 * phase;                                             \
    const T_* restrict p10 = p + 16 * phase;                                            \
    const T_* restrict p11 = p + 24 * phase;                                            \
    long P = T * C;                                                                     \
    for (long i = 0; i < n; i++)                                                        \
        for (long cb = 0; cb < C; cb += 8) {                                            \
            for (long k = 0; k < 8; k++)                                                \
                easyad_wino_phases_##SUF(x + (i * C + cb + k) * H * W + win.q0 * W     \
                                         + win.s0, win.rows, win.cols, W, win.r0,       \
                                         win.c0, w1, p + k, phase, 8);                  \
            T_* v = V + i * tiles * C + cb;                                             \
            T_ *restrict v0 = v, *restrict v1 = v + P, *restrict v2 = v + 2 * P;        \
            T_ *restrict v3 = v + 3 * P, *restrict v4 = v + 4 * P;                      \
            T_ *restrict v5 = v + 5 * P, *restrict v6 = v + 6 * P;                      \
            T_ *restrict v7 = v + 7 * P, *restrict v8 = v + 8 * P;                      \
            T_ *restrict v9 = v + 9 * P, *restrict v10 = v + 10 * P;                    \
            T_ *restrict v11 = v + 11 * P, *restrict v12 = v + 12 * P;                  \
            T_ *restrict v13 = v + 13 * P, *restrict v14 = v + 14 * P;                  \
            T_ *restrict v15 = v + 15 * P;                                              \
            for (long f = 0; f < tiles; f++) {                                          \
                long e = 8 * f, u = 8 * (f + w1), o = f * C;                            \
                _Pragma("GCC ivdep") for (long k = 0; k < 8; k++) {                     \
                    long a = e + k, b = u + k;                                          \
                    T_ d00 = p00[a], d01 = p01[a], d02 = p00[a + 8], d03 = p01[a + 8];  \
                    T_ d10 = p10[a], d11 = p11[a], d12 = p10[a + 8], d13 = p11[a + 8];  \
                    T_ d20 = p00[b], d21 = p01[b], d22 = p00[b + 8], d23 = p01[b + 8];  \
                    T_ d30 = p10[b], d31 = p11[b], d32 = p10[b + 8], d33 = p11[b + 8];  \
                    T_ a00 = d00 - d20, a01 = d01 - d21, a02 = d02 - d22;               \
                    T_ a03 = d03 - d23, a10 = d10 + d20, a11 = d11 + d21;               \
                    T_ a12 = d12 + d22, a13 = d13 + d23, a20 = d20 - d10;               \
                    T_ a21 = d21 - d11, a22 = d22 - d12, a23 = d23 - d13;               \
                    T_ a30 = d10 - d30, a31 = d11 - d31, a32 = d12 - d32;               \
                    T_ a33 = d13 - d33;                                                 \
                    long t = o + k;                                                     \
                    v0[t] = a00 - a02;  v1[t] = a01 + a02;                              \
                    v2[t] = a02 - a01;  v3[t] = a01 - a03;                              \
                    v4[t] = a10 - a12;  v5[t] = a11 + a12;                              \
                    v6[t] = a12 - a11;  v7[t] = a11 - a13;                              \
                    v8[t] = a20 - a22;  v9[t] = a21 + a22;                              \
                    v10[t] = a22 - a21; v11[t] = a21 - a23;                             \
                    v12[t] = a30 - a32; v13[t] = a31 + a32;                             \
                    v14[t] = a32 - a31; v15[t] = a31 - a33;                             \
                }                                                                       \
            }                                                                           \
        }                                                                               \
    free(p);                                                                            \
    return 0;                                                                           \
}


/* easyad_wino_conv: a whole convolution (one group) image by image: the input transform,
 * the 16 products U[xi] (Co x C) by V[xi] (C x tiles) on OpenBLAS's cblas gemm (`gemm`,
 * found by tensor/_blas.py: 64-bit integers where idx64) and the output transform, with
 * no return to Python between them (the per-image loop in Python cost ~4.5 us an image
 * in calls: ~0.3 ms of a 6 ms convolution of 64 images). Returns -1 without memory, 1
 * where the output transform saw something not finite, else 0. */
#define EASYAD_WINO_DEFINE_CONV(T_, SUF)                                                \
typedef void (*easyad_gemm32_##SUF)(int, int, int, int, int, int, T_, const T_*, int,  \
                                    const T_*, int, T_, T_*, int);                      \
typedef void (*easyad_gemm64_##SUF)(int, int, int, long long, long long, long long, T_, \
                                    const T_*, long long, const T_*, long long, T_,     \
                                    T_*, long long);                                    \
static int easyad_wino_conv_##SUF(const T_* x, long n, long C, long H, long W, long Hv, \
                                  long Wv, long lo_h, long lo_w, long th, long tw,      \
                                  const T_* U, long Co, T_* y, long Oh, long Ow,        \
                                  void* gemm, int idx64) {                              \
    long tiles = th * (tw + 1);                                                         \
    T_* V = (T_*)malloc(sizeof(T_) * (size_t)(16 * C * tiles));                         \
    T_* R = (T_*)malloc(sizeof(T_) * (size_t)(16 * Co * tiles));                        \
    int finite = 1, rc = 0;                                                             \
    if (!V || !R) rc = -1;                                                              \
    for (long i = 0; i < n && rc == 0; i++) {                                           \
        rc = easyad_wino_in_##SUF(x + i * C * H * W, 1, C, H, W, Hv, Wv, lo_h, lo_w,    \
                                  th, tw, V, tiles);                                    \
        if (rc) break;                                                                  \
        for (long xi = 0; xi < 16; xi++) {  /* 101 row major, 111 no transpose */       \
            if (idx64)                                                                  \
                ((easyad_gemm64_##SUF)gemm)(101, 111, 111, Co, tiles, C, 1, U + xi * Co * C, \
                                            C, V + xi * C * tiles, tiles, 0,            \
                                            R + xi * Co * tiles, tiles);                \
            else                                                                        \
                ((easyad_gemm32_##SUF)gemm)(101, 111, 111, (int)Co, (int)tiles, (int)C, 1, \
                                            U + xi * Co * C, (int)C, V + xi * C * tiles, \
                                            (int)tiles, 0, R + xi * Co * tiles,         \
                                            (int)tiles);                                \
        }                                                                               \
        int out = easyad_wino_out_##SUF(R, 1, Co, th, tw, tiles, y + i * Co * Oh * Ow,  \
                                        Oh, Ow);                                        \
        if (out < 0) rc = -1;                                                           \
        if (out == 1) finite = 0;                                                       \
    }                                                                                   \
    free(V);                                                                            \
    free(R);                                                                            \
    return rc ? rc : (finite ? 0 : 1);                                                  \
}                                                                                       \
                                                                                        \
/* the weight's gradient likewise: per image the tile-major V (C a multiple of 8) and    \
 * the cotangent's Q, then total[xi] (Co x C, zeroed by the caller) += Q[xi] V[xi] by    \
 * the gemm's beta = 1 (no product array to add afterwards) */                          \
static int easyad_wino_wgrad_##SUF(const T_* x, const T_* g, long n, long C, long H,    \
                                   long W, long Hv, long Wv, long lo_h, long lo_w,      \
                                   long th, long tw, long Co, long Oh, long Ow,         \
                                   T_* total, void* gemm, int idx64) {                  \
    long tiles = th * (tw + 1);                                                         \
    T_* V = (T_*)malloc(sizeof(T_) * (size_t)(16 * C * tiles));                         \
    T_* Q = (T_*)malloc(sizeof(T_) * (size_t)(16 * Co * tiles));                        \
    int rc = (!V || !Q) ? -1 : 0;                                                       \
    for (long i = 0; i < n && rc == 0; i++) {                                           \
        rc = easyad_wino_in_t_##SUF(x + i * C * H * W, 1, C, H, W, Hv, Wv, lo_h, lo_w,  \
                                    th, tw, V, tiles);                                  \
        if (rc == 0)                                                                    \
            rc = easyad_wino_grad_##SUF(g + i * Co * Oh * Ow, 1, Co, Oh, Ow, th, tw,    \
                                        tiles, Q);                                      \
        if (rc) break;                                                                  \
        for (long xi = 0; xi < 16; xi++) {                                              \
            if (idx64)                                                                  \
                ((easyad_gemm64_##SUF)gemm)(101, 111, 111, Co, C, tiles, 1,             \
                                            Q + xi * Co * tiles, tiles,                 \
                                            V + xi * tiles * C, C, 1, total + xi * Co * C, C); \
            else                                                                        \
                ((easyad_gemm32_##SUF)gemm)(101, 111, 111, (int)Co, (int)C, (int)tiles, 1, \
                                            Q + xi * Co * tiles, (int)tiles,            \
                                            V + xi * tiles * C, (int)C, 1,              \
                                            total + xi * Co * C, (int)C);               \
        }                                                                               \
    }                                                                                   \
    free(V);                                                                            \
    free(Q);                                                                            \
    return rc < 0 ? -1 : rc;                                                            \
}


EASYAD_WINO_DEFINE(float, f32)
EASYAD_WINO_DEFINE(double, f64)
EASYAD_WINO_DEFINE_T(float, f32)
EASYAD_WINO_DEFINE_T(double, f64)
EASYAD_WINO_DEFINE_CONV(float, f32)
EASYAD_WINO_DEFINE_CONV(double, f64)

#endif
