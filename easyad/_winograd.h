/* Winograd F(2x2, 3x3) transforms for the 3x3, stride-1 convolutions of ops/_conv_cpu.py
 * (see ops/_conv_winograd.py for the algebra and where they are used).
 *
 * Every output tile of 2x2 reads a 4x4 tile of the padded input, starting at (2ty, 2tx).
 * The transforms of a tile are sums and differences only (no rounding beyond the adds'),
 * written plane by plane: plane xi = 4k + l of V, M or Q holds entry (k, l) of every
 * tile, ``T`` tiles a channel, so the products between them are 16 GEMMs.
 *
 * - easyad_wino_in:  V[xi][c][t] = (B^T d B)[k][l] for the input tile d of image i, channel
 *   c (t = (i th + ty) tw + tx); x is read as zero outside rows [0, Hv) and columns
 *   [0, Wv) (Hv < H where a negative padding cuts the input), padded by lo_h/lo_w.
 * - easyad_wino_out: y[i][c][2ty + a][2tx + b] = (A^T m A)[a][b] for M's tile m, dropping
 *   rows/columns past Oh/Ow (an odd size's last tile).
 * - easyad_wino_grad: Q[xi][c][t] = (A gg A^T)[k][l], gg the 2x2 tile of g (zero past
 *   Oh/Ow): the weight gradient's transform of the cotangent.
 *
 * With B^T = [[1,0,-1,0],[0,1,1,0],[0,-1,1,0],[0,1,0,-1]], A^T = [[1,1,1,0],[0,1,-1,-1]].
 * The loops work on whole rows (contiguous, so gcc vectorises them): a tile row's four
 * input rows are copied with their zeros into a buffer, combined row by row, split into
 * even and odd columns, then combined column by column into the planes. */
#ifndef EASYAD_WINOGRAD_H
#define EASYAD_WINOGRAD_H

#include <stdlib.h>
#include <string.h>

#define EASYAD_WINO_DEFINE(T_, SUF)                                                     \
static int easyad_wino_in_##SUF(const T_* x, long n, long C, long H, long W, long Hv,   \
                                long Wv, long lo_h, long lo_w, long th, long tw,        \
                                T_* V, long T) {                                        \
    long wp = 2 * tw + 2, half = tw + 1;                                                \
    T_* buf = (T_*)malloc(sizeof(T_) * (size_t)(4 * wp + 8 * half));                    \
    if (!buf) return -1;                                                                \
    T_* ev = buf + 4 * wp;            /* 4 rows' even columns, then 4 rows' odd */       \
    T_* od = ev + 4 * half;                                                             \
    long c0 = lo_w > 0 ? lo_w : 0;    /* first buffer column holding x */               \
    long s0 = c0 - lo_w;              /* its column of x */                             \
    long cols = Wv - s0;                                                                \
    if (cols > wp - c0) cols = wp - c0;                                                 \
    if (cols < 0) cols = 0;                                                             \
    for (long i = 0; i < n; i++)                                                        \
        for (long c = 0; c < C; c++) {                                                  \
            const T_* plane = x + (i * C + c) * H * W;                                  \
            for (long ty = 0; ty < th; ty++) {                                          \
                for (long r = 0; r < 4; r++) {                                          \
                    T_* row = buf + r * wp;                                             \
                    long src = 2 * ty + r - lo_h;                                       \
                    if (src < 0 || src >= Hv || cols == 0) {                            \
                        memset(row, 0, sizeof(T_) * (size_t)wp);                        \
                        continue;                                                       \
                    }                                                                   \
                    memset(row, 0, sizeof(T_) * (size_t)c0);                            \
                    memcpy(row + c0, plane + src * W + s0, sizeof(T_) * (size_t)cols);  \
                    memset(row + c0 + cols, 0, sizeof(T_) * (size_t)(wp - c0 - cols));  \
                }                                                                       \
                /* rows: a0 = d0 - d2, a1 = d1 + d2, a2 = d2 - d1, a3 = d1 - d3, split  \
                   into even and odd columns */                                         \
                const T_ *d0 = buf, *d1 = buf + wp, *d2 = buf + 2 * wp, *d3 = buf + 3 * wp; \
                for (long j = 0; j < half; j++) {                                       \
                    long e = 2 * j, o = 2 * j + 1;                                      \
                    ev[j] = d0[e] - d2[e];                od[j] = d0[o] - d2[o];        \
                    ev[half + j] = d1[e] + d2[e];         od[half + j] = d1[o] + d2[o]; \
                    ev[2 * half + j] = d2[e] - d1[e];     od[2 * half + j] = d2[o] - d1[o]; \
                    ev[3 * half + j] = d1[e] - d3[e];     od[3 * half + j] = d1[o] - d3[o]; \
                }                                                                       \
                long t0 = (i * th + ty) * tw;                                           \
                for (long k = 0; k < 4; k++) {                                          \
                    const T_* e = ev + k * half;                                        \
                    const T_* o = od + k * half;                                        \
                    T_* v0 = V + ((4 * k) * C + c) * T + t0;                            \
                    T_* v1 = v0 + C * T;                                                \
                    T_* v2 = v1 + C * T;                                                \
                    T_* v3 = v2 + C * T;                                                \
                    for (long tx = 0; tx < tw; tx++) {                                  \
                        v0[tx] = e[tx] - e[tx + 1];                                     \
                        v1[tx] = o[tx] + e[tx + 1];                                     \
                        v2[tx] = e[tx + 1] - o[tx];                                     \
                        v3[tx] = o[tx] - o[tx + 1];                                     \
                    }                                                                   \
                }                                                                       \
            }                                                                           \
        }                                                                               \
    free(buf);                                                                          \
    return 0;                                                                           \
}                                                                                       \
                                                                                        \
