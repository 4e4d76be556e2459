"""Spelling shared by every C-family target (the tape compiler ``compiler.tape``, the fused C
and OpenCL programs of ``tensor/``, the OpenCL replay and the elementwise kernels): the
one constant printer, ``literal``.

It lives at the package root, beside ``_expr`` (the expression renderer, which prints its
numbers through it), so that both the root's compiler and ``tensor/`` import it without a
cycle.

A finite number is printed as its shortest round-trip decimal (``repr``), not as a hex
float: the expression language (``_expr``) is one text for C, OpenCL and Python, and
Python cannot read hex floats. The decimal is exact in C all the same: C99 (Annex F.5)
and OpenCL C convert a decimal of at most 17 significant digits correctly rounded, and
``tests/test_csyntax.py`` compiles every printer's output with the C compiler and PoCL
and checks the bits.
"""
from __future__ import annotations

import math

import numpy as np

REALS = ("double", "float")


def _float32(v: float) -> float:
    """v rounded to float32 as numpy rounds it (to nearest, ties to even; inf past the
    range): what a float32 kernel computes with."""
    with np.errstate(over="ignore"):
        return float(np.float32(v))


def _float_text(v: float) -> str:
    """A decimal (of v >= 0) that a C compiler rounds to float32 as numpy rounds v. repr(v)
    does so (keeping the text of constants that are written as doubles), except where v
    lies exactly halfway between two float32 values: the decimal, not v, is what gets
    rounded, and it sits to one side of the tie. There, and where v underflows to 0, the
    float32 value itself is printed (its repr is on no tie)."""
    f = _float32(v)
    below, above = np.nextafter(v, -math.inf), np.nextafter(v, math.inf)
    if f == 0.0 or _float32(below) != _float32(above):
        return repr(f)
    return repr(v)


def literal(value: float, real: str = "double") -> str:
    """``value`` as a C99 / OpenCL C constant of type ``real`` ("double" or "float"),
    exact to the bit: a float constant is ``value`` rounded to float32 as numpy rounds it
    (the ``f`` suffix: a float kernel never computes in double). Negative numbers (-0.0
    too) are parenthesised, so the text can stand beside any operator. Infinities and NaN
    are the macros ``INFINITY``/``NAN`` of C99's math.h and of OpenCL C, with their sign;
    a NaN's payload is not kept (no arithmetic keeps it either)."""
    if real not in REALS:
        raise ValueError(f"no C literal of type {real!r}: expected one of {REALS}")
    v = float(value)
    negative = math.copysign(1.0, v) < 0
    if math.isnan(v):
        text = "NAN"
    else:
        if math.isinf(v if real == "double" else _float32(v)):
            text = "INFINITY"               # (a float past float32's range too)
        elif real == "float":
            text = _float_text(abs(v)) + "f"
        else:
            text = repr(abs(v))
    return f"(-{text})" if negative else text


def is_literal(text: str) -> bool:
    """Whether C text is a constant ``literal`` wrote (``0.5``, ``(-2.5)``, ``NAN``,
    ``(-INFINITY)``, ``1.5f``): the inverse test lives beside the printer, so a change of
    spelling changes both."""
    bare = text.strip("()").lstrip("-")
    if bare in ("NAN", "INFINITY"):
        return True
    try:
        float(bare[:-1] if bare.endswith("f") else bare)
    except ValueError:
        return False
    return True
