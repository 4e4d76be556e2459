"""Nesting of modes: Traces of Traces (forward over forward, any depth) and Traces of Records
(forward over reverse), checked against sympy and ad.hessian.

Cases come from the rule table (every row, every spelling: ad.<name> and the operator), at
the points of tests/_references.py where sympy's derivatives of the needed order are
finite. A NestedTrace evaluates the table's partial expressions on its parts, so these check
the table's partials once more, one order up, and the nesting machinery itself: kinds,
lifting of constants, mixing rules and their errors, comparisons, where, pickling.
"""
from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import sympy as sp

import easyad as ad
from _references import (
    RULES,
    UNARY,
    X,
    Y,
    appliers,
    evaluate,
    rule_id,
    smooth_points,
    sympy_value,
)
from easyad import _rules
from easyad._core import NestedTrace

RTOL = 1e-9
ATOL = 1e-11


def close(a: float, b: float, rtol: float = RTOL, atol: float = ATOL) -> bool:
    return abs(a - b) <= rtol * abs(b) + atol


def nested(x: float, depth: int, seeds: tuple[float, ...] | None = None):
    """x as a Trace of `depth` levels, with derivative seeds[k] at level k (innermost first)."""
    seeds = seeds or (1.0,) * depth
    t = ad.Trace(x, seeds[0])
    for k in range(1, depth):
        t = ad.Trace(t, seeds[k])
    return t


def innermost_derivative(t, depth: int) -> float:
    """derivative.derivative... of a depth-level Trace: the mixed derivative of its seeds."""
    for _ in range(depth):
        t = t.derivative
    return t


def sympy_derivative(rule, orders: tuple[int, ...]) -> sp.Expr:
    """The derivative of a rule's value: orders = (wrt of the innermost level, ...)."""
    return sp.diff(sympy_value(rule), *((X, Y)[k] for k in orders))


def finite_value(expr: sp.Expr, point: tuple[float, ...]) -> float:
    """expr at point, NaN where it is not a finite real (a pole, a DiracDelta at a kink)."""
    try:
        return evaluate(expr, point)
    except TypeError:
        return math.nan


def points_with_finite(rule, expr: sp.Expr) -> list[tuple[float, ...]]:
    return [p for p in smooth_points(rule) if math.isfinite(finite_value(expr, p))]


# ---- forward over forward: every rule, second and third derivatives ----------------------

@pytest.mark.parametrize("depth", [2, 3])
@pytest.mark.parametrize("rule", UNARY, ids=rule_id)
def test_unary_rules_higher_derivatives_match_sympy(rule, depth):
    expr = sympy_derivative(rule, (0,) * depth)
    points = points_with_finite(rule, expr)
    assert points or rule.name in ("cbrt",), "no point to test at"
    failures = []
    for label, f in appliers(rule, ad).items():
        for (x0,) in points:
            result = f(nested(x0, depth))
            got = innermost_derivative(result, depth)
            want = evaluate(expr, (x0,))
            if not (type(got) is float and close(got, want)):
                failures.append((label, x0, got, want))
            # the value and the first derivative at every level agree too
            first = evaluate(sympy_derivative(rule, (0,)), (x0,))
            inner = result
            for _ in range(depth - 1):
                inner = inner.number
            assert close(inner.number, evaluate(sympy_value(rule), (x0,)), 1e-14, 0.0)
            assert close(inner.derivative, first, 1e-12, 1e-14)
    assert not failures, failures


BINARY = tuple(r for r in RULES if r.arity == 2)
ORDERS = [(0, 0), (0, 1), (1, 0), (1, 1), (0, 1, 1), (1, 0, 0), (0, 0, 0), (1, 1, 1)]


@pytest.mark.parametrize("orders", ORDERS, ids=lambda o: "d" + "".join("xy"[k] for k in o))
@pytest.mark.parametrize("rule", BINARY, ids=rule_id)
def test_binary_rules_mixed_partials_match_sympy(rule, orders):
    """d/d(w_1) d/d(w_2)... f(x, y), each level seeded along x or y; the other operand a
    nested Trace of the same depth, a float, or a float Trace at the innermost level."""
    depth = len(orders)
    expr = sympy_derivative(rule, orders)
    failures = []
    for label, f in appliers(rule, ad).items():
        for x0, y0 in points_with_finite(rule, expr):
            want = evaluate(expr, (x0, y0))
            tx = nested(x0, depth, tuple(1.0 if k == 0 else 0.0 for k in orders))
            ty = nested(y0, depth, tuple(1.0 if k == 1 else 0.0 for k in orders))
            got = innermost_derivative(f(tx, ty), depth)
            if not (type(got) is float and close(got, want)):
                failures.append((label, "both nested", x0, y0, got, want))
            if all(k == 0 for k in orders):   # y a constant: a float, or a Trace one level in
                for y in (y0, ad.Trace(y0, 0.0)):
                    got = innermost_derivative(f(tx, y), depth)
                    if not close(got, want):
                        failures.append((label, type(y).__name__, x0, y0, got, want))
            if all(k == 1 for k in orders):   # x a constant: the reflected forms
                got = innermost_derivative(f(x0, ty), depth)
                if not close(got, want):
                    failures.append((label, "reflected", x0, y0, got, want))
    assert not failures, failures


