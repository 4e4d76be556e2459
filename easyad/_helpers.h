/* Helpers named by the rule table's expressions (easyad/_rules.py HELPERS), in C99.
 * Included by the generated _ops.h; valid OpenCL C too, so device kernels share them. */
#ifndef EASYAD_HELPERS_H
#define EASYAD_HELPERS_H

/* sign(0) = 0: the subgradient chosen for abs at 0; NaN stays NaN */
static inline double sign(double t) { return t > 0.0 ? 1.0 : (t < 0.0 ? -1.0 : t); }

/* 0 below, 1 above, 1/2 at the tie (maximum/minimum split the derivative); NaN stays NaN */
static inline double heaviside(double t) {
    return t > 0.0 ? 1.0 : (t < 0.0 ? 0.0 : (t == 0.0 ? 0.5 : t));
}

/* Strong zero: a zero partial or a zero tangent/adjoint contributes nothing, even against
 * inf or NaN. This is what keeps an unselected where() branch from leaking NaN. */
static inline double mul0(double a, double b) { return (a == 0.0 || b == 0.0) ? 0.0 : a * b; }

/* A tangent t times a factor e, for the tangents of partials (second-order sweeps): a
 * strong zero like mul0, and lazy, since a macro's ?: evaluates e only when t is not 0.
 * t is a tangent expression: cheap to evaluate twice. */
#define tmul(t, e) (((t) == 0.0) ? 0.0 : mul0((t), (e)))

/* a / b, but 0 when a is 0 (0/0 counts as 0: the subgradient of hypot at the origin) */
static inline double div0(double a, double b) { return a == 0.0 ? 0.0 : a / b; }

/* hypot as Python's math.hypot computes it (CPython's vector_norm for two arguments), so
 * ad.hypot on floats equals math.hypot to the last bit where libm's hypot may differ by an
 * ulp: scale by a power of two, sum the squares in double-double (fma), take the root and
 * apply one Newton correction. The rule table's "hypot" means this function. */
static inline double easyad_hypot(double x, double y) {
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
        return 2.2250738585072014e-308 * easyad_hypot(ax / 2.2250738585072014e-308,
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
#define hypot easyad_hypot

/* pow with the exponents that dominate real code (x ** 2, and the partials' x ** 1 and
 * x ** 0) done without libm's pow, which costs ~50 ns. Equal to pow bit for bit: x * x is
 * the correctly rounded square, as glibc's pow(x, 2.0) (checked on 3e7 points, exact ties
 * included), and pow(x, 1) = x, pow(x, 0) = 1 for every x by C99. */
static inline double easyad_pow(double x, double y) {
    if (y == 2.0) return x * x;
    if (y == 1.0) return x;
    if (y == 0.0) return 1.0;
    return pow(x, y);
}
#define pow easyad_pow

/* numpy's maximum/minimum: NaN if either is NaN */
static inline double maximum(double a, double b) { return (a != a || a >= b) ? a : b; }
static inline double minimum(double a, double b) { return (a != a || a <= b) ? a : b; }

#endif
