/* The helpers named by the rule table's expressions (easyad/_rules.py HELPERS), once, over
 * real_t. Included by the generated _ops.h (the C core: real_t is double) and pasted into
 * every OpenCL kernel by easyad/tensor/_kernels.py (real_t is double or float, typedef'd by
 * the kernel source first). The numpy and Python meanings of the same names live in
 * easyad/_expressions.py; tests/test_helpers.py checks that all of them agree.
 *
 * OpenCL has builtins called sign, pow and hypot, so the functions are named easyad_fn_*
 * and the expression names map to them by macro (the same in C, so both read alike). */
#ifndef EASYAD_HELPERS_H
#define EASYAD_HELPERS_H

#ifndef __OPENCL_VERSION__
#include <math.h>
typedef double real_t;
#endif

/* sign(0) = 0: the subgradient chosen for abs at 0; NaN stays NaN */
static inline real_t easyad_fn_sign(real_t t) {
    return t > (real_t)0 ? (real_t)1 : (t < (real_t)0 ? (real_t)-1 : t);
}
#undef sign
#define sign easyad_fn_sign

/* 0 below, 1 above, 1/2 at the tie (maximum/minimum split the derivative); NaN stays NaN */
static inline real_t easyad_fn_heaviside(real_t t) {
    return t > (real_t)0 ? (real_t)1
         : (t < (real_t)0 ? (real_t)0 : (t == (real_t)0 ? (real_t)0.5 : t));
}
#define heaviside easyad_fn_heaviside

/* Strong zero: a zero partial or a zero tangent/adjoint contributes nothing, even against
 * inf or NaN. This is what keeps an unselected where() branch from leaking NaN.
 *
 * The strong zeros are defined once, here, as macros over a type T whose ==, | and ?: work
 * lane by lane: real_t below, the float and double loops of the numpy ufuncs
 * (_engine/ufuncs.pxi), OpenCL's vectors (tensor/_kernels.vector_helpers); the fused C
 * programs' bit-mask spelling (compiler/program/cstyle.STRONG_ZERO) reads the *_ZERO tests.
 * The zero is +0.0. | rather than ||: no branch, so loops of them vectorise (a select per
 * lane). tests/test_csyntax.py checks that every spelling gives the same bits. */
#define EASYAD_MUL0_ZERO(T, a, b) (((a) == (T)0) | ((b) == (T)0))
#define EASYAD_MUL0(T, a, b) (EASYAD_MUL0_ZERO(T, a, b) ? (T)0 : (a) * (b))
#define EASYAD_DIV0_ZERO(T, a, b) ((a) == (T)0)
#define EASYAD_DIV0(T, a, b) (EASYAD_DIV0_ZERO(T, a, b) ? (T)0 : (a) / (b))

static inline real_t easyad_fn_mul0(real_t a, real_t b) { return EASYAD_MUL0(real_t, a, b); }
#define mul0 easyad_fn_mul0

/* A tangent t times a factor e, for the tangents of partials (second-order sweeps): a
 * strong zero like mul0, and lazy, since a macro's ?: evaluates e only when t is not 0.
 * t is a tangent expression: cheap to evaluate twice. */
#define tmul(t, e) (((t) == (real_t)0) ? (real_t)0 : mul0((t), (e)))

/* a / b, but 0 when a is 0 (0/0 counts as 0: the subgradient of hypot at the origin) */
static inline real_t easyad_fn_div0(real_t a, real_t b) { return EASYAD_DIV0(real_t, a, b); }
#define div0 easyad_fn_div0

/* numpy's maximum/minimum: NaN if either is NaN */
static inline real_t easyad_fn_maximum(real_t a, real_t b) { return (a != a || a >= b) ? a : b; }
static inline real_t easyad_fn_minimum(real_t a, real_t b) { return (a != a || a <= b) ? a : b; }
#define maximum easyad_fn_maximum
#define minimum easyad_fn_minimum

/* the rule stop_gradient's value: x itself (any type, vectors too). The row spells its
 * value as this call, not "x", so that the generic evaluation of the table (a Trace of
 * Traces or Records) applies stop_gradient to the inner levels as well */
#define stop_gradient(x) (x)

/* pow with the exponents that dominate real code (x ** 2, and the partials' x ** 1 and
 * x ** 0) done without the library's pow (~50 ns in libm; up to 16 ulp off in OpenCL),
 * exactly: x * x is the correctly rounded square, as glibc's and numpy's pow(x, 2.0) give
 * (checked on 3e7 points, exact ties included), and pow(x, 1) = x, pow(x, 0) = 1 for every
 * x by C99 and OpenCL alike. Other exponents, integers included, go to pow itself: pown or
 * repeated products would round differently from the host's pow. With a constant exponent
 * (x ** 2 in a replayed tape) the compiler keeps only the branch taken. */
