"""The libm functions generated C calls, each listed once with what the compiler must know
of it: its C parameters (``prelude`` declares it so, instead of including ``<math.h>``)
and whether libm rounds it correctly (``exact``). A function libm does not round
correctly must not be folded by the compiler: gcc evaluates libm's functions of constants
itself, correctly rounded (MPFR), where glibc's run-time result may be an ulp away, so a
fold would give other bits than the VM (``library`` passes ``-fno-builtin-<f>`` for each
in ``NOT_FOLDED``). sqrt, fabs, floor... stay builtins: their folds are exact. Which of
them glibc's libmvec has vector versions of: ``libmvec_functions`` (the fused tensor C
declares those ``simd``)."""
from __future__ import annotations

import os
import platform
from typing import NamedTuple


class Function(NamedTuple):
    name: str
    params: str           # C parameter list of the declaration
    exact: bool           # correctly rounded by libm (a compile-time fold gives its bits)


_D, _DD = "double", "double, double"
FUNCTIONS = tuple(Function(*row) for row in (
    ("sin", _D, False), ("cos", _D, False), ("tan", _D, False), ("asin", _D, False),
    ("acos", _D, False), ("atan", _D, False), ("sinh", _D, False), ("cosh", _D, False),
    ("tanh", _D, False), ("asinh", _D, False), ("acosh", _D, False), ("atanh", _D, False),
    ("exp", _D, False), ("exp2", _D, False), ("expm1", _D, False), ("log", _D, False),
    ("log2", _D, False), ("log10", _D, False), ("log1p", _D, False), ("sqrt", _D, True),
    ("cbrt", _D, False), ("fabs", _D, True), ("erf", _D, False), ("erfc", _D, False),
    ("lgamma", _D, False), ("tgamma", _D, False), ("floor", _D, True), ("ceil", _D, True),
    ("trunc", _D, True), ("round", _D, True),
    ("pow", _DD, False), ("atan2", _DD, False), ("hypot", _DD, False), ("fmod", _DD, True),
    ("copysign", _DD, True), ("fmax", _DD, True), ("fmin", _DD, True),
    ("fma", "double, double, double", True), ("ldexp", "double, int", True),
    ("frexp", "double, int*", True)))

DECLARED = {f.name: f"double {f.name}({f.params});" for f in FUNCTIONS}
NOT_FOLDED = tuple(f.name for f in FUNCTIONS if not f.exact)


# libm's functions that glibc's libmvec has vector versions of (x86-64): declared
# ``simd`` the vectoriser calls them on 4 or 8 lanes at once (glibc documents at most
# 4 ulp of error, as numpy's own SIMD loops have). By glibc version; the build is linked
# with -z defs, so a missing one fails the build, which is then tried without them.
_LIBMVEC_2_22 = ("exp", "log", "sin", "cos")
_LIBMVEC_2_35 = ("tan", "tanh", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh",
                 "atanh", "exp2", "expm1", "log2", "log10", "log1p", "cbrt", "erf")


def libmvec_functions() -> tuple[str, ...]:
    """The libm functions the fused C declares simd (none off x86-64 glibc)."""
    if platform.machine() not in ("x86_64", "AMD64") or not hasattr(os, "confstr"):
        return ()
    try:
        name, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").split()
        major, minor = (int(v) for v in version.split(".")[:2])
    except (ValueError, OSError):
        return ()
    if name != "glibc" or (major, minor) < (2, 22):
        return ()
    return _LIBMVEC_2_22 + (_LIBMVEC_2_35 if (major, minor) >= (2, 35) else ())