static int easyad_wino_out_##SUF(const T_* M, long n, long C, long th, long tw, long T, \
                                 T_* y, long Oh, long Ow) {                             \
    T_* buf = (T_*)malloc(sizeof(T_) * (size_t)(12 * tw));                              \
    if (!buf) return -1;                                                                \
    T_* r0 = buf + 8 * tw;              /* the two output rows, interleaved */          \
    T_* r1 = r0 + 2 * tw;                                                               \
    for (long i = 0; i < n; i++)                                                        \
        for (long c = 0; c < C; c++) {                                                  \
            T_* plane = y + (i * C + c) * Oh * Ow;                                      \
            for (long ty = 0; ty < th; ty++) {                                          \
                long t0 = (i * th + ty) * tw;                                           \
                /* columns first: p[a][l] = (A^T m)[a][l] over the rows k */            \
                for (long l = 0; l < 4; l++) {                                          \
                    const T_* m0 = M + (l * C + c) * T + t0;                            \
                    const T_* m1 = m0 + 4 * C * T;                                      \
                    const T_* m2 = m1 + 4 * C * T;                                      \
                    const T_* m3 = m2 + 4 * C * T;                                      \
                    T_* p0 = buf + l * tw;                                              \
                    T_* p1 = buf + (4 + l) * tw;                                        \
                    for (long tx = 0; tx < tw; tx++) {                                  \
                        p0[tx] = m0[tx] + m1[tx] + m2[tx];                              \
                        p1[tx] = m1[tx] - m2[tx] - m3[tx];                              \
                    }                                                                   \
                }                                                                       \
                for (long a = 0; a < 2; a++) {                                          \
                    const T_* q = buf + 4 * a * tw;                                     \
                    T_* r = a ? r1 : r0;                                                \
                    for (long tx = 0; tx < tw; tx++) {                                  \
                        r[2 * tx] = q[tx] + q[tw + tx] + q[2 * tw + tx];                \
                        r[2 * tx + 1] = q[tw + tx] - q[2 * tw + tx] - q[3 * tw + tx];   \
                    }                                                                   \
                }                                                                       \
                memcpy(plane + 2 * ty * Ow, r0, sizeof(T_) * (size_t)Ow);               \
                if (2 * ty + 1 < Oh)                                                    \
                    memcpy(plane + (2 * ty + 1) * Ow, r1, sizeof(T_) * (size_t)Ow);     \
            }                                                                           \
        }                                                                               \
    free(buf);                                                                          \
    return 0;                                                                           \
}                                                                                       \
                                                                                        \
static int easyad_wino_grad_##SUF(const T_* g, long n, long C, long Oh, long Ow,        \
                                  long th, long tw, long T, T_* Q) {                    \
    T_* buf = (T_*)malloc(sizeof(T_) * (size_t)(12 * tw));                              \
    if (!buf) return -1;                                                                \
    T_* g0 = buf + 8 * tw;              /* the tile row's two rows of g, zero-padded */  \
    T_* g1 = g0 + 2 * tw;                                                               \
    for (long i = 0; i < n; i++)                                                        \
        for (long c = 0; c < C; c++) {                                                  \
            const T_* plane = g + (i * C + c) * Oh * Ow;                                \
            for (long ty = 0; ty < th; ty++) {                                          \
                memset(g0, 0, sizeof(T_) * (size_t)(4 * tw));                           \
                memcpy(g0, plane + 2 * ty * Ow, sizeof(T_) * (size_t)Ow);               \
                if (2 * ty + 1 < Oh)                                                    \
                    memcpy(g1, plane + (2 * ty + 1) * Ow, sizeof(T_) * (size_t)Ow);     \
                /* rows k of A gg: g0, g0 + g1, g0 - g1, -g1; even/odd columns apart */ \
                for (long tx = 0; tx < tw; tx++) {                                      \
                    T_ a0 = g0[2 * tx], b0 = g0[2 * tx + 1];                            \
                    T_ a1 = g1[2 * tx], b1 = g1[2 * tx + 1];                            \
                    buf[tx] = a0;                 buf[4 * tw + tx] = b0;                \
                    buf[tw + tx] = a0 + a1;       buf[5 * tw + tx] = b0 + b1;           \
                    buf[2 * tw + tx] = a0 - a1;   buf[6 * tw + tx] = b0 - b1;           \
                    buf[3 * tw + tx] = -a1;       buf[7 * tw + tx] = -b1;               \
                }                                                                       \
                long t0 = (i * th + ty) * tw;                                           \
                for (long k = 0; k < 4; k++) {                                          \
                    const T_* e = buf + k * tw;                                         \
                    const T_* o = buf + (4 + k) * tw;                                   \
                    T_* q0 = Q + ((4 * k) * C + c) * T + t0;                            \
                    T_* q1 = q0 + C * T;                                                \
                    T_* q2 = q1 + C * T;                                                \
                    T_* q3 = q2 + C * T;                                                \
                    for (long tx = 0; tx < tw; tx++) {                                  \
                        q0[tx] = e[tx];                                                 \
                        q1[tx] = e[tx] + o[tx];                                         \
                        q2[tx] = e[tx] - o[tx];                                         \
                        q3[tx] = -o[tx];                                                \
                    }                                                                   \
                }                                                                       \
            }                                                                           \
        }                                                                               \
    free(buf);                                                                          \
    return 0;                                                                           \
}

EASYAD_WINO_DEFINE(float, f32)
EASYAD_WINO_DEFINE(double, f64)

#endif