static inline real_t easyad_fn_pow(real_t x, real_t y) {
    if (y == (real_t)2) return x * x;
    if (y == (real_t)1) return x;
    if (y == (real_t)0) return (real_t)1;
    return pow(x, y);
}
#undef pow   /* PoCL's headers define pow as a macro (clang warns on redefinition) */
#define pow easyad_fn_pow

#ifndef __OPENCL_VERSION__
/* hypot as Python's math.hypot computes it (CPython's vector_norm for two arguments), so
 * ad.hypot on floats equals math.hypot to the last bit where libm's hypot may differ by an
 * ulp: scale by a power of two, sum the squares in double-double (fma), take the root and
 * apply one Newton correction. The rule table's "hypot" means this function in the core;
 * OpenCL kernels use the device's hypot (the algorithm needs double, kernels may be float). */
static inline double easyad_fn_hypot(double x, double y) {
    double ax = fabs(x), ay = fabs(y), big, h, scale, csum = 1.0, frac1 = 0.0, frac2 = 0.0;
    double v[2], p_hi, p_lo, s_hi, s_lo;
    int e, i;
    if (isinf(ax) || isinf(ay)) return INFINITY;
    if (isnan(ax) || isnan(ay)) return NAN;
    big = ax > ay ? ax : ay;
    if (big == 0.0) return 0.0;
    if (ax == 0.0 || ay == 0.0) return big;
    frexp(big, &e);
    if (e < -1023)  /* subnormal: lift both into the normal range, then scale back */
        return 2.2250738585072014e-308 * easyad_fn_hypot(ax / 2.2250738585072014e-308,
                                                         ay / 2.2250738585072014e-308);
    scale = ldexp(1.0, -e);
    v[0] = ax * scale; v[1] = ay * scale;
    for (i = 0; i < 2; i++) {
        p_hi = v[i] * v[i]; p_lo = fma(v[i], v[i], -p_hi);
        s_hi = csum + p_hi; s_lo = (csum - s_hi) + p_hi;
        csum = s_hi; frac1 += p_lo; frac2 += s_lo;
    }
    h = sqrt(csum - 1.0 + (frac1 + frac2));
    p_hi = -h * h; p_lo = fma(-h, h, -p_hi);
    s_hi = csum + p_hi; s_lo = (csum - s_hi) + p_hi;
    csum = s_hi; frac1 += p_lo; frac2 += s_lo;
    h += (csum - 1.0 + (frac1 + frac2)) / (2.0 * h);
    return h / scale;
}
#define hypot easyad_fn_hypot
#endif


/* ---- SciPy's special functions and numpy's float ufuncs (the rows after stop_gradient) ----
 * Over real_t like the rest, so OpenCL kernels (double or float) run the same algorithms.
 * tests/test_special_rows.py checks them against scipy and numpy on wide ranges. */

/* log|gamma(x)| (the row gammaln): C99's and OpenCL's lgamma, inf at the poles and at
 * -inf (scipy gives -inf there; torch and C99 inf) */
#define gammaln(x) lgamma(x)

/* the share of a in fmax(a, b) (fmax's and fmin's partials): 1 where a wins, 0 where b
 * wins, 1/2 at a tie; a NaN operand loses (fmax ignores it); NaN when both are NaN */
static inline real_t easyad_fn_pick(real_t a, real_t b) {
    if (a > b) return (real_t)1;
    if (a < b) return (real_t)0;
    if (a == b) return (real_t)0.5;
    if (a != a && b != b) return a;
    return b != b ? (real_t)1 : (real_t)0;
}
#define pick easyad_fn_pick

/* numpy's fmax/fmin, exactly: a NaN operand is ignored, a tie returns the first operand
 * (fmax(-0.0, 0.0) is -0.0), as numpy's loops do; C's and OpenCL's leave the zero's sign
 * open, so the builtins are replaced (as pow is) */
static inline real_t easyad_fn_fmax(real_t a, real_t b) { return (a >= b || b != b) ? a : b; }
static inline real_t easyad_fn_fmin(real_t a, real_t b) { return (a <= b || b != b) ? a : b; }
#undef fmax
#undef fmin
#define fmax easyad_fn_fmax
#define fmin easyad_fn_fmin

/* 1 / (1 + exp(-x)) from exp of -|x|: never overflows, full relative accuracy both sides */
static inline real_t easyad_fn_expit(real_t x) {
    real_t e;
    if (x >= (real_t)0) return (real_t)1 / ((real_t)1 + exp(-x));
    e = exp(x);
    return e / ((real_t)1 + e);
}
#define expit easyad_fn_expit