def test_mixed_nesting_levels_inner_trace_is_the_inner_perturbation():
    # c is a float Trace: inside a Trace of Traces it is at the inner level, a constant at
    # the outer one (easy_ml's Trace<T> op T)
    x = ad.Trace(ad.Trace(2.0, 1.0), 1.0)
    c = ad.Trace(3.0, 1.0)
    for z in (x * c, c * x):
        assert z.number.number == 6.0
        assert z.number.derivative == 5.0       # d/dx (x * c) at the inner level: c' = 1
        assert z.derivative.number == 3.0       # the outer level: c is constant there
        assert z.derivative.derivative == 1.0
    # a float Trace inside three levels: constant at the two outer ones
    x3 = nested(0.5, 3)
    z = (x3 + ad.Trace(1.0, 2.0)) ** 2
    assert z.number.number.derivative == 2 * 1.5 * 3.0
    assert innermost_derivative(z, 3) == 0.0
    assert innermost_derivative(x3 ** 2 * 1.5, 3) == 0.0


def test_third_derivative_of_a_composite_matches_sympy():
    def f(x):
        return ad.sin(x) * ad.exp(x / 2) + x ** 3 / (1 + x * x) - ad.log(x + 2) * ad.sqrt(x)

    expr = sp.sin(X) * sp.exp(X / 2) + X ** 3 / (1 + X * X) - sp.log(X + 2) * sp.sqrt(X)
    for x0 in (0.3, 1.1, 2.7):
        t = f(nested(x0, 3))
        for order in (1, 2, 3):
            got = t
            for _ in range(3 - order):
                got = got.number
            for _ in range(order):
                got = got.derivative
            assert close(got, float(sp.diff(expr, X, order).evalf(subs={X: x0}, n=30)))


def test_parts_of_the_part_kind_and_depth():
    x = ad.Trace(ad.Trace(2.0, 1.0), 1.0)
    assert isinstance(x, ad.Trace) and type(x) is NestedTrace and x.depth == 2
    assert x.__class__ is ad.Trace and isinstance(x, (ad.Record, ad.Trace))
    y = x * 3.0 + 1.0                       # linear: the derivative part is a constant
    assert type(y.derivative) is ad.Trace and y.derivative.number == 3.0
    assert y.derivative.derivative == 0.0
    assert ad.Trace(ad.Trace(2.0, 1.0), 1).derivative.number == 1.0
    assert nested(1.0, 4).depth == 4
    c = ad.Trace.constant(ad.Trace.variable(2.0))
    assert c.derivative.number == 0.0 and c.number.derivative == 1.0
    v = ad.Trace.variable(ad.Trace.variable(2.0))
    assert (v * v).derivative.derivative == 2.0
    assert repr(ad.Trace(ad.Trace(2.0, 1.0), 0.5)) == (
        "Trace(number=Trace(number=2.0, derivative=1.0), "
        "derivative=Trace(number=0.5, derivative=0.0))")
    assert type(ad.Trace(2.0, 1.0)) is ad.Trace      # floats: the fast class
    assert ad.Trace(number=ad.Trace(1.0, 1.0), derivative=2.0).depth == 2


def test_comparisons_where_and_branches_use_the_value():
    x = nested(2.0, 2)
    assert x > 1.0 and x >= 2 and not x < 2.0 and x == 2.0 and x != 3.0
    assert 3.0 > x and ad.Trace(3.0, 0.0) > x and x < nested(2.5, 2)
    assert bool(x) and not bool(nested(0.0, 2))

    def relu_cubed(t):
        return t ** 3 if t > 0 else 0.0 * t

    assert relu_cubed(x).derivative.derivative == 12.0
    w = ad.where(x > 0, x ** 2, 0.0)
    assert type(w) is NestedTrace and w.derivative.derivative == 2.0
    w = ad.where(x < 0, x ** 2, 1.0)
    assert type(w) is NestedTrace and w.number.number == 1.0 and w.derivative.derivative == 0.0
    w = ad.where(True, ad.Trace(1.0, 1.0), x)            # a lower kind, lifted
    assert w.number.derivative == 1.0 and w.derivative.number == 0.0


def test_pickle_and_hash():
    x = ad.Trace(ad.Trace(2.0, 1.0), 0.5) ** 2
    y = pickle.loads(pickle.dumps(x))
    assert type(y) is NestedTrace
    assert repr(y) == repr(x)
    with pytest.raises(TypeError):
        hash(x)


