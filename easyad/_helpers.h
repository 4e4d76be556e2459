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

/* choose(c, a, b): a where c holds, else b (the tensor layer's where) */
#define choose(c, a, b) ((c) ? (a) : (b))

#endif
