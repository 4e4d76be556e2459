"""``ad.define`` operations in every mode (issue 24, item 9): floats, Trace, Record, replay,
nested Traces (Trace of Trace, Trace of Record, three levels), Taylor series; and Taylor
mode at a point with no series (sqrt at 0).

References: sympy's derivatives of the same functions, evaluated at the point; the
user's own derivative functions are only what the operation is built from.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import easyad as ad

sympy = pytest.importorskip("sympy")

X0 = 0.3
_s = sympy.Symbol("s")
_SOFTPLUS = sympy.log(1 + sympy.exp(_s))
# d^k/ds^k softplus at X0, k = 0..4
D = [float(sympy.diff(_SOFTPLUS, _s, k).subs(_s, X0)) for k in range(5)]


def _math_definition():
    # derivatives on floats only (math): exact as far as they are given, orders 0..2
    return ad.define("softplus_math", lambda t: math.log1p(math.exp(t)),
                     lambda t: 1 / (1 + math.exp(-t)),
                     lambda t: math.exp(-t) / (1 + math.exp(-t)) ** 2)


def _easyad_definition():
    # derivatives written with easyad operations: they take Traces and series themselves
    return ad.define("softplus_ad", lambda t: math.log1p(math.exp(t)),
                     lambda t: 1 / (1 + ad.exp(-t)),
                     lambda t: ad.exp(-t) / (1 + ad.exp(-t)) ** 2)


def _numeric_definition():
    return ad.define("softplus_numeric", lambda t: math.log1p(math.exp(t)), "numeric")


DEFINITIONS = {"math": (_math_definition, 1e-14, 2), "easyad": (_easyad_definition, 1e-14, 4),
               "numeric": (_numeric_definition, 1e-6, 2)}


@pytest.fixture(params=sorted(DEFINITIONS))
def definition(request):
    make, tol, taylor_order = DEFINITIONS[request.param]
    return make(), tol, taylor_order


def test_first_order_modes(definition):
    op, tol, _ = definition
    assert op(X0) == pytest.approx(D[0], rel=1e-15)
    assert op(ad.Trace.variable(X0)).derivative == pytest.approx(D[1], rel=tol)
    lst = ad.WengertList()
    x = lst.variable(X0)
    assert (op(x) * 2.0).derivatives()[x] == pytest.approx(2 * D[1], rel=tol)
    F = ad.record(lambda v: op(v[0]) * v[1], [1.0, 2.0])
    np.testing.assert_allclose(F.gradient([X0, 3.0]), [3 * D[1], D[0]], rtol=tol)
    np.testing.assert_allclose(F.hessian([X0, 3.0]), [[3 * D[2], D[1]], [D[1], 0.0]],
                               rtol=max(tol, 1e-13) * 10, atol=1e-12)   # (numeric: 1e-5)


def test_nested_traces_give_second_derivatives(definition):
    op, tol, _ = definition
    y = op(ad.Trace(ad.Trace(X0, 1.0), 1.0))          # Trace of Trace
    assert y.number.number == pytest.approx(D[0], rel=1e-15)
    assert y.number.derivative == pytest.approx(D[1], rel=tol)
    assert y.derivative.number == pytest.approx(D[1], rel=tol)
    assert y.derivative.derivative == pytest.approx(D[2], rel=max(tol, 1e-5))
    lst = ad.WengertList()                             # Trace of Record: an HVP
    a = lst.variable(X0)
    g = op(ad.Trace(a, 1.0)).derivative
    assert g.number == pytest.approx(D[1], rel=tol)
    assert g.derivatives()[a] == pytest.approx(D[2], rel=max(tol, 1e-5))


def test_taylor_series_up_to_the_derivatives_known(definition):
    op, tol, order = definition
    np.testing.assert_allclose(ad.taylor(op, X0, order), D[:order + 1],
                               rtol=max(tol, 1e-5) if order < 3 else 1e-12)
    if order < 4:
        with pytest.raises(ValueError, match=r"softplus_\w+.*higher order.*easyad operations"):
            ad.taylor(op, X0, order + 1)


def test_three_levels_of_traces_use_the_second_derivative_on_traces():
    op = _easyad_definition()
    y = op(ad.Trace(ad.Trace(ad.Trace(X0, 1.0), 1.0), 1.0))
    assert y.derivative.derivative.derivative == pytest.approx(D[3], rel=1e-13)
    with pytest.raises(ValueError, match="softplus_math.*higher order"):
        _math_definition()(ad.Trace(ad.Trace(ad.Trace(X0, 1.0), 1.0), 1.0))


def test_taylor_series_compose_with_builtins():
    op = _easyad_definition()
    expr = sympy.sin(_s) * sympy.log(1 + sympy.exp(2 * _s))
    want = [float(sympy.diff(expr, _s, k).subs(_s, X0)) for k in range(5)]
    np.testing.assert_allclose(ad.taylor(lambda t: ad.sin(t) * op(2 * t), X0, 4), want,
                               rtol=1e-12)


def _scaled_log(easyad_ops):
    log = ad.log if easyad_ops else math.log
    return ad.define(f"scaled_log_{easyad_ops}", lambda a, b: a * math.log(b),
                     lambda a, b: (log(b), a / b),
                     lambda a, b: ((0.0, 1 / b), (1 / b, -a / b ** 2)))


@pytest.mark.parametrize("easyad_ops", [False, True])
def test_two_argument_operations_in_taylor_and_nested_modes(easyad_ops):
    op = _scaled_log(easyad_ops)
    expr = _s * sympy.log(_s ** 2 + 1)
    order = 4 if easyad_ops else 2
    want = [float(sympy.diff(expr, _s, k).subs(_s, 2.0)) for k in range(order + 1)]
    np.testing.assert_allclose(ad.taylor(lambda t: op(t, t * t + 1), 2.0, order), want,
                               rtol=1e-13)
    # the mixed partial d2/da db = 1/b, and d2/db2 = -a/b^2, through a Trace of Traces
    a = ad.Trace(ad.Trace(2.0, 0.0), 1.0)
    b = ad.Trace(ad.Trace(3.0, 1.0), 0.0)
    assert op(a, b).derivative.derivative == pytest.approx(1 / 3.0, rel=1e-15)
    b2 = ad.Trace(ad.Trace(3.0, 1.0), 1.0)
    assert op(2.0, b2).derivative.derivative == pytest.approx(-2.0 / 9.0, rel=1e-15)
    lst = ad.WengertList()                             # Trace of Record: H v, v = (0, 1)
    ra, rb = lst.variable(2.0), lst.variable(3.0)
    g = op(ad.Trace(ra, 0.0), ad.Trace(rb, 1.0)).derivative
    d = g.derivatives()
    assert (d[ra], d[rb]) == (pytest.approx(1 / 3.0), pytest.approx(-2.0 / 9.0))


def test_a_taylor_series_does_not_mix_with_other_modes():
    op = _scaled_log(False)
    with pytest.raises(TypeError, match="scaled_log_False.*Taylor.*does not mix"):
        op(ad.Taylor.variable(1.0, 2), ad.Trace.variable(1.0))


def test_sqrt_at_zero_has_no_series_past_its_first_derivative():
    # sqrt'(0) = +inf in every mode (docs/conventions.md); higher orders do not exist
    got = ad.taylor(ad.sqrt, 0.0, 3)
    assert got[0] == 0.0 and got[1] == math.inf and np.isnan(got[2:]).all()
    assert ad.sqrt(ad.Trace.variable(0.0)).derivative == got[1]
    lst = ad.WengertList()
    x = lst.variable(0.0)
    assert ad.sqrt(x).derivatives()[x] == got[1]
    # away from 0 the series is the true one: sqrt(1 + s) = 1 + s/2 - s^2/8 + s^3/16
    np.testing.assert_allclose(ad.taylor(ad.sqrt, 1.0, 3), [1.0, 0.5, -0.25, 0.375],
                               rtol=1e-15)


def _softplus(t):
    return math.log1p(math.exp(t))


def _softplus_d(t):
    return 1 / (1 + math.exp(-t))


def _softplus_d2(t):
    return math.exp(-t) / (1 + math.exp(-t)) ** 2


SOFTPLUS = ad.define("softplus_pickled", _softplus, _softplus_d, _softplus_d2)


def test_a_tape_with_a_derived_operation_pickles():
    # a Trace of Records puts softplus' (the derivative, an operation of its own) on the
    # tape: it pickles as "the derivative of SOFTPLUS", so the copy sweeps the same
    import pickle
    lst = ad.WengertList()
    a = lst.variable(X0)
    g = SOFTPLUS(ad.Trace(a, 1.0)).derivative
    lst2, g2, a2 = pickle.loads(pickle.dumps((lst, g, a)))
    assert g2.derivatives()[a2] == pytest.approx(D[2], rel=1e-14)
    assert g2.derivatives()[a2] == g.derivatives()[a]


def test_a_scalar_operation_on_a_tensor_points_to_array_operations():
    lst = ad.WengertList()
    t = ad.Tensor.variable(np.array([0.1, 0.2]), lst)
    with pytest.raises(TypeError, match=r"softplus_pickled\(\) takes numbers.*ArrayPrimitive"):
        SOFTPLUS(t)
    one = ad.Tensor.variable(np.array([0.1]), lst)   # float() would read it: refused too
    with pytest.raises(TypeError, match="ArrayPrimitive"):
        SOFTPLUS(one)
    with pytest.raises(TypeError, match="got str"):
        SOFTPLUS("0.1")
    assert len(lst) == 2                     # nothing recorded by the failed calls
    assert SOFTPLUS(np.float32(0.5)) == SOFTPLUS(np.array(0.5)) == _softplus(0.5)
