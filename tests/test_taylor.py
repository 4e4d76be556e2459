"""Taylor mode (easyad/taylor.py) against sympy's derivatives and the forward mode.

- every rule of the table (unary rules at points of their domain, binary rules along a line
  through points of theirs), by every spelling (ad.<name> and the operator), up to order 6,
  against sympy's repeated derivatives of the rule's value expression (tests/_references.py);
- compositions against sympy up to order 8;
- order 1 against Trace;
- the series arithmetic against closed-form series (geometric, binomial);
- the table really drives the series: a changed partial changes the result;
- errors and singular points.
"""
from __future__ import annotations

import functools
import importlib
import math

import mpmath
import numpy as np
import pytest
import scipy.special
import sympy as sp
from _references import X, Y, appliers, interior_points, rule_id, sympy_value

import easyad as ad
from easyad import _rules

# the module (``easyad.taylor`` as an attribute is the function ad.taylor)
taylor_module = importlib.import_module("easyad.taylor")

UNARY = [r for r in _rules.DIFFERENTIATED_RULES if r.arity == 1]
BINARY = [r for r in _rules.DIFFERENTIATED_RULES if r.arity == 2]
T = sp.Symbol("t", real=True)
ORDER = 6
# a direction for binary rules: (x, y) = (x0 + t, y0 + SLOPE t)
SLOPE = -0.75


def exact(v: float) -> sp.Float:
    return sp.Float(v, 50)  # the binary value exactly


@functools.lru_cache(maxsize=None)
def sympy_derivatives(expression: sp.Expr, order: int) -> tuple[float, ...]:
    """d^i expression / dt^i at t = 0, i = 0..order, to 30 digits."""
    out, current = [], expression
    for _ in range(order + 1):
        value = current.xreplace({T: sp.Integer(0)}).evalf(30)
        out.append(float(value) if value.is_real and value.is_finite else math.nan)
        current = sp.diff(current, T)
    return tuple(out)


def assert_series_close(actual, expected, rtol=1e-9):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape
    # the i-th derivative carries i! and powers of the function's length scale: compare
    # each entry relatively, with a floor from the largest derivative up to that order
    floor = np.maximum.accumulate(np.abs(expected)) * 1e-12
    bad = ~(np.abs(actual - expected) <= rtol * np.abs(expected) + floor)
    assert not bad.any(), f"orders {np.nonzero(bad)[0]}: got {actual}, sympy {expected}"


UNARY_CASES = [(rule, label, point) for rule in UNARY for label in appliers(rule, ad)
               for point in interior_points(rule, 3)]
BINARY_CASES = [(rule, label, point) for rule in BINARY for label in appliers(rule, ad)
                for point in interior_points(rule, 2)]


def case_id(case):
    return case if isinstance(case, str) else (case.name if isinstance(case, _rules.Rule)
                                               else ",".join(f"{v:.3g}" for v in case))


@pytest.mark.parametrize("rule,label,point", UNARY_CASES, ids=case_id)
def test_unary_rule_series_match_sympy(rule, label, point):
    (x0,) = point
    function = appliers(rule, ad)[label]
    expected = sympy_derivatives(sympy_value(rule).xreplace({X: exact(x0) + T}), ORDER)
    assert_series_close(ad.taylor(function, x0, order=ORDER), expected)


@pytest.mark.parametrize("rule,label,point", BINARY_CASES, ids=case_id)
def test_binary_rule_series_match_sympy(rule, label, point):
    x0, y0 = point
    function = appliers(rule, ad)[label]
    expected = sympy_derivatives(sympy_value(rule).xreplace(
        {X: exact(x0) + T, Y: exact(y0) + sp.Rational(SLOPE) * T}), ORDER)
    actual = ad.taylor(lambda t: function(x0 + t, y0 + SLOPE * t), 0.0, order=ORDER)
    assert_series_close(actual, expected)


@pytest.mark.parametrize("rule", BINARY, ids=rule_id)
def test_binary_rules_with_one_constant_operand(rule):
    x0, y0 = interior_points(rule, 1)[0]
    for label, function in appliers(rule, ad).items():
        actual = ad.taylor(lambda t: function(t, y0), x0, order=4)
        expected = sympy_derivatives(sympy_value(rule).xreplace(
            {X: exact(x0) + T, Y: exact(y0)}), 4)
        assert_series_close(actual, expected)
        if label.startswith("ad."):  # ad.<name>(float, Taylor) has no method to fall back on
            continue
        actual = ad.taylor(lambda t: function(x0, t), y0, order=4)
        expected = sympy_derivatives(sympy_value(rule).xreplace(
            {X: exact(x0), Y: exact(y0) + T}), 4)
        assert_series_close(actual, expected)