# the methods of the table's two-operand rows (atan2, hypot, pow, xlogy...) and aliases
BINARY_NAMES = {n for r in _rules.RULES if r.arity == 2 for n in (r.name, *r.aliases)}


def test_every_trace_method_is_there():
    # a NestedTrace has every method and attribute of the float Trace, and each of them
    # gives a NestedTrace (or a value of the parts' kind)
    x = nested(0.5, 2)
    missing = [name for name in dir(ad.Trace) if not hasattr(x, name)]
    assert not missing
    for name in dir(ad.Trace):
        method = getattr(x, name)
        if callable(method) and not name.startswith("_") and name not in ("variable",
                                                                            "constant"):
            try:
                result = method() if name not in BINARY_NAMES else method(0.3)
            except (ValueError, ZeroDivisionError):
                continue       # outside the rule's domain (acosh at 0.5)
            assert type(result) is NestedTrace, name
    assert x.__class__.variable(2.0).derivative == 1.0


# ---- forward over reverse: Hessian-vector products ---------------------------------------

def rosenbrock(x):
    return sum(100.0 * (x[i + 1] - x[i] ** 2) ** 2 + (1 - x[i]) ** 2 for i in range(len(x) - 1))


def mixed(x):
    a = ad.sin(x[0]) * x[1] + 1.5
    b = ad.exp(-0.5 * x[2]) / a
    c = ad.log(a + x[0] * x[0]) - b
    d = ad.sqrt(c * c + 1.0) * ad.tanh(b - x[1])
    e = ad.atan2(x[2], 1.0 + x[0] ** 2) + ad.hypot(x[1], x[2]) + 2.0 ** x[0]
    return (a / (1.0 + d * d)) ** 1.5 + e * ad.cosh(x[2] / 3) - abs(x[1] - 3.0)


def piecewise(x):
    return ad.where(x[0] > x[1], x[0] ** 3 * x[1], x[1] ** 2 * ad.exp(x[0])) + ad.maximum(
        x[0] * x[1], 0.5)


def forward_over_reverse(f, x0, v):
    lst = ad.WengertList()
    xs = [lst.variable(float(xi)) for xi in x0]
    out = f([ad.Trace(x, float(vi)) for x, vi in zip(xs, v)])
    d = out.derivative.derivatives()
    return out, np.array([d[x] for x in xs])


