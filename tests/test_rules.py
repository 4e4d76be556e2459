"""Every rule of the table (easyad/_rules.py), checked in forward and reverse mode.

Cases are generated from the table, so a new rule gets all of these for free:

1. points: seeded interior points of each rule's domain plus special values (_references);
2. derivatives against five-point finite differences, in every spelling of the rule (ad.<name>,
   the operator), w.r.t. each input, with the other input a constant Trace/Record or a float;
3. the table's partial strings against sympy's diff of its value string, and the Trace/Record
   derivatives against sympy's derivative evaluated with mpmath;
4. the derivatives against PyTorch float64 autograd;
5. values and exceptions against the math module (bit for bit), ints, numpy scalars and arrays,
   and the tape after a failed operation;
6. aliases, Trace/Record methods and numpy object arrays;
7. the derivative conventions (kinks, zero bases, strong zero), forward == reverse exactly;
8. hypothesis: random compositions of rules, forward == reverse and floats == .number.
"""
from __future__ import annotations

import math
import operator

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import easyad as ad
from _references import (
    RULES,
    Approximate,
    UNARY,
    appliers,
    central_difference,
    evaluate,
    fd_step,
    float_reference,
    in_domain,
    interior_points,
    math_value,
    partial_values,
    probe_points,
    rule_id,
    smooth_points,
    zero_sign_specified,
    special_points,
    sympy_derivatives,
    sympy_partials,
    torch_gradient,
)

EPS = 2.0 ** -52
FD_RTOL = 1e-7      # truncation of the 5-point stencil is ~1e-12 relative (see _references)
SYMPY_RTOL = 1e-12  # a few roundings in the partial's double formula, nothing more
TORCH_RTOL = 1e-10  # torch may order the same formula's operations differently


# ---- helpers ------------------------------------------------------------------------------