/* log(x / (1 - x)); near 1/2, where the quotient is near 1, log1p of its excess (2x - 1
 * is exact there) keeps the relative accuracy. NaN outside [0, 1], -inf at 0, inf at 1 */
static inline real_t easyad_fn_logit(real_t x) {
    if (x > (real_t)0.3 && x < (real_t)0.65)
        return log1p(((real_t)2 * x - (real_t)1) / ((real_t)1 - x));
    return log(x / ((real_t)1 - x));
}
#define logit easyad_fn_logit

/* scipy's: 0 where x == 0 unless y is NaN (also at y = 0 or y < 0) */
static inline real_t easyad_fn_xlogy(real_t x, real_t y) {
    return (x == (real_t)0 && y == y) ? (real_t)0 : x * log(y);
}
#define xlogy easyad_fn_xlogy
static inline real_t easyad_fn_xlog1py(real_t x, real_t y) {
    return (x == (real_t)0 && y == y) ? (real_t)0 : x * log1p(y);
}
#define xlog1py easyad_fn_xlog1py

/* numpy's logaddexp: equal operands (infinities of one sign too) give x + log 2; else the
 * larger plus log1p of exp of minus the difference (never overflows) */
static inline real_t easyad_fn_logaddexp(real_t x, real_t y) {
    real_t d;
    if (x == y) return x + (real_t)0.6931471805599453;
    d = x - y;
    if (d > (real_t)0) return x + log1p(exp(-d));
    if (d <= (real_t)0) return y + log1p(exp(d));
    return d;   /* NaN */
}
#define logaddexp easyad_fn_logaddexp
static inline real_t easyad_fn_logaddexp2(real_t x, real_t y) {
    real_t d;
    if (x == y) return x + (real_t)1;
    d = x - y;
    if (d > (real_t)0) return x + (real_t)1.4426950408889634 * log1p(exp2(-d));
    if (d <= (real_t)0) return y + (real_t)1.4426950408889634 * log1p(exp2(d));
    return d;
}
#define logaddexp2 easyad_fn_logaddexp2

/* cot(pi x) from r = x minus the nearest integer (exact; x itself for |x| < 1/2, tiny x
 * too), so large |x| loses nothing to pi x; for |r| > 1/4 as tan(pi (1/2 - |r|)), whose
 * argument is exact too, so the zero of cot at r = 1/2 keeps its relative accuracy */
static inline real_t easyad_cotpi(real_t x) {
    real_t r = x - floor(x + (real_t)0.5), s = fabs(r), c;
    c = s > (real_t)0.25 ? tan((real_t)3.141592653589793 * ((real_t)0.5 - s))
                         : (real_t)1 / tan((real_t)3.141592653589793 * s);
    return r < (real_t)0 ? -c : c;
}

/* digamma: the recurrence psi(x) = psi(x + 1) - 1/x up to x >= 10, then the asymptotic
 * series ln a - 1/(2a) - sum B_2j / (2j a^2j) (7 terms: < 1e-16 relative at a = 10);
 * x < 0 by the reflection psi(x) = psi(1 - x) - pi cot(pi x). As scipy: -inf at +0, inf
 * at -0, NaN at the negative integers and -inf. Near the positive zero 1.4616... the
 * error is absolute (a few 1e-16), as it is for the recurrence's sum. */
static inline real_t easyad_fn_digamma(real_t x) {
    real_t a, shift = (real_t)0, t, series, reflect = (real_t)0;
    if (x != x || x == (real_t)INFINITY) return x;
    if (x == (real_t)0) return (real_t)-1 / x;   /* -inf at +0, inf at -0 */
    if (x < (real_t)0) {
        if (x == floor(x)) return (real_t)NAN;    /* poles; -inf too */
        reflect = -(real_t)3.141592653589793 * easyad_cotpi(x);
        x = (real_t)1 - x;
    }
    a = x;
    while (a < (real_t)10) { shift += (real_t)1 / a; a += (real_t)1; }
    t = (real_t)1 / (a * a);
    series = t * ((real_t)0.08333333333333333 + t * ((real_t)-0.008333333333333333
             + t * ((real_t)0.003968253968253968 + t * ((real_t)-0.004166666666666667
             + t * ((real_t)0.007575757575757576 + t * ((real_t)-0.021092796092796094
             + t * (real_t)0.08333333333333333))))));
    return log(a) - (real_t)0.5 / a - series - shift + reflect;
}
#define digamma easyad_fn_digamma

