/* An LSTM layer's float32 recurrence in one C call each way (easyad/ops/_lstm.py): the
 * per-step product on the AVX-512 GEMM of _gemm.h, then ONE pass over the step's (B, H)
 * cells instead of a dozen numpy passes, with sigmoid and tanh in float32 from a branch-
 * free exp that gcc vectorises (16 lanes), not libm calls.
 *
 * Accuracy (tests/test_lstm_kernel.py checks it against float64 at random points,
 * extremes, -0, inf and nan), in float32 ulps from the exact value: exp <= 2 (0.9
 * seen), sigmoid <= 3 (2.5 seen), tanh <= 3 (1.5 seen); inf and nan propagate as libm's
 * do, tanh(-0) = -0, and underflow is gradual (exp(-100) is the subnormal it should be).
 *
 * Layouts (all C-contiguous): xproj (T, B, 4H) gate order i, f, g, o; h0, c0 (B, H);
 * w = W_hh (4H, H); y (T, 6, B, H) packs i, f, g, o, c, h per step;
 * gy like y (the result's cotangent; NULL stands for zeros);
 * d (T [+1], B, 4H): the pre-activations' cotangents, row T (dc0, dh0, 0, 0). */
#ifndef EASYAD_LSTM_H
#define EASYAD_LSTM_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "_gemm.h"

#if EASYAD_GEMM_X86

/* type punning through a union (defined in GNU C; memcpy here kept gcc from
 * vectorising the cells' loop) */
typedef union { float f; int32_t i; } easyad_lstm_pun;

static inline float easyad_lstm_bits_to_float(int32_t b) {
    easyad_lstm_pun u;
    u.i = b;
    return u.f;
}

static inline int32_t easyad_lstm_float_bits(float f) {
    easyad_lstm_pun u;
    u.f = f;
    return u.i;
}

/* exp(x): x = n ln2 + r, |r| <= ln2/2, exp(r) by its Taylor series to r^7 (truncation
 * 0.03 ulp), times 2^n as two powers of two (so results down to the subnormals are
 * right). The clamps keep nan (comparisons with nan are false); n comes from the bits
 * of x log2(e) + 1.5 2^23 (round to nearest), never from a float-to-int conversion. */
static inline float easyad_lstm_expf(float x) {
    x = x > 88.8f ? 88.8f : x;           /* exp(88.8) overflows to inf, as it should */
    x = x < -104.0f ? -104.0f : x;       /* exp(-104) rounds to 0 */
    const float magic = 12582912.0f;     /* 1.5 2^23 */
    const float t = __builtin_fmaf(x, 1.44269502f, magic);
    const float n = t - magic;
    const int32_t ni = easyad_lstm_float_bits(t) - easyad_lstm_float_bits(magic);
    float r = __builtin_fmaf(n, -0.693145751953125f, x);   /* ln2's high part: n hi exact */
    r = __builtin_fmaf(n, -1.42860682e-06f, r);             /* and its low part */
    float p = 1.98412698e-04f;                               /* 1/5040 */
    p = __builtin_fmaf(p, r, 1.38888889e-03f);
    p = __builtin_fmaf(p, r, 8.33333377e-03f);
    p = __builtin_fmaf(p, r, 4.16666679e-02f);
    p = __builtin_fmaf(p, r, 1.66666672e-01f);
    p = __builtin_fmaf(p, r, 0.5f);
    p = __builtin_fmaf(p, r, 1.0f);
    p = __builtin_fmaf(p, r, 1.0f);
    const int32_t half = ni >> 1;
    return p * easyad_lstm_bits_to_float((half + 127) << 23)
             * easyad_lstm_bits_to_float((ni - half + 127) << 23);
}

/* σ(x) from e = exp(-|x|): 1/(1+e) for x >= 0, e/(1+e) below (no overflow, and tiny
 * results keep their relative accuracy) */
static inline float easyad_lstm_sigmoidf(float x) {
    const float e = easyad_lstm_expf(-__builtin_fabsf(x));
    const float s = 1.0f / (1.0f + e);
    return x >= 0.0f ? s : e * s;
}

/* tanh(x) = sign(x) tanh(|x|): below |x| = 0.55 an odd polynomial a (1 + a^2 q(a^2))
 * (least squares fit, 0.002 ulp from tanh in exact arithmetic); above, (1 - e)/(1 + e)
 * with e = exp(-2|x|) (e <= 1/3: no cancellation); the sign put back last (so -0 stays
 * -0 and nan stays nan) */
