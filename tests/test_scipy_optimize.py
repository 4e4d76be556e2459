"""ad.scipy end to end (easyad/scipy/__init__.py): minimize, least_squares and
solve_ivp's jac, each against SciPy run with finite-difference derivatives and against
known optima, and the derivatives handed to SciPy against hand-derived formulas."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.integrate
import scipy.optimize

import easyad as ad


def rosen(x):
    return (1.0 - x[0]) ** 2 + 100.0 * (x[1] - x[0] ** 2) ** 2


def rosen_grad(x):     # by hand
    return np.array([-2.0 * (1.0 - x[0]) - 400.0 * x[0] * (x[1] - x[0] ** 2),
                     200.0 * (x[1] - x[0] ** 2)])


@pytest.mark.parametrize("method", ["BFGS", "L-BFGS-B", "CG", "Newton-CG", "trust-ncg",
                                    "trust-krylov", "trust-exact", "dogleg", "SLSQP"])
def test_minimize_finds_rosenbrocks_minimum(method):
    x0 = [-1.2, 1.0] if method != "dogleg" else [0.9, 0.8]   # dogleg: a convex start
    res = ad.scipy.minimize(rosen, x0, method=method, tol=1e-10, options={"maxiter": 500})
    assert res.fun < 1e-12, (res.message, res.fun)    # (some stop at maxiter, there)
    np.testing.assert_allclose(res.x, [1.0, 1.0], atol=1e-5)


def test_minimize_agrees_with_scipy_finite_differences_and_costs_fewer_calls():
    # a smooth problem with a unique minimum: both runs stop at it
    a = np.array([1.0, -2.0, 0.5, 3.0])

    def f(x):
        return np.sum(ad.logaddexp(x, a) ** 2) + 0.5 * np.sum(x * x)
    ours = ad.scipy.minimize(f, np.zeros(4), method="BFGS", options={"gtol": 1e-10})
    ref = scipy.optimize.minimize(lambda x: float(f(x)), np.zeros(4), method="BFGS",
                                  options={"gtol": 1e-7})
    np.testing.assert_allclose(ours.x, ref.x, atol=1e-6)
    assert ours.nfev < ref.nfev          # no (n + 1) calls per gradient
    # first-order condition by hand: x + 2 logaddexp(x, a) expit(x - a) = 0
    lae = np.logaddexp(ours.x, a)
    np.testing.assert_allclose(ours.x + 2 * lae / (1 + np.exp(a - ours.x)), 0, atol=1e-9)


def test_minimize_hessian_and_hvp_are_the_recorded_ones():
    seen = {}

    def spy(name, orig):
        def wrapped(*args, **kw):
            seen[name] = kw.get("hess") or kw.get("hessp")
            seen["fun"] = args[0]
            assert kw["jac"] is True             # value and gradient in one sweep
            return orig(*args, **kw)
        return wrapped
    x = np.array([0.3, -0.7])
    H = np.array([[2 - 400 * (x[1] - 3 * x[0] ** 2), -400 * x[0]], [-400 * x[0], 200.0]])
    orig = scipy.optimize.minimize
    try:
        scipy.optimize.minimize = spy("m", orig)
        ad.scipy.minimize(rosen, x, method="trust-exact")
        np.testing.assert_allclose(seen["m"](x), H, rtol=1e-13)
        value, gradient = seen["fun"](x)
        assert value == rosen(x)
        np.testing.assert_allclose(gradient, rosen_grad(x), rtol=1e-14)
        ad.scipy.minimize(rosen, x, method="Newton-CG")
        v = np.array([1.5, -0.25])
        np.testing.assert_allclose(seen["m"](x, v), H @ v, rtol=1e-13)
    finally:
        scipy.optimize.minimize = orig


def test_minimize_shapes_args_constraints_and_branches():
    # x0 of shape (2, 2), extra args, a branch (abs via a comparison: recorded again)
    target = np.array([[1.0, -2.0], [0.5, 4.0]])

    def f(x, t, w):
        total = 0.0
        for xi, ti in zip(x.ravel(), t.ravel()):
            d = xi - ti
            total = total + w * (d if d > 0 else -d) ** 2
        return total
    res = ad.scipy.minimize(f, np.zeros((2, 2)), args=(target, 3.0), method="BFGS")
    assert res.x.shape == (2, 2)
    np.testing.assert_allclose(res.x, target, atol=1e-6)
    # an equality constraint x0 + x1 = 1: minimum of x0^2 + 2 x1^2 at (2/3, 1/3), by hand
    con = {"type": "eq", "fun": lambda x: x[0] + x[1] - 1.0}
    res = ad.scipy.minimize(lambda x: x[0] ** 2 + 2 * x[1] ** 2, [0.0, 0.0],
                            method="SLSQP", constraints=[con], tol=1e-12)
    np.testing.assert_allclose(res.x, [2 / 3, 1 / 3], atol=1e-8)
    res = ad.scipy.minimize(lambda x: x[0] ** 2 + 2 * x[1] ** 2, [0.0, 0.0],
                            method="trust-constr", constraints=con)
    np.testing.assert_allclose(res.x, [2 / 3, 1 / 3], atol=1e-6)


def test_minimize_refuses_what_it_computes_and_bad_functions():
    with pytest.raises(TypeError, match="computes jac itself"):
        ad.scipy.minimize(rosen, [0.0, 0.0], jac=lambda x: x)
    with pytest.raises(ValueError, match="scalar function"):
        ad.scipy.minimize(lambda x: x * 2.0, [1.0, 2.0])
    with pytest.raises(ValueError, match="x0 is empty"):
        ad.scipy.minimize(rosen, [])


def test_least_squares_fits_an_exponential_against_scipy():
    rng = np.random.default_rng(3)
    t = np.linspace(0.0, 2.0, 30)
    y = 2.5 * np.exp(-1.3 * t) + 0.4 + 0.01 * rng.standard_normal(30)

    def residual(p):
        return p[0] * ad.exp(-p[1] * t) + p[2] - y
    ours = ad.scipy.least_squares(residual, [1.0, 1.0, 0.0])
    ref = scipy.optimize.least_squares(lambda p: p[0] * np.exp(-p[1] * t) + p[2] - y,
                                       [1.0, 1.0, 0.0])          # finite differences
    np.testing.assert_allclose(ours.x, ref.x, rtol=1e-6)
    # the Jacobian at the optimum, by hand
    p = ours.x
    J = np.column_stack([np.exp(-p[1] * t), -p[0] * t * np.exp(-p[1] * t), np.ones(30)])
    np.testing.assert_allclose(ours.jac, J, rtol=1e-13, atol=1e-15)
    with pytest.raises(TypeError, match="computes jac itself"):
        ad.scipy.least_squares(residual, [1.0, 1.0, 0.0], jac="3-point")


def van_der_pol(t, y, mu=50.0):
    return np.array([y[1], mu * (1.0 - y[0] ** 2) * y[1] - y[0]])


@pytest.mark.parametrize("method", ["Radau", "BDF", "LSODA"])
def test_solve_ivp_jacobian_by_argnums(method):
    jac = ad.scipy.ode_jacobian(van_der_pol)
    y = np.array([1.5, -0.3])
    mu = 50.0
    np.testing.assert_allclose(jac(0.0, y), [[0.0, 1.0],
                                             [-2 * mu * y[0] * y[1] - 1.0,
                                              mu * (1 - y[0] ** 2)]], rtol=1e-14)
    # the same pattern written out: ad.jacobian(f, argnums=1)
    np.testing.assert_allclose(np.asarray(ad.jacobian(van_der_pol, argnums=1)(0.0, y)),
                               jac(0.0, y))
    ours = scipy.integrate.solve_ivp(van_der_pol, (0.0, 20.0), [2.0, 0.0], method=method,
                                     jac=jac, rtol=1e-8, atol=1e-10)
    ref = scipy.integrate.solve_ivp(van_der_pol, (0.0, 20.0), [2.0, 0.0], method=method,
                                    rtol=1e-8, atol=1e-10)   # finite-difference jac
    assert ours.success and ref.success
    np.testing.assert_allclose(ours.y[:, -1], ref.y[:, -1], rtol=1e-4, atol=1e-6)
    assert ours.njev > 0


def test_the_scientific_example_runs(capsys):
    # examples/scientific.py (make examples): an ODE fit by least_squares through a
    # Runge-Kutta in Python, a gamma MLE with the Hessian against the Fisher information
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "scientific.py"
    spec = importlib.util.spec_from_file_location("example_scientific", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--seed", "4"])
    out = capsys.readouterr().out
    assert "logistic ODE fit" in out and "gamma MLE" in out