/* Hurwitz zeta(s, a) for an integer s >= 2: the terms (a + k)^-s summed directly until
 * a + k >= 16 + s, then Euler-Maclaurin's tail with 10 Bernoulli terms (the k-th term
 * shrinks like ((s + 2k) / (2 pi (16 + s)))^2k: below 1e-16 of the sum). a > 0, or a < 0
 * not an integer (the sum then runs up from it). */
static inline real_t easyad_hurwitz(real_t s, real_t a) {
    const real_t bern[10] = {(real_t)0.08333333333333333, (real_t)-0.001388888888888889,
        (real_t)3.306878306878307e-05, (real_t)-8.267195767195768e-07,
        (real_t)2.08767569878681e-08, (real_t)-5.284190138687493e-10,
        (real_t)1.3382536530684679e-11, (real_t)-3.3896802963225827e-13,
        (real_t)8.586062056277845e-15, (real_t)-2.174868698558062e-16};
    real_t total = (real_t)0, b = a, p, inv2, rising, power, tail;
    real_t k = (real_t)0;
    int j;
    while (b < (real_t)16 + s) { total += pow(b, -s); k += (real_t)1; b = a + k; }
    p = pow(b, -s);
    tail = b * p / (s - (real_t)1) + (real_t)0.5 * p;
    inv2 = (real_t)1 / (b * b);
    rising = s;                 /* s (s + 1) ... (s + 2j - 2) */
    power = p / b;              /* b^(-s - 2j + 1) */
    for (j = 0; j < 10; j++) {
        tail += bern[j] * rising * power;
        rising *= (s + (real_t)(2 * j + 1)) * (s + (real_t)(2 * j + 2));
        power *= inv2;
    }
    return total + tail;
}

/* polygamma(n, x), the n-th derivative of digamma; n rounded to the nearest integer
 * (floor(n + 1/2)), NaN for n < 0. n >= 1: (-1)^(n+1) n! zeta(n + 1, x); x < 0 by the
 * reflection psi^(n)(x) = (-1)^n psi^(n)(1 - x) - pi^(n+1) cot^(n)(pi x), with the n-th
 * derivative of cot a polynomial in cot (P' = -(1 + c^2) dP/dc; n <= 170, past which n!
 * overflows: the direct sum from x < 0 would cancel its terms near 0 away). As scipy:
 * (-1)^(n+1) inf at 0 and the negative integers, 0 at inf. */
static inline real_t easyad_fn_polygamma(real_t order, real_t x) {
    real_t n = floor(order + (real_t)0.5), fact = (real_t)1, sign, k;
    if (n != n || x != x) return n + x;
    /* n! overflows double past 170: NaN rather than an inf/0 guess (and the loops below
     * stay bounded for any n, inf included) */
    if (n < (real_t)0 || n > (real_t)170) return (real_t)NAN;
    if (n == (real_t)0) return easyad_fn_digamma(x);
    for (k = (real_t)2; k <= n; k += (real_t)1) fact *= k;
    sign = floor(n / (real_t)2) * (real_t)2 == n ? (real_t)-1 : (real_t)1;  /* (-1)^(n+1) */
    if (x == (real_t)INFINITY) return (real_t)0;
    if (x == -(real_t)INFINITY) return (real_t)NAN;
    if (x <= (real_t)0 && x == floor(x)) return sign * (real_t)INFINITY;
    if (x < (real_t)0 && n <= (real_t)170) {
        real_t coef[172], c = easyad_cotpi(x), poly = (real_t)0, pin = (real_t)1, d;
        int m, i, top = (int)n;
        for (i = 0; i < 172; i++) coef[i] = (real_t)0;
        coef[1] = (real_t)1;                       /* P_0(c) = c */
        for (m = 0; m < top; m++) {                /* P_m has degree m + 1 */
            real_t prev = (real_t)0, cur;
            /* P_{m+1}[i] = -((i+1) P_m[i+1] + (i-1) P_m[i-1]) */
            for (i = 0; i <= m + 2; i++) {
                cur = coef[i];
                d = (i + 1 <= m + 1 ? (real_t)(i + 1) * coef[i + 1] : (real_t)0)
                    + (i >= 1 ? (real_t)(i - 1) * prev : (real_t)0);
                coef[i] = -d;
                prev = cur;
            }
        }
        for (i = top + 1; i >= 0; i--) poly = poly * c + coef[i];
        for (i = 0; i <= top; i++) pin *= (real_t)3.141592653589793;
        return -fact * easyad_hurwitz(n + (real_t)1, (real_t)1 - x) - pin * poly;
    }
    return sign * fact * easyad_hurwitz(n + (real_t)1, x);
}
#define polygamma easyad_fn_polygamma

/* choose(c, a, b): a where c holds, else b (the tensor layer's where) */
#define choose(c, a, b) ((c) ? (a) : (b))

#endif
