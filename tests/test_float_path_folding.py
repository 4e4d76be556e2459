"""A rule's float path and its Trace and Record paths are one computation: equal bits at
the small integers and halves where gcc could pin an argument (Cython's float conversion
tests its -1 error sentinel, so on that path gcc knows the value and would fold a libm call
at compile time, correctly rounded, where glibc rounds otherwise: erfc(-1.0) differed by
an ulp until the core was built with -fno-builtin for those functions)."""
from __future__ import annotations

import math

import pytest

import easyad as ad
from easyad import _rules

POINTS = (-3.0, -2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, 3.0)
UNARY = [r.name for r in _rules.UNARY_RULES if r.generic and hasattr(ad, r.name)]


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) ==
                                                 math.copysign(1, b))


@pytest.mark.parametrize("name", UNARY)
def test_float_path_equals_trace_and_record(name: str) -> None:
    f = getattr(ad, name)
    for x in POINTS:
        try:
            plain = f(x)
        except (ValueError, ArithmeticError):
            continue        # outside the domain: raised on every path alike (test_rules)
        traced = f(ad.Trace.variable(x)).number
        recorded = f(ad.WengertList().variable(x)).number
        assert _same(plain, traced) and _same(plain, recorded), (name, x, plain, traced,
                                                                  recorded)


def test_erfc_at_minus_one_is_glibcs_on_every_path() -> None:
    assert len(UNARY) > 20
    assert ad.erfc(-1.0) == ad.erfc(ad.Trace.variable(-1.0)).number == math.erfc(-1.0)