def same_float(a, b, signed_zero: bool = True) -> bool:
    """Bit-for-bit equality of two floats, except that all NaNs are equal; 0.0 != -0.0
    unless signed_zero is False."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(b, Approximate):    # scipy's value of a function libm computes otherwise
        return abs(a - b) <= b.atol + b.rtol * abs(b)
    return a == b and (not signed_zero or math.copysign(1.0, a) == math.copysign(1.0, b))


def report(failures) -> str:
    """All failures, one a line (a str, so pytest shows it whole)."""
    return f"{len(failures)} failures:\n" + "\n".join(map(repr, failures))


def close(a: float, b: float, rtol: float, atol: float = 0.0) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= rtol * abs(b) + atol


def variants(arity: int) -> list[tuple[str, int, bool]]:
    """(mode, wrt, floats): each AD mode, w.r.t. each input, the other input a constant of
    the same kind (Trace.constant / a second variable) or, when floats, a plain float."""
    return [(mode, wrt, floats) for mode in ("Trace", "Record") for wrt in range(arity)
            for floats in ((False, True) if arity == 2 else (False,))]


def differentiate(apply, point, mode: str, wrt: int, floats: bool) -> tuple[float, float]:
    """Value and derivative of apply(*point) w.r.t. point[wrt] in one mode (see variants).

    In reverse mode also asserts that the operation took exactly one tape entry: plain-float
    constants take none.
    """
    if mode == "Trace":
        args = [ad.Trace.variable(v) if i == wrt else (v if floats else ad.Trace.constant(v))
                for i, v in enumerate(point)]
        z = apply(*args)
        assert type(z) is ad.Trace
        return z.number, z.derivative
    lst = ad.WengertList()
    args = [lst.variable(v) if i == wrt or not floats else v for i, v in enumerate(point)]
    entries = len(lst)
    z = apply(*args)
    assert type(z) is ad.Record and len(lst) == entries + 1
    return z.number, z.derivatives()[args[wrt]]


def ad_derivatives(apply, point) -> list[tuple[str, float]]:
    """(variant label, derivative) for every variant; asserts they all agree exactly.

    Every variant runs the same partial formula once (seed 1, adjoint 1), so any difference
    between forward, reverse, Trace or float constants is a bug, not rounding.
    """
    out = []
    for mode, wrt, floats in variants(len(point)):
        value, derivative = differentiate(apply, point, mode, wrt, floats)
        out.append((wrt, f"{mode}{'+float' if floats else ''}", value, derivative))
    for wrt in range(len(point)):
        same = [(label, v, d) for w, label, v, d in out if w == wrt]
        first = same[0]
        for other in same[1:]:
            assert same_float(other[1], first[1]) and same_float(other[2], first[2]), (
                f"modes disagree at {point} w.r.t. input {wrt}: {first} vs {other}")
    return out


def number_and_derivative(z, wrt, mode, derivatives=None):
    """z.number and dz/d wrt, treating a plain float result as a constant."""
    if not isinstance(z, (ad.Trace, ad.Record)):
        return float(z), 0.0
    if mode == "Trace":
        return z.number, z.derivative
    return z.number, (derivatives or z.derivatives())[wrt]


def outcome(call):
    """('value', v) or ('raises', exception type) of call()."""
    try:
        return ("value", call())
    except (ArithmeticError, ValueError) as error:
        return ("raises", type(error))


def same_outcome(a, b, signed_zero: bool = True) -> bool:
    """easyad's outcome a is Python's b: the same value, or an error b's except clause
    catches (ad.PowDomainError at 0.0 to a negative power: math.pow's ValueError and
    float **'s ZeroDivisionError at once)."""
    if a[0] != b[0]:
        return False
    if a[0] == "raises":
        return a[1] is b[1] or (a[1] is ad.PowDomainError and issubclass(a[1], b[1]))
    return same_float(float(a[1]), b[1] if isinstance(b[1], Approximate) else float(b[1]),
                      signed_zero)


# ---- 1. sample points ----------------------------------------------------------------------

@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_sample_points_lie_in_the_domain_and_are_enough(rule):
    """Interior points are inside the open domain; every rule gets at least 6 smooth points."""
    assert all(in_domain(rule, p) for p in interior_points(rule) + special_points(rule))
    assert interior_points(rule) == interior_points(rule)  # seeded: the same every run
    assert len(smooth_points(rule)) >= 6


# ---- 2. finite differences -----------------------------------------------------------------

@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_derivatives_match_finite_differences(rule):
    """Trace and Record derivatives (each input, constants as Trace/Record or float on
    either side, every spelling) agree with each other exactly and with a five-point central
    difference of the float function within FD_RTOL plus the stencil's rounding bound.
    Points where the stencil straddles a jump (atan2's branch cut) are left to sympy."""
    failures, jumps = [], set()
    for label, apply in appliers(rule, ad).items():
        reference = float_reference(rule, label)
        for point in smooth_points(rule):
            for wrt, variant, _value, derivative in ad_derivatives(apply, point):
                lo, hi = rule.domain[wrt]
                h = fd_step(point[wrt], lo, hi)

                def f(t, point=point, wrt=wrt):
                    return reference(*[t if i == wrt else v for i, v in enumerate(point)])

                fd = central_difference(f, point[wrt], h)
                if fd is None:
                    jumps.add((point, wrt))
                elif not close(derivative, fd[0], FD_RTOL, fd[1]):
                    failures.append((label, point, wrt, variant, derivative, fd[0]))
    assert not failures, report(failures)
    assert len(jumps) <= len(smooth_points(rule)) // 4, jumps  # most points have a reference


@pytest.mark.parametrize("rule", UNARY, ids=rule_id)
def test_forward_derivative_scales_with_the_seed(rule):
    """Trace(x, s).derivative is s times the derivative of Trace.variable(x) (s = 0.5, -2:
    powers of two, so exactly)."""
    for label, apply in appliers(rule, ad).items():
        for (x,) in smooth_points(rule):
            base = apply(ad.Trace.variable(x)).derivative
            for seed in (0.5, -2.0):
                assert apply(ad.Trace(x, seed)).derivative == seed * base, (label, x)


# ---- 3. sympy ----------------------------------------------------------------------------

@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_partials_are_the_derivatives_of_the_value(rule):
    """Each partial string of the table (z replaced by the value string) equals sympy's diff
    of the value string, at 30 digits, up to the rounding of the table's decimal constants
    (ln 2, ln 10, 2/sqrt(pi) are written to 17 digits: relative error below 1e-16)."""
    for point in smooth_points(rule):
        for k, (partial, derivative) in enumerate(zip(sympy_partials(rule),
                                                      sympy_derivatives(rule))):
            table, exact = evaluate(partial, point), evaluate(derivative, point)
            assert close(table, exact, 4 * EPS), (rule.name, point, k, table, exact)


@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_derivatives_match_sympy(rule):
    """Trace and Record derivatives equal sympy's derivative, evaluated exactly (mpmath, 30
    digits) at the exact binary input, to SYMPY_RTOL: the double formula may lose a few
    ulps, not more."""
    failures = []
    for label, apply in appliers(rule, ad).items():
        for point in smooth_points(rule):
            exact = [evaluate(d, point) for d in sympy_derivatives(rule)]
            for wrt, variant, _, derivative in ad_derivatives(apply, point):
                if not close(derivative, exact[wrt], SYMPY_RTOL):
                    failures.append((label, point, wrt, variant, derivative, exact[wrt]))
    assert not failures, report(failures)


# ---- 4. PyTorch ------------------------------------------------------------------------------

@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_derivatives_match_torch(rule):
    """Trace and Record derivatives equal torch.autograd's (float64) on the rule's value
    string evaluated with torch's functions, to TORCH_RTOL (skipped where torch lacks one).

    torch is a reference only where it is itself accurate (agrees with sympy to TORCH_RTOL):
    its tanh' = 1 - tanh(x)**2 loses 8 digits at x = 10, for example. Accuracy there is
    test_derivatives_match_sympy's job; most points must remain.
    """
    pytest.importorskip("torch")
    failures, inaccurate = [], set()
    for label, apply in appliers(rule, ad).items():
        for point in smooth_points(rule):
            try:
                expected = torch_gradient(rule, point)
            except NameError as missing:
                pytest.skip(f"torch has no counterpart: {missing}")
            exact = [evaluate(d, point) for d in sympy_derivatives(rule)]
            for wrt, variant, _, derivative in ad_derivatives(apply, point):
                if not close(expected[wrt], exact[wrt], TORCH_RTOL):
                    inaccurate.add((point, wrt))
                elif not close(derivative, expected[wrt], TORCH_RTOL):
                    failures.append((label, point, wrt, variant, derivative, expected[wrt]))
    assert not failures, report(failures)
    assert len(inaccurate) <= rule.arity * len(smooth_points(rule)) // 4, inaccurate


# ---- 5. values, numbers of other types, errors ---------------------------------------------

@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_values_and_errors_match_python(rule):
    """At 300 interior, the special and probe points (domain bounds, huge, +-inf, NaN),
    every spelling in every mode (floats, Trace and Record with constants of either kind on
    either side) returns the float reference's value bit for bit (math module for
    ad.<name>, Python's float operators for operators) or raises the same exception type.

    Intended differences: float ** with a negative base and a fractional exponent gives a
    complex in Python, easyad raises ValueError; the sign of maximum(0.0, -0.0) is open.
    """
    failures, signed_zero = [], zero_sign_specified(rule)
    for label, apply in appliers(rule, ad).items():
        reference = float_reference(rule, label)
        points = probe_points(rule) + special_points(rule) + interior_points(rule, n=300)
        for point in points:
            expected = outcome(lambda: reference(*point))
            if expected[0] == "value" and isinstance(expected[1], complex):
                expected = ("raises", ValueError)
            got = {}
            if label.startswith("ad."):
                got["float"] = outcome(lambda: apply(*point))
            for mode, wrt, floats in variants(rule.arity):
                got[f"{mode}[{wrt}]{'+float' if floats else ''}"] = outcome(
                    lambda: differentiate(apply, point, mode, wrt, floats)[0])
            bad = {k: v for k, v in got.items()
                   if not same_outcome(v, expected, signed_zero)}
            if bad:
                failures.append((label, point, expected, bad))
    assert not failures, report(failures)


@pytest.mark.parametrize("rule", [r for r in RULES if hasattr(ad, r.name)], ids=rule_id)
def test_float_values_equal_math_on_many_points(rule):
    """ad.<name> on floats equals the math module bit for bit at 3000 seeded points of the
    domain: a last-bit difference (another libm routine) shows only on a dense sample."""
    fn = getattr(ad, rule.name)
    signed_zero = zero_sign_specified(rule)
    different = [(p, fn(*p), math_value(rule, *p)) for p in interior_points(rule, n=3000)
                 if not same_float(fn(*p), math_value(rule, *p), signed_zero)]
    assert not different, (len(different), different[:5])


@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_ints_and_numpy_scalars_are_accepted(rule):
    """ints, np.int64, np.float64 and np.float32 inputs give the float reference's result on
    float(input) as a Python float, for ad.<name> and for operators on Trace/Record."""
    points = [p for p in probe_points(rule) + special_points(rule)
              if all(abs(v) <= 1000 and v == int(v) for v in p)]
    assert points
    signed_zero = zero_sign_specified(rule)
    for label, apply in appliers(rule, ad).items():
        reference = float_reference(rule, label)
        for point in points:
            for convert in (int, np.int64, np.float64, np.float32):
                args = [convert(v) for v in point]
                expected = outcome(lambda: reference(*[float(a) for a in args]))
                if label.startswith("ad."):
                    got = outcome(lambda: apply(*args))
                    assert same_outcome(got, expected, signed_zero), (label, args, got, expected)
                    if got[0] == "value":
                        assert type(got[1]) is float
                if rule.arity == 2:  # a converted constant beside a Trace or a Record
                    x, y = (float(a) for a in args)
                    got = outcome(lambda: apply(ad.Trace.variable(x), args[1]).number)
                    assert same_outcome(got, expected, signed_zero), (label, args, got, expected)
                    lst = ad.WengertList()
                    got = outcome(lambda: apply(args[0], lst.variable(y)).number)
                    assert same_outcome(got, expected, signed_zero), (label, args, got, expected)


def _numpy_ufunc(rule):
    """numpy's ufunc for a rule under its name or an alias, or None (erf)."""
    for name in (rule.name,) + rule.aliases:
        candidate = getattr(np, name, None)
        if isinstance(candidate, np.ufunc) and candidate.nin == rule.arity:
            return candidate
    return None


@pytest.mark.parametrize("rule", [r for r in RULES if hasattr(ad, r.name)], ids=rule_id)
def test_numpy_arrays_go_elementwise(rule):
    """ad.<name>(array) keeps shape and dtype and equals numpy's ufunc exactly (or, without
    one, the math module elementwise), and is within a few ulps of the math module."""
    fn = getattr(ad, rule.name)
    points = np.array(interior_points(rule, n=6)).reshape(2, 3, rule.arity)
    args = [points[..., k] for k in range(rule.arity)]
    ufunc = _numpy_ufunc(rule)
    calls = [args]
    if rule.arity == 2:  # an array with a float on either side
        calls += [[args[0], float(args[1][0, 0])], [float(args[0][0, 0]), args[1]]]
    for call in calls:
        result = fn(*call)
        assert isinstance(result, np.ndarray) and result.shape == (2, 3)
        assert result.dtype == np.float64
        elementwise = np.vectorize(lambda *v: math_value(rule, *v), otypes=[float])(*call)
        if ufunc is not None:
            np.testing.assert_array_equal(result, ufunc(*call))
            np.testing.assert_allclose(result, elementwise, rtol=8 * EPS, atol=0)
        elif isinstance(math_value(rule, *points[0, 0]), Approximate):   # scipy's value
            np.testing.assert_allclose(result, elementwise, rtol=Approximate.rtol,
                                       atol=Approximate.atol)
        else:
            np.testing.assert_array_equal(result, elementwise)
    if rule.arity == 1:
        single = args[0].astype(np.float32)
        assert fn(single).dtype == np.float32


ERROR_CASES = [
    ("log(-1)", ad.log, (-1.0,), ValueError),
    ("log(0)", ad.log, (0.0,), ValueError),
    ("sqrt(-1)", ad.sqrt, (-1.0,), ValueError),
    ("acosh(0.5)", ad.acosh, (0.5,), ValueError),
    ("atanh(1)", ad.atanh, (1.0,), ValueError),
    ("exp(1000)", ad.exp, (1000.0,), OverflowError),
    ("1 / 0", operator.truediv, (1.0, 0.0), ZeroDivisionError),
    ("0.0 ** -1", operator.pow, (0.0, -1.0), ZeroDivisionError),
    ("pow(0.0, -1)", ad.pow, (0.0, -1.0), ValueError),
    ("(-8.0) ** 0.5", operator.pow, (-8.0, 0.5), ValueError),
]


@pytest.mark.parametrize("apply, point, error", [c[1:] for c in ERROR_CASES],
                         ids=[c[0] for c in ERROR_CASES])
def test_documented_errors_in_every_mode(apply, point, error):
    """The documented exceptions, raised like Python's (checked first) in every mode; a failed
    Record operation leaves the list's length unchanged and earlier Records usable."""
    if apply in (operator.truediv, operator.pow):  # Python's float operator is the reference
        if point != (-8.0, 0.5):  # where Python gives a complex; easyad refuses
            with pytest.raises(error):
                apply(*point)
    else:  # ad.<name>: the math module is the reference, and ad.<name> on floats raises too
        with pytest.raises(error):
            getattr(math, apply.__name__)(*point)
        with pytest.raises(error):
            apply(*point)
    for mode, wrt, floats in variants(len(point)):
        if mode == "Trace":
            with pytest.raises(error):
                differentiate(apply, point, mode, wrt, floats)
            continue
        lst = ad.WengertList()
        w = lst.variable(1.5)
        earlier = w * 3.0 + 1.0
        args = [lst.variable(v) if i == wrt or not floats else v for i, v in enumerate(point)]
        before = len(lst)
        with pytest.raises(error):
            apply(*args)
        assert len(lst) == before
        assert earlier.derivatives()[w] == 3.0 and earlier.number == 5.5
        after = earlier * w  # the list still records
        assert len(lst) == before + 1 and after.derivatives()[w] == 5.5 + 3.0 * 1.5


# ---- 6. aliases, methods, object arrays --------------------------------------------------------

@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_names_aliases_and_methods(rule):
    """Every rule is reachable: ad.<name> (or its operator only), aliases are the very same
    function object, Trace and Record have a method per name and alias (or the operator's
    dunders) whose results equal the generic function's exactly."""
    assert hasattr(ad, rule.name) or rule.operator, "neither a function nor an operator"
    names = (rule.name,) + rule.aliases
    for alias in rule.aliases:
        assert getattr(ad, alias) is getattr(ad, rule.name)
        assert alias in ad.__all__
    point = interior_points(rule)[0]
    for cls in (ad.Trace, ad.Record):
        if rule.operator:
            assert hasattr(cls, f"__{rule.operator}__")
            if rule.arity == 2:
                assert hasattr(cls, f"__r{rule.operator}__")
        if not hasattr(ad, rule.name):
            continue
        for name in names:
            for mode, wrt, floats in variants(rule.arity):
                if (mode == "Trace") != (cls is ad.Trace) or (floats and wrt == 1):
                    continue  # a method needs self first: x.atan2(y) with x the Trace/Record
                by_method = differentiate(lambda a, *b: getattr(a, name)(*b),
                                          point, mode, wrt, floats)
                generic = differentiate(getattr(ad, rule.name), point, mode, wrt, floats)
                assert all(map(same_float, by_method, generic)), (cls, name)


def _object_array(mode, values):
    if mode == "Trace":
        return None, np.array([ad.Trace.variable(v) for v in values], dtype=object)
    lst = ad.WengertList()
    return lst, np.array([lst.variable(v) for v in values], dtype=object)


@pytest.mark.parametrize("mode", ["Trace", "Record"])
@pytest.mark.parametrize("rule", [r for r in RULES if _numpy_ufunc(r) and any(
    "O" in t for t in _numpy_ufunc(r).types)], ids=rule_id)   # (logaddexp, copysign: no
# loop over objects in numpy; on object arrays ad.<name>: tests/test_special_rows.py)
def test_numpy_ufuncs_on_object_arrays(rule, mode):
    """numpy's ufunc (np.sin, np.arcsinh, np.arctan2...) on an object array of Traces or
    Records calls their methods: the same numbers and derivatives as ad.<name> per element."""
    ufunc = _numpy_ufunc(rule)
    points = interior_points(rule, n=5)
    columns = list(zip(*points))
    _, xs = _object_array(mode, columns[0])
    args = [xs] + [np.array(c) for c in columns[1:]]  # a second input as plain floats
    result = ufunc(*args)
    generic = getattr(ad, rule.name, None) or getattr(operator, rule.operator)
    for i, point in enumerate(points):
        z = result[i]
        expected = generic(xs[i], *point[1:])
        assert number_and_derivative(z, xs[i], mode) == number_and_derivative(
            expected, xs[i], mode), (i, point)


@pytest.mark.parametrize("mode", ["Trace", "Record"])
def test_numpy_dot_and_sum_on_object_arrays(mode):
    """np.dot with float weights and np.sum over Traces/Records: value and gradient by hand
    (dyadic numbers, so exact): d/dx_i of w.x is w_i, of sum(x) is 1."""
    values, weights = [0.5, -1.25, 2.0], np.array([3.0, -2.0, 0.25])
    _, xs = _object_array(mode, values)
    dot, total = np.dot(weights, xs), np.sum(xs)
    assert dot.number == sum(w * v for w, v in zip(weights, values)) and total.number == 1.25
    if mode == "Trace":  # every input seeded with 1: the directional derivative along (1,1,1)
        assert dot.derivative == weights.sum() and total.derivative == 3.0
    else:
        d_dot, d_total = dot.derivatives(), total.derivatives()
        assert [d_dot[x] for x in xs] == list(weights) and [d_total[x] for x in xs] == [1.0] * 3


# ---- 7. derivative conventions -----------------------------------------------------------------

INF = math.inf
# (description, function, point, expected gradient; None where no convention is promised)
CONVENTIONS = [
    ("ad.abs'(0) = 0", ad.abs, (0.0,), (0.0,)),
    ("builtin abs'(0) = 0", abs, (0.0,), (0.0,)),
    ("sqrt'(0) = +inf", ad.sqrt, (0.0,), (INF,)),
    ("maximum tie splits", ad.maximum, (1.5, 1.5), (0.5, 0.5)),
    ("minimum tie splits", ad.minimum, (1.5, 1.5), (0.5, 0.5)),
    ("maximum tie against a float", lambda x: ad.maximum(x, 1.5), (1.5,), (0.5,)),
    ("minimum tie, float first", lambda x: ad.minimum(1.5, x), (1.5,), (0.5,)),
    ("maximum(x, x) = x", lambda x: ad.maximum(x, x), (1.5,), (1.0,)),
    ("minimum(x, x) = x", lambda x: ad.minimum(x, x), (-1.5,), (1.0,)),
    ("x ** y at (0, 0): d/dx = 0", operator.pow, (0.0, 0.0), (0.0, None)),
    ("pow(x, y) at (0, 0): d/dx = 0", ad.pow, (0.0, 0.0), (0.0, None)),
    ("x ** 0.0 at 0", lambda x: x ** 0.0, (0.0,), (0.0,)),
    ("x ** 0 (int) at 0", lambda x: x ** 0, (0.0,), (0.0,)),
    # d/dx = y * 0 ** (y - 1) by hand: 2 * 0 = 0, 1 * 1 = 1, 0.5 * inf = inf; d/dy = 0 (y > 0)
    ("x ** y at (0, 2)", operator.pow, (0.0, 2.0), (0.0, 0.0)),
    ("x ** y at (0, 1)", operator.pow, (0.0, 1.0), (1.0, 0.0)),
    ("pow(x, y) at (0, 0.5)", ad.pow, (0.0, 0.5), (INF, 0.0)),
    ("0.0 ** y at y = 2", lambda y: 0.0 ** y, (2.0,), (0.0,)),
    ("pow(0.0, y) at y = 0.5", lambda y: ad.pow(0.0, y), (0.5,), (0.0,)),
    ("hypot'(0, 0) = (0, 0)", ad.hypot, (0.0, 0.0), (0.0, 0.0)),
    ("hypot(x, 0.0) at 0", lambda x: ad.hypot(x, 0.0), (0.0,), (0.0,)),
    ("where(x > 0, sqrt(x), 0.0) at 0", lambda x: ad.where(x > 0, ad.sqrt(x), 0.0),
     (0.0,), (0.0,)),
    ("where(x > 0, sqrt(x), x) at 0", lambda x: ad.where(x > 0, ad.sqrt(x), x), (0.0,), (1.0,)),
    ("0.0 * sqrt(x) at 0", lambda x: 0.0 * ad.sqrt(x), (0.0,), (0.0,)),
    ("sqrt(x) * 0.0 + x at 0", lambda x: ad.sqrt(x) * 0.0 + x, (0.0,), (1.0,)),
    ("sqrt(x) * y at (0, 0)", lambda x, y: ad.sqrt(x) * y, (0.0, 0.0), (0.0, 0.0)),
]


@pytest.mark.parametrize("f, point, expected", [c[1:] for c in CONVENTIONS],
                         ids=[c[0] for c in CONVENTIONS])
def test_derivative_conventions(f, point, expected):
    """Each documented convention, at its point: forward and reverse give exactly the same
    gradient, equal to the convention (and the same value as on floats)."""
    value = f(*point)
    lst = ad.WengertList()
    records = [lst.variable(v) for v in point]
    z = f(*records)
    d = z.derivatives() if isinstance(z, ad.Record) else None
    for k in range(len(point)):
        traces = [ad.Trace.variable(v) if i == k else ad.Trace.constant(v)
                  for i, v in enumerate(point)]
        forward = number_and_derivative(f(*traces), None, "Trace")
        reverse = number_and_derivative(z, records[k], "Record", d)
        assert same_float(forward[0], value) and same_float(reverse[0], value)
        assert same_float(forward[1], reverse[1]), (k, forward, reverse)
        if expected[k] is not None:
            assert same_float(forward[1], expected[k]) or forward[1] == expected[k] == 0.0, (
                k, forward, expected[k])


# ---- 8. random compositions ---------------------------------------------------------------------

APPLIERS = {f"{rule.name}:{label}": (rule, apply)
            for rule in RULES for label, apply in appliers(rule, ad).items()}
UNARY_KEYS = sorted(k for k, (r, _) in APPLIERS.items() if r.arity == 1)
BINARY_KEYS = sorted(k for k, (r, _) in APPLIERS.items() if r.arity == 2)
N_VARIABLES = 3


class Rejected(Exception):
    """A random expression left the region where every partial is finite."""


def evaluate_tree(tree, args, check=False):
    """Run an expression tree ("var", i) / ("const", c) / (applier key, *children) on args.

    With check, reject (raise Rejected) where a node's value or one of its table partials
    is not finite: there inf * 0 decides the result and the two modes may legitimately sum
    it differently (those points are covered by the convention tests). Returns the value
    and, with check, the 'absolute derivative' bound: the chain rule run on |partials|.
    """
    kind = tree[0]
    if kind == "var":
        return args[tree[1]], [float(i == tree[1]) for i in range(N_VARIABLES)]
    if kind == "const":
        return tree[1], [0.0] * N_VARIABLES
    rule, apply = APPLIERS[kind]
    children = [evaluate_tree(c, args, check) for c in tree[1:]]
    value = apply(*[c[0] for c in children])
    bound = [0.0] * N_VARIABLES
    if check:
        if not isinstance(value, float) or not math.isfinite(value):
            raise Rejected
        partials = partial_values(rule, tuple(float(c[0]) for c in children), value)
        if not all(math.isfinite(p) for p in partials):
            raise Rejected
        for p, (_, child_bound) in zip(partials, children):
            bound = [b + abs(p) * c for b, c in zip(bound, child_bound)]
    return value, bound


leaves = st.one_of(
    st.integers(0, N_VARIABLES - 1).map(lambda i: ("var", i)),
    st.sampled_from([0.5, 2.0, -1.5, 3.0]).map(lambda c: ("const", c)),
)


def _extend(children):
    return st.one_of(
        st.tuples(st.sampled_from(UNARY_KEYS), children),
        st.tuples(st.sampled_from(BINARY_KEYS), children, children),
    )


trees = _extend(st.recursive(leaves, _extend, max_leaves=6))
inputs = st.lists(st.floats(-2.5, 2.5, allow_nan=False), min_size=N_VARIABLES,
                  max_size=N_VARIABLES)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(tree=trees, values=inputs)
def test_random_compositions_forward_equals_reverse(tree, values):
    """For random expressions over 1-3 variables built from every rule and spelling, where
    every intermediate partial is finite: floats, Trace and Record give the same value
    exactly, and forward and reverse gradients agree to 1e-9 of the absolute-derivative
    bound (the two modes sum the same path products in different orders)."""
    try:
        value, bound = evaluate_tree(tree, values, check=True)
    except (Rejected, ArithmeticError, ValueError):
        assume(False)
    # a sum of path products that overflows (x/x at a tiny x: partials of +-1/x) makes the
    # modes differ legitimately (0 forward, inf - inf = NaN reverse): outside the claim
    assume(all(math.isfinite(b) for b in bound))
    lst = ad.WengertList()
    records = [lst.variable(v) for v in values]
    z = evaluate_tree(tree, records)[0]
    d = z.derivatives() if isinstance(z, ad.Record) else None
    for k in range(N_VARIABLES):
        traces = [ad.Trace.variable(v) if i == k else ad.Trace.constant(v)
                  for i, v in enumerate(values)]
        forward = number_and_derivative(evaluate_tree(tree, traces)[0], None, "Trace")
        reverse = number_and_derivative(z, records[k], "Record", d)
        assert same_float(forward[0], value) and same_float(reverse[0], value)
        # (+ a few of the smallest subnormal: a path product landing among subnormals
        # rounds to a multiple of it, whatever the order, e.g. 5e-324 against 1e-323)
        assert abs(forward[1] - reverse[1]) <= 1e-9 * bound[k] + 16 * 5e-324, \
            (k, forward, reverse, bound)
