/* Helpers named by the rule table's expressions (easyad/_rules.py HELPERS) for OpenCL C,
 * over real_t (double or float, typedef'd by the kernel source before this header).
 * Same meanings as easyad/_helpers.h (C99) and the numpy namespace in tensor/_numpy.py.
 * OpenCL has a builtin sign() (sign(NaN) = 0), so the helpers are named easyad_fn_* (kernels
 * are easyad_<op>) and the expression names map to them by macro. */
#ifndef EASYAD_CL_HELPERS_H
#define EASYAD_CL_HELPERS_H

/* sign(0) = 0 (the subgradient of abs at 0); NaN stays NaN */
static inline real_t easyad_fn_sign(real_t t) {
    return t > (real_t)0 ? (real_t)1 : (t < (real_t)0 ? (real_t)-1 : t);
}
#undef sign
#define sign easyad_fn_sign

/* 0 below, 1/2 at the tie, 1 above (maximum/minimum split the derivative); NaN stays NaN */
static inline real_t easyad_fn_heaviside(real_t t) {
    return t > (real_t)0 ? (real_t)1 : (t < (real_t)0 ? (real_t)0 : (t == (real_t)0 ? (real_t)0.5 : t));
}
#define heaviside easyad_fn_heaviside

/* strong zero: a zero factor contributes exactly nothing, even against inf or NaN */
static inline real_t easyad_fn_mul0(real_t a, real_t b) {
    return (a == (real_t)0 || b == (real_t)0) ? (real_t)0 : a * b;
}
#define mul0 easyad_fn_mul0

/* a / b, but 0 when a is 0 */
static inline real_t easyad_fn_div0(real_t a, real_t b) { return a == (real_t)0 ? (real_t)0 : a / b; }
#define div0 easyad_fn_div0

/* numpy's maximum/minimum: NaN if either is NaN */
static inline real_t easyad_fn_maximum(real_t a, real_t b) { return (a != a || a >= b) ? a : b; }
static inline real_t easyad_fn_minimum(real_t a, real_t b) { return (a != a || a <= b) ? a : b; }
#define maximum easyad_fn_maximum
#define minimum easyad_fn_minimum

/* pow with the exponent's special cases first: x*x for 2 (exact, as numpy and libm give;
 * OpenCL's pow may be 16 ulp off) and pown for other small integers. With a constant
 * exponent (x ** 2 in a replayed tape) the compiler keeps only the branch taken. */
static inline real_t easyad_fn_pow(real_t x, real_t y) {
    if (y == (real_t)2) return x * x;
    if (y == (real_t)1) return x;
    if (y == rint(y) && fabs(y) <= (real_t)64) return pown(x, (int)y);
    return pow(x, y);
}
#undef pow   /* PoCL's headers define pow as a macro (clang warns on redefinition) */
#define pow easyad_fn_pow

/* choose(c, a, b): a where c holds, else b (the tensor layer's where) */
#define choose(c, a, b) ((c) ? (a) : (b))

#endif