@pytest.mark.parametrize("f, x0", [
    (rosenbrock, [0.3, -1.2, 0.8, 1.1]),
    (mixed, [0.4, 1.3, 0.7]),
    (piecewise, [1.5, 0.5]),
    (piecewise, [0.2, 0.9]),
], ids=["rosenbrock", "mixed", "where-a", "where-b"])
def test_trace_of_records_gives_hessian_vector_products(f, x0):
    rng = np.random.default_rng(14)
    hessian = ad.hessian(f)(x0)
    gradient = ad.grad(f)(x0)
    for _ in range(3):
        v = rng.standard_normal(len(x0))
        out, hv = forward_over_reverse(f, x0, v)
        np.testing.assert_allclose(hv, hessian @ v, rtol=1e-10, atol=1e-10)
        assert type(out.number) is ad.Record
        assert out.number.number == pytest.approx(f(list(x0)), rel=1e-14)
        assert out.derivative.number == pytest.approx(gradient @ v, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("rule", UNARY, ids=rule_id)
def test_trace_of_record_second_derivatives_of_every_unary_rule(rule):
    expr = sympy_derivative(rule, (0, 0))
    for label, f in appliers(rule, ad).items():
        for (x0,) in points_with_finite(rule, expr):
            lst = ad.WengertList()
            x = lst.variable(x0)
            got = f(ad.Trace(x, 1.0)).derivative.derivatives()[x]
            assert close(got, evaluate(expr, (x0,))), (label, x0)


def test_trace_of_trace_of_record_third_derivative():
    lst = ad.WengertList()
    x = lst.variable(0.6)
    t = ad.Trace(ad.Trace(x, 1.0), 1.0)
    y = ad.sin(t) * ad.exp(t)
    third = y.derivative.derivative.derivatives()[x]
    want = float(sp.diff(sp.sin(X) * sp.exp(X), X, 3).evalf(subs={X: 0.6}, n=30))
    assert close(third, want)


def test_records_are_constants_inside_a_trace_of_records():
    lst = ad.WengertList()
    x, c = lst.variable(2.0), lst.variable(3.0)
    t = ad.Trace(x, 1.0)
    for z in (t * c, c * t, ad.atan2(c, t) * 0 + t * c):
        assert z.number.number == 6.0
        d = z.derivative.derivatives()           # d/dx (x c) = c: its gradient is (0, 1)
        assert (d[x], d[c]) == (0.0, 1.0)
    cmp = t > c                                   # a recorded comparison of the values
    assert isinstance(cmp, ad.Comparison) and not cmp


def test_where_on_a_trace_of_records_selects_on_the_tape():
    lst = ad.WengertList()
    x = lst.variable(-1.0)
    t = ad.Trace(x, 1.0)
    z = ad.where(t > 0, t ** 3, -t * t)
    assert z.derivative.number == 2.0
    assert z.derivative.derivatives()[x] == -2.0


# ---- errors -----------------------------------------------------------------------------

def test_kinds_of_different_chains_meet_on_the_record_chain():
    # a Trace's depth is its level: a real-chain Trace meeting a Trace over Records is
    # taken onto the Record chain (its floats are constants of the recording)
    lst = ad.WengertList()
    r = lst.variable(1.5)
    tt = ad.Trace(ad.Trace(2.0, 1.0), 1.0)       # 2 + e1 + e2
    tr = ad.Trace(r, 1.0)                        # r + e1
    z = tt * tr                                  # (2 + e1 + e2)(r + e1)
    assert z.depth == 2
    assert z.number.number.number == 3.0         # 2 r
    assert z.number.derivative.number == 3.5     # r + 2 (e1)
    assert z.derivative.number.number == 1.5     # r (e2)
    assert z.derivative.derivative.number == 1.0  # e1 e2
    assert z.number.derivative.derivatives()[r] == 1.0
    assert (tr + tt).number.derivative.number == 2.0
    assert (tt - r).number.number.number == 0.5
    assert (r / tt).derivative.derivative.number == pytest.approx(2 * 1.5 / 8)
    # one level: the same perturbation, d/de (r + e)^(2 + e) = 2 r + r^2 log r
    p = tr ** ad.Trace(2.0, 1.0)
    assert p.derivative.number == pytest.approx(2 * 1.5 + 1.5 ** 2 * np.log(1.5))
    q = ad.atan2(ad.Trace(1.0, 1.0), tr)
    assert q.derivative.number == pytest.approx((1.5 - 1.0) / (1.0 + 1.5 ** 2))
    assert not bool(tt < tr) and bool(tt > tr)
    assert ad.where(True, tt, tr).number.number.number == 2.0
    assert ad.Trace(r, ad.Trace(1.0, 1.0)).depth == 2
    # the float Trace and Records still refuse each other as before
    with pytest.raises(TypeError, match="forward mode .* and reverse mode .* do not mix"):
        ad.Trace(1.0, 1.0) * r


def test_constructor_errors_are_clear():
    with pytest.raises(TypeError, match="number must be a real number"):
        ad.Trace("2.0", 1.0)
    with pytest.raises(TypeError, match="derivative must be a real number, Trace or Record, "
                                        "got str"):
        ad.Trace(ad.Trace(1.0, 1.0), "1")
    with pytest.raises(TypeError, match="number must be a real number, Trace or Record, "
                                        "got list"):
        ad.Trace([1.0], ad.Trace(1.0, 1.0))
    with pytest.raises(TypeError, match="x must be a real number"):
        ad.Trace.variable("1")


def test_unknown_operands_are_left_to_python():
    x = nested(1.0, 2)
    with pytest.raises(TypeError, match="unsupported operand"):
        x + "a"
    assert (x == "a") is False
    with pytest.raises(TypeError):
        ad.atan2(x, "a")


def test_errors_of_the_inner_kind_propagate():
    with pytest.raises(ValueError, match="math domain error"):
        ad.log(nested(-1.0, 2))
    with pytest.raises(ZeroDivisionError):
        nested(1.0, 2) / 0.0


def test_strong_zero_partials_and_infinite_first_derivatives():
    x = nested(0.0, 2)
    # d/dx x ** 0 is mul0(0, pow(x, -1)): 0 at x = 0, at every level
    y = x ** 0
    assert (y.number.number, y.number.derivative, y.derivative.derivative) == (1.0, 0.0, 0.0)
    p = sum(c * x ** k for k, c in enumerate([1.0, 2.0, 3.0]))   # 1 + 2x + 3x^2
    assert (p.number.derivative, p.derivative.derivative) == (2.0, 6.0)
    # sqrt'(0) is inf for a float Trace; nested, it has no derivative: a clear error
    assert ad.sqrt(ad.Trace(0.0, 1.0)).derivative == math.inf
    with pytest.raises(ZeroDivisionError, match=r"sqrt: its derivative is not finite at "
                                                r"x = 0.0 .*no higher derivatives"):
        ad.sqrt(x)
    with pytest.raises(ValueError, match=r"pow: its derivative is not finite at "
                                         r"\(x, y\) = \(0.0, 0.5\)"):
        x ** 0.5