static inline float easyad_lstm_tanhf(float x) {
    const float a = __builtin_fabsf(x);
    const float u = a * a;
    float q = 2.54436256e-03f;
    q = __builtin_fmaf(q, u, -8.54059402e-03f);
    q = __builtin_fmaf(q, u, 2.18224879e-02f);
    q = __builtin_fmaf(q, u, -5.39651848e-02f);
    q = __builtin_fmaf(q, u, 1.33333266e-01f);
    q = __builtin_fmaf(q, u, -3.33333343e-01f);
    const float small = __builtin_fmaf(a * u, q, a);
    const float e = easyad_lstm_expf(-2.0f * a);
    const float big = (1.0f - e) / (1.0f + e);
    return __builtin_copysignf(a < 0.55f ? small : big, x);
}

/* one step's cells: a = prod (B, 4H) + xproj_t; the gates and the state into yt's six
 * (B, H) blocks (a row at a time: gcc vectorises the row's loop) */
static inline void easyad_lstm_cells_row(long H, const float* restrict pr,
                                         const float* restrict xr,
                                         const float* restrict cp, long blk,
                                         float* restrict yi) {
    float* restrict yf = yi + blk;
    float* restrict yg = yi + 2 * blk;
    float* restrict yo = yi + 3 * blk;
    float* restrict yc = yi + 4 * blk;
    float* restrict yh = yi + 5 * blk;
    const float *pf = pr + H, *pg = pr + 2 * H, *po = pr + 3 * H;
    const float *xf = xr + H, *xg = xr + 2 * H, *xo = xr + 3 * H;
#pragma GCC ivdep
    for (long j = 0; j < H; j++) {      /* (restrict is lost when gcc inlines this) */
        const float i = easyad_lstm_sigmoidf(pr[j] + xr[j]);
        const float f = easyad_lstm_sigmoidf(pf[j] + xf[j]);
        const float g = easyad_lstm_tanhf(pg[j] + xg[j]);
        const float o = easyad_lstm_sigmoidf(po[j] + xo[j]);
        const float c = f * cp[j] + i * g;
        yi[j] = i;
        yf[j] = f;
        yg[j] = g;
        yo[j] = o;
        yc[j] = c;
        yh[j] = o * easyad_lstm_tanhf(c);
    }
}

static EASYAD_GEMM_TARGET void easyad_lstm_cells_f32(long B, long H, const float* prod,
                                                     const float* xt, const float* cprev,
                                                     float* yt) {
    for (long b = 0; b < B; b++)
        easyad_lstm_cells_row(H, prod + b * 4 * H, xt + b * 4 * H, cprev + b * H, B * H,
                              yt + b * H);
}

/* the (K, N) matrix of element strides (bk, bn) packed once for the steps' products:
 * W_hh^T read from W_hh by its strides, or W_hh (NULL: no memory) */
static float* easyad_lstm_pack(long N, long K, const float* B, long bk, long bn) {
    const long panels = (N + 63) / 64;
    float* packed = (float*)aligned_alloc(64, sizeof(float) * panels * K * 64);
    if (packed) easyad_gemm_f32_pack(N, K, B, bk, bn, packed);
    return packed;
}

/* the forward recurrence; prod is (B, 4H) scratch; -1 when out of memory */
static EASYAD_GEMM_TARGET int easyad_lstm_scan_f32(long T, long B, long H, int reverse,
                                                   const float* xproj, const float* h0,
                                                   const float* c0, const float* w,
                                                   float* y, float* prod) {
    const long blk = B * H;
    const float *h = h0, *c = c0;
    float* packed = easyad_lstm_pack(4 * H, H, w, 1, H);      /* W_hh^T */
    if (!packed) return -1;
    for (long k = 0; k < T; k++) {
        const long t = reverse ? T - 1 - k : k;
        float* yt = y + t * 6 * blk;
        easyad_gemm_f32_packed(B, 4 * H, H, h, H, 1, packed, prod, 4 * H);
        easyad_lstm_cells_f32(B, H, prod, xproj + t * B * 4 * H, c, yt);
        c = yt + 4 * blk;
        h = yt + 5 * blk;
    }
    free(packed);
    return 0;
}

/* one step's cotangents: dh (in: dL/dh_t less gy's h slot; out: unchanged) and dc (in:
 * the carry from step t+1; out: dc f, the carry to step t-1); dt (B, 4H) the
 * pre-activations' cotangents. `has_g` is a constant where it is inlined: one loop with
 * gy's slots, one without. */
