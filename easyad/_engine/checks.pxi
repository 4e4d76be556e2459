# Value checks: make every mode raise what Python's floats and math module raise.
# Included by _core.pyx before the generated _ops.pxi. (The expression helpers sign, mul0...
# are C, in _helpers.h.)


cdef int _raise_math(double x, double y, double z, bint overflow) except -1:
    # z is not finite. Like CPython's math_1: NaN out of non-NaN in is a domain error; inf
    # out of finite in is a range error (OverflowError) or a domain error (e.g. log(0)).
    if isnan(z):
        if not (isnan(x) or isnan(y)):
            raise ValueError("math domain error")
    elif isfinite(x) and isfinite(y):
        if overflow:
            raise OverflowError("math range error")
        raise ValueError("math domain error")
    return 0


cdef inline int _check_math(double x, double y, double z, bint overflow) except -1:
    if isfinite(z):
        return 0
    return _raise_math(x, y, z, overflow)


cdef inline int _check_division(double y) except -1:
    if y == 0.0:
        raise ZeroDivisionError("float division by zero")
    return 0


cdef int _raise_power(double x, double y, double z, bint operator) except -1:
    if x == 0.0 and y < 0.0 and isfinite(y):  # 0.0 ** -inf is inf, no error
        # float ** raises ZeroDivisionError here and math.pow ValueError; a tape keeps one
        # pow for both spellings, so every engine raises the one error that is both
        raise PowDomainError(x, y, operator)
    if x < 0.0 and isfinite(x) and isfinite(y) and floor(y) != y:
        raise ValueError(
            "negative number cannot be raised to a fractional power "
            "(the result would be complex, which easyad does not differentiate)")
    if isinf(z) and isfinite(x) and isfinite(y):
        if operator:
            raise OverflowError(34, "Numerical result out of range")
        raise OverflowError("math range error")
    return 0


cdef inline int _check_power(double x, double y, double z, bint operator) except -1:
    # Fast path: finite result from a non-negative base (the common case).
    if isfinite(z) and x > 0.0:
        return 0
    return _raise_power(x, y, z, operator)