COMPOSITIONS = [  # (easyad function, sympy expression, points)
    (lambda x: ad.exp(ad.sin(x)) * ad.sqrt(1 + x * x),
     sp.exp(sp.sin(T)) * sp.sqrt(1 + T ** 2), (0.3, -1.1)),
    (lambda x: (1 + x) ** x, (1 + T) ** T, (0.0, 0.7)),
    (lambda x: ad.log(ad.cosh(x)) / x, sp.log(sp.cosh(T)) / T, (1.5,)),
    (lambda x: ad.tanh(ad.erf(x)), sp.tanh(sp.erf(T)), (0.2, -0.8)),
    (lambda x: ad.atan2(ad.sin(x), ad.cos(x) + 2), sp.atan2(sp.sin(T), sp.cos(T) + 2), (0.4,)),
    (lambda x: ad.hypot(x, 2 - x ** 2), sp.sqrt(T ** 2 + (2 - T ** 2) ** 2), (0.5,)),
    (lambda x: x ** 2.5 * ad.cbrt(x), T ** sp.Rational(5, 2) * T ** sp.Rational(1, 3), (1.3,)),
    (lambda x: 2 ** x * ad.log1p(x ** 2), 2 ** T * sp.log(1 + T ** 2), (0.6,)),
    (lambda x: ad.asinh(x) * ad.acosh(2 + x) - ad.atanh(x / 3),
     sp.asinh(T) * sp.acosh(2 + T) - sp.atanh(T / 3), (0.3,)),
    (lambda x: 1 / (1 + x ** 2) - ad.expm1(-x) / ad.sqrt(x),
     1 / (1 + T ** 2) - (sp.exp(-T) - 1) / sp.sqrt(T),
     (0.9,)),
]


def symbolic_derivatives(expression: sp.Expr, x0: float, order: int) -> list[float]:
    """sympy's derivatives of expression in t, evaluated at x0 by mpmath (40 digits)."""
    with mpmath.workdps(40):
        out, current = [], expression
        for _ in range(order + 1):
            out.append(float(sp.lambdify(T, current, "mpmath")(mpmath.mpf(x0))))
            current = sp.diff(current, T)
        return out


@pytest.mark.parametrize("index", range(len(COMPOSITIONS)))
def test_compositions_match_sympy(index):
    function, expression, xs = COMPOSITIONS[index]
    for x0 in xs:
        expected = symbolic_derivatives(expression, x0, 7)
        assert_series_close(ad.taylor(function, x0, order=7), expected, rtol=1e-9)


@pytest.mark.parametrize("rule", UNARY, ids=rule_id)
def test_order_one_is_forward_mode(rule):
    for function in appliers(rule, ad).values():
        for (x0,) in interior_points(rule, 3) + ([(0.0,)] if rule.name == "abs" else []):
            trace = function(ad.Trace.variable(x0))
            value, first = ad.taylor(function, x0, order=1)
            assert value == trace.number
            assert first == pytest.approx(trace.derivative, rel=1e-15, abs=0.0)


@pytest.mark.parametrize("rule", BINARY, ids=rule_id)
def test_binary_order_one_is_forward_mode(rule):
    points = interior_points(rule, 2) + ([(1.0, 1.0)] if rule.name in ("maximum", "minimum")
                                         else [])  # a tie: the derivative splits evenly
    for function in appliers(rule, ad).values():
        for x0, y0 in points:
            trace = function(ad.Trace(x0, 1.0), ad.Trace(y0, SLOPE))
            value, first = ad.taylor(lambda t: function(x0 + t, y0 + SLOPE * t), 0.0, order=1)
            assert value == pytest.approx(trace.number, rel=1e-15)
            assert first == pytest.approx(trace.derivative, rel=1e-14)


# ---- the series arithmetic ---------------------------------------------------------------

