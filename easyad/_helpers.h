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

/* a / b, but 0 when a is 0 (0/0 counts as 0: the subgradient of hypot at the origin) */
static inline double div0(double a, double b) { return a == 0.0 ? 0.0 : a / b; }

/* numpy's maximum/minimum: NaN if either is NaN */
static inline double maximum(double a, double b) { return (a != a || a >= b) ? a : b; }
static inline double minimum(double a, double b) { return (a != a || a <= b) ? a : b; }

#endif
