/* Python's error semantics as status codes, for sweeps that run without the GIL (replay).
 * The recording paths raise through _checks.pxi; replay returns one of these codes and the
 * caller raises the matching exception with the GIL, naming the entry. */
#ifndef EASYAD_STATUS_H
#define EASYAD_STATUS_H
#include <math.h>

enum {
    EASYAD_OK = 0,
    EASYAD_DOMAIN = 1,          /* ValueError("math domain error") */
    EASYAD_RANGE = 2,           /* OverflowError("math range error") */
    EASYAD_ZERO_DIVISION = 3,   /* ZeroDivisionError */
    EASYAD_COMPLEX = 4,         /* ValueError: negative base, fractional exponent */
    /* 5 and 6 are the replay program's own (_engine/replay/program.pxi) */
    EASYAD_ZERO_POWER = 7       /* ad.PowDomainError: 0.0 to a negative power (both
                                   ValueError, as math.pow, and ZeroDivisionError, as **) */
};

/* z is the result of a math-module function of x (and y) */
static inline int easyad_status_math(double x, double y, double z, int overflow) {
    if (isfinite(z)) return EASYAD_OK;
    if (isnan(z)) return (isnan(x) || isnan(y)) ? EASYAD_OK : EASYAD_DOMAIN;
    if (isfinite(x) && isfinite(y)) return overflow ? EASYAD_RANGE : EASYAD_DOMAIN;
    return EASYAD_OK;
}

static inline int easyad_status_division(double y) {
    return y == 0.0 ? EASYAD_ZERO_DIVISION : EASYAD_OK;
}

static inline int easyad_status_power(double x, double y, double z) {
    if (isfinite(z) && x > 0.0) return EASYAD_OK;
    if (x == 0.0 && y < 0.0 && isfinite(y)) return EASYAD_ZERO_POWER;
    if (x < 0.0 && isfinite(x) && isfinite(y) && floor(y) != y) return EASYAD_COMPLEX;
    if (isinf(z) && isfinite(x) && isfinite(y)) return EASYAD_RANGE;
    return EASYAD_OK;
}

#endif