static inline void easyad_lstm_cells_vjp_row(long H, int has_g, const float* restrict yi,
                                             long blk, const float* restrict gi,
                                             const float* restrict cp,
                                             const float* restrict dh,
                                             float* restrict dc, float* restrict d) {
    const float *yf = yi + blk, *yg = yi + 2 * blk, *yo = yi + 3 * blk, *yc = yi + 4 * blk;
#pragma GCC ivdep
    for (long j = 0; j < H; j++) {
        const float i = yi[j], f = yf[j], g = yg[j], o = yo[j];
        const float tc = easyad_lstm_tanhf(yc[j]);
        float dhe = dh[j], dce = dc[j];
        float si = 0.0f, sf = 0.0f, sg = 0.0f, so = 0.0f;
        if (has_g) {
            si = gi[j]; sf = gi[blk + j]; sg = gi[2 * blk + j]; so = gi[3 * blk + j];
            dce += gi[4 * blk + j];
            dhe += gi[5 * blk + j];
        }
        dce += dhe * o * (1.0f - tc * tc);
        d[j] = (dce * g + si) * (i - i * i);
        d[H + j] = (dce * cp[j] + sf) * (f - f * f);
        d[2 * H + j] = (dce * i + sg) * (1.0f - g * g);
        d[3 * H + j] = (dhe * tc + so) * (o - o * o);
        dc[j] = dce * f;
    }
}

static EASYAD_GEMM_TARGET void easyad_lstm_cells_vjp_f32(long B, long H, const float* yt,
                                                         const float* gt,
                                                         const float* cprev,
                                                         const float* dh, float* dc,
                                                         float* dt) {
    const long blk = B * H;
    for (long b = 0; b < B; b++) {
        const long r = b * H;
        if (gt)
            easyad_lstm_cells_vjp_row(H, 1, yt + r, blk, gt + r, cprev + r, dh + r, dc + r,
                                      dt + b * 4 * H);
        else
            easyad_lstm_cells_vjp_row(H, 0, yt + r, blk, NULL, cprev + r, dh + r, dc + r,
                                      dt + b * 4 * H);
    }
}

/* the backward recurrence; dh, dc (B, H) scratch; with `initial`, d's row T takes
 * (dc0, dh0, 0, 0); -1 when out of memory */
static EASYAD_GEMM_TARGET int easyad_lstm_scan_vjp_f32(long T, long B, long H,
                                                        int reverse, int initial,
                                                        const float* gy, const float* y,
                                                        const float* c0, const float* w,
                                                        float* d, float* dh, float* dc) {
    const long blk = B * H;
    float* packed = easyad_lstm_pack(H, 4 * H, w, H, 1);
    if (!packed) return -1;
    memset(dh, 0, sizeof(float) * blk);
    memset(dc, 0, sizeof(float) * blk);
    for (long k = T - 1; k >= 0; k--) {
        const long t = reverse ? T - 1 - k : k;
        const long tp = reverse ? t + 1 : t - 1;        /* the step before, in order */
        const float* cprev = k == 0 ? c0 : y + tp * 6 * blk + 4 * blk;
        float* dt = d + t * B * 4 * H;
        easyad_lstm_cells_vjp_f32(B, H, y + t * 6 * blk, gy ? gy + t * 6 * blk : NULL,
                                  cprev, dh, dc, dt);
        easyad_gemm_f32_packed(B, H, 4 * H, dt, 4 * H, 1, packed, dh, H);
    }
    if (initial) {
        float* last = d + T * B * 4 * H;
        for (long b = 0; b < B; b++) {
            memcpy(last + b * 4 * H, dc + b * H, sizeof(float) * H);
            memcpy(last + b * 4 * H + H, dh + b * H, sizeof(float) * H);
            memset(last + b * 4 * H + 2 * H, 0, sizeof(float) * 2 * H);
        }
    }
    free(packed);
    return 0;
}

/* the approximations on arrays, for the tests (which = 0 exp, 1 sigmoid, 2 tanh) */
static EASYAD_GEMM_TARGET void easyad_lstm_apply_f32(int which, long n, const float* x,
                                                     float* z) {
    if (which == 0)
        for (long k = 0; k < n; k++) z[k] = easyad_lstm_expf(x[k]);
    else if (which == 1)
        for (long k = 0; k < n; k++) z[k] = easyad_lstm_sigmoidf(x[k]);
    else
        for (long k = 0; k < n; k++) z[k] = easyad_lstm_tanhf(x[k]);
}

#else
static int easyad_lstm_scan_f32(long T, long B, long H, int reverse, const float* xproj,
                                 const float* h0, const float* c0, const float* w,
                                 float* y, float* prod) { return -1; }
static int easyad_lstm_scan_vjp_f32(long T, long B, long H, int reverse, int initial,
                                     const float* gy, const float* y, const float* c0,
                                     const float* w, float* d, float* dh, float* dc) {
    return -1;
}
static void easyad_lstm_apply_f32(int which, long n, const float* x, float* z) {}
#endif

#endif