def test_variable_and_constant():
    t = ad.Taylor.variable(2.5, order=3)
    assert t.coefficients.tolist() == [2.5, 1.0, 0.0, 0.0] and t.order == 3 and t.number == 2.5
    assert ad.Taylor.variable(2.5, order=0).coefficients.tolist() == [2.5]
    assert ad.Taylor.constant(4, order=2).coefficients.tolist() == [4.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        t.coefficients[0] = 1.0  # read-only


def test_division_and_powers_give_closed_form_series():
    t = ad.Taylor.variable(0.0, order=10)
    i = np.arange(11)
    assert np.allclose((1 / (1 - t)).coefficients, np.ones(11), rtol=0, atol=1e-15)
    assert np.array_equal(((1 + t) ** -2).coefficients, (-1.0) ** i * (i + 1))
    assert np.array_equal(((1 + t) ** 3).coefficients, [1, 3, 3, 1, 0, 0, 0, 0, 0, 0, 0])
    for a in (0.5, -1.5, 2.25):  # through the table's pow rule: binomial coefficients
        np.testing.assert_allclose(((1 + t) ** a).coefficients, scipy.special.binom(a, i),
                                   rtol=1e-13, atol=1e-15)
    assert np.allclose((t ** 0).coefficients, [1] + [0] * 10)
    np.testing.assert_allclose((2.0 ** t).coefficients,
                               np.log(2.0) ** i / scipy.special.factorial(i), rtol=1e-13)


def test_arithmetic_with_plain_numbers_on_either_side():
    t = ad.Taylor.variable(2.0, order=2)
    for other in (3, 3.0, np.float64(3.0), np.int32(3)):
        assert (t + other).coefficients.tolist() == [5.0, 1.0, 0.0]
        assert (other + t).coefficients.tolist() == [5.0, 1.0, 0.0]
        assert (other - t).coefficients.tolist() == [1.0, -1.0, 0.0]
        assert (t - other).coefficients.tolist() == [-1.0, 1.0, 0.0]
        assert (other * t).coefficients.tolist() == [6.0, 3.0, 0.0]
        assert (t / other).coefficients.tolist() == pytest.approx([2 / 3, 1 / 3, 0.0])
        assert (other / t).coefficients.tolist() == pytest.approx([1.5, -0.75, 0.375])
    assert (-t).coefficients.tolist() == [-2.0, -1.0, -0.0] and +t is t
    assert abs(-t).coefficients.tolist() == [2.0, 1.0, 0.0]


def test_mixed_orders_keep_the_smaller():
    a, b = ad.Taylor([1.0, 2.0, 3.0]), ad.Taylor([1.0, 1.0])
    assert (a * b).coefficients.tolist() == [1.0, 3.0]
    assert ad.hypot(a, b).order == 1 and (b ** a).order == 1


def test_comparisons_look_at_values():
    t = ad.Taylor.variable(1.0, order=3)
    assert t > 0 and t >= 1 and t < 2.0 and t <= t and t == 1.0 and t != 2
    assert ad.Taylor([1.0, 5.0]) == ad.Taylor([1.0, -5.0])
    assert bool(t) and not ad.Taylor([0.0, 1.0])
    assert ad.where(t > 0, t * 2, 0.0).coefficients.tolist() == [2.0, 2.0, 0.0, 0.0]


def test_numpy_object_arrays_of_taylors():
    ts = np.array([ad.Taylor.variable(0.0, 3), ad.Taylor.variable(1.0, 3)], dtype=object)
    total = np.sum(np.sin(ts) * 2)
    expected = 2 * (np.array([0, 1, 0, -1 / 6]) + np.array(
        [math.sin(1), math.cos(1), -math.sin(1) / 2, -math.cos(1) / 6]))
    np.testing.assert_allclose(total.coefficients, expected, rtol=1e-15)


def test_high_orders_are_cheap_and_right():
    # the recursion sin -> cos -> sin ... is linear in the order, not exponential
    np.testing.assert_allclose(ad.taylor(ad.sin, 0.0, order=25), [0, 1, 0, -1] * 6 + [0, 1],
                               atol=1e-12)
    np.testing.assert_allclose(ad.taylor(ad.exp, 1.0, order=30), np.full(31, math.e), rtol=1e-13)


# ---- the rule table drives the series -----------------------------------------------------

def test_every_rule_is_a_method():
    for rule in _rules.RULES:
        if rule.operator and not hasattr(ad, rule.name):
            continue  # + - * / and negation: operators
        point = interior_points(rule, 1)[0]
        t = ad.Taylor.variable(point[0], order=2)
        for name in (rule.name, *rule.aliases):
            method = getattr(ad.Taylor, name)
            assert method.__name__ == name and rule.doc in method.__doc__
            args = (t,) if rule.arity == 1 else (t, point[1])
            assert isinstance(getattr(ad, name)(*args), ad.Taylor)


def test_the_partials_come_from_the_table():
    t = ad.Taylor.variable(0.3, order=4)
    genuine = _rules.RULES_BY_NAME["sin"]
    doubled = _rules.Rule("sin", genuine.value, ("2.0 * cos(x)",))
    a = taylor_module._apply_rule(genuine, (t,)).coefficients
    b = taylor_module._apply_rule(doubled, (t,)).coefficients
    assert b[0] == a[0] and np.allclose(b[1:], 2 * a[1:])
    # a partial that reads z (exp's is "z") is built order by order
    exp = _rules.RULES_BY_NAME["exp"]
    assert taylor_module._compiled(exp)[1] == (True,)
    assert taylor_module._compiled(genuine)[1] == (False,)


# ---- values, kinks, singular points and errors --------------------------------------------

def test_constant_functions_and_plain_results():
    assert ad.taylor(lambda x: 3.0, 1.0, order=3).tolist() == [3.0, 0.0, 0.0, 0.0]
    assert ad.taylor(lambda x: np.float64(2), 1, order=1).tolist() == [2.0, 0.0]
    assert ad.taylor(ad.sin, 1.0, order=0).tolist() == [math.sin(1.0)]


def test_kinks_follow_the_conventions():
    assert ad.taylor(ad.abs, 0.0, order=3).tolist() == [0.0, 0.0, 0.0, 0.0]
    assert ad.taylor(lambda x: ad.maximum(x, 2 * x), 0.0, order=2).tolist() == [0.0, 1.5, 0.0]


def test_singular_points_give_nan_and_where_masks_them():
    result = ad.taylor(ad.sqrt, 0.0, order=3)   # sqrt'(0) = inf by convention, then NaN
    assert result[0] == 0.0 and result[1] == np.inf and np.isnan(result[2:]).all()
    result = ad.taylor(lambda x: x ** 2.5, 0.0, order=4)  # 0, 0, 0, then infinite
    assert result[:4].tolist() == [0.0, 0.0, 0.0, np.inf] and np.isnan(result[4:]).all()
    masked = ad.taylor(lambda x: ad.where(x > 0, ad.sqrt(x), x * 0.0), 0.0, order=3)
    assert masked.tolist() == [0.0, 0.0, 0.0, 0.0]
    # integer powers are products: exact at 0
    assert ad.taylor(lambda x: x ** 2, 0.0, order=3).tolist() == [0.0, 0.0, 2.0, 0.0]


def test_values_raise_as_on_floats():
    with pytest.raises(ValueError, match="math domain error"):
        ad.taylor(ad.log, -1.0, order=2)
    with pytest.raises(ZeroDivisionError):
        ad.taylor(lambda x: 1 / x, 0.0, order=2)
    with pytest.raises(ZeroDivisionError):
        ad.taylor(lambda x: x ** -1, 0.0, order=2)
    with pytest.raises(OverflowError):
        ad.taylor(ad.exp, 1000.0, order=2)


def test_misuse():
    t = ad.Taylor.variable(1.0, order=2)
    with pytest.raises(TypeError, match="does not mix"):
        t + ad.Trace.variable(1.0)
    with pytest.raises(TypeError, match="does not mix"):
        ad.WengertList().variable(1.0) * t
    with pytest.raises(TypeError):
        t + "a"
    with pytest.raises(TypeError, match="takes a number or a Taylor"):
        ad.hypot(t, "a")
    with pytest.raises(ValueError, match="order must be >= 0"):
        ad.taylor(ad.sin, 1.0, order=-1)
    with pytest.raises(TypeError, match="order must be an int"):
        ad.taylor(ad.sin, 1.0, order=2.0)
    with pytest.raises(TypeError, match="x0 must be a real number"):
        ad.taylor(ad.sin, [1.0], order=2)
    with pytest.raises(TypeError, match="must return a number"):
        ad.taylor(lambda x: "x", 1.0, order=2)
    with pytest.raises(ValueError, match="non-empty 1-D"):
        ad.Taylor([])
    with pytest.raises(ValueError, match="cannot truncate"):
        t.truncate(3)
    with pytest.raises(TypeError, match="not hashable|unhashable"):
        hash(t)


@pytest.mark.parametrize("x0", [0.0, -0.0])
def test_sqrt_at_zero_follows_the_conventions_in_every_mode(x0):
    # issue 12, item 10: sqrt'(-0.0) was -inf in every mode, and Taylor mode gave NaN for
    # sqrt'(0) and for d/dx [0 * sqrt(x)]; docs/conventions.md says +inf and 0
    assert ad.sqrt(ad.Trace.variable(x0)).derivative == np.inf
    lst = ad.WengertList()
    x = lst.variable(x0)
    assert ad.sqrt(x).derivatives()[x] == np.inf
    assert (0.0 * ad.sqrt(x)).derivatives()[x] == 0.0
    F = ad.record(lambda v: ad.sqrt(v[0]), [1.0])
    assert F.gradient(np.array([x0]))[0] == np.inf
    d = ad.taylor(ad.sqrt, x0, 3)
    assert d[0] == 0.0 and d[1] == np.inf and np.isnan(d[2:]).all()
    np.testing.assert_array_equal(ad.taylor(lambda t: 0 * ad.sqrt(t), x0, 3), [0.0] * 4)
    np.testing.assert_array_equal(ad.taylor(lambda t: 0 * ad.sqrt(t) + t * t, x0, 3),
                                  [0.0, 0.0, 2.0, 0.0])
