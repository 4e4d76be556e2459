"""Implicit differentiation (easyad/transforms/implicit*.py): ad.custom_root,
ad.fixed_point, ad.linalg.cg and ad.linalg.gmres.

References, all independent of the implicit machinery: closed forms (sqrt, the cubic,
ridge regression's argmin, A^-1 and its derivative), central differences of the solved
value, the derivative of the UNROLLED Newton solver (easyad through every iteration,
dense ad.linalg.solve), and torch.func (jacrev of the residual in torch, then the
implicit function theorem with torch.linalg.solve).
"""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad

N = 12
H = 1.0 / (N + 1)
# the 1-d Laplacian with Dirichlet ends, scaled: -u'' ~ L u
LAP = (2 * np.eye(N) - np.eye(N, k=1) - np.eye(N, k=-1)) / H**2
GRID = np.linspace(H, 1 - H, N)


def reaction(u, k, s):
    """The steady state of u_t = u'' - k u^3 + s: residual -u'' + k u^3 - s."""
    return LAP @ u + k * u**3 - s


def steady(k, s, **options):
    return ad.custom_root(reaction, np.zeros(N), args=(k, s), **options)


def loss(k, s, **options):
    u = steady(k, s, **options)
    return ad.sum(u * u * GRID)


def unrolled_loss(k, s, steps=12):
    """The same loss with Newton's iterations differentiated (the derivative unrolled)."""
    u = 0.0 * s
    for _ in range(steps):
        jac = LAP + ad.diag(3.0 * k * u**2)
        u = u - ad.linalg.solve(jac, reaction(u, k, s))
    return ad.sum(u * u * GRID)


def central(f, x, h=1e-6):
    x = np.asarray(x, dtype=float)
    out = np.zeros(x.shape)
    for i in np.ndindex(x.shape):
        e = np.zeros(x.shape)
        e[i] = h
        out[i] = (f(x + e) - f(x - e)) / (2 * h)
    return out


K0 = 3.0
S0 = 400.0 * np.sin(np.pi * GRID) + 50.0 * GRID


# ---- scalars and closed forms ----

def sqrt(a):
    return ad.custom_root(lambda x, a: x * x - a, 1.0, args=(a,))


def test_scalar_root_in_both_modes():
    assert sqrt(2.0) == pytest.approx(np.sqrt(2.0), abs=1e-14)
    assert ad.grad(sqrt)(2.0) == pytest.approx(0.5 / np.sqrt(2.0), abs=1e-14)
    assert ad.derivative(sqrt)(2.0) == pytest.approx(0.5 / np.sqrt(2.0), abs=1e-14)
    lst = ad.WengertList()
    a = lst.variable(3.0)
    assert sqrt(a).derivatives()[a] == pytest.approx(0.5 / np.sqrt(3.0), abs=1e-14)


@pytest.mark.parametrize("tangent_solve", ["gmres", "cg", "dense"])
def test_vector_root_jacobian_both_modes(tangent_solve):
    # x^3 + x = t elementwise: dx/dt = diag(1 / (3x^2 + 1)), J symmetric positive
    t = np.array([1.0, 2.0, -3.0, 0.5])

    def f(t):
        return ad.custom_root(lambda x, t: x**3 + x - t, np.ones(4), args=(t,),
                              tangent_solve=tangent_solve)
    x = f(t)
    np.testing.assert_allclose(x**3 + x, t, atol=1e-12)
    want = np.diag(1 / (3 * x**2 + 1))
    np.testing.assert_allclose(ad.jacobian(f)(t), want, atol=1e-12)
    np.testing.assert_allclose(ad.jacobian(f, mode="forward")(t), want, atol=1e-12)
    v = np.array([1.0, -2.0, 0.5, 3.0])
    np.testing.assert_allclose(ad.jvp(f, t, v)[1], want @ v, atol=1e-12)
    np.testing.assert_allclose(ad.vjp(f, t, v)[1], want.T @ v, atol=1e-12)


# ---- the steady state: finite differences, the unrolled solver, torch ----

def test_steady_state_against_finite_differences_and_the_unrolled_solver():
    dk, ds = ad.grad(loss, argnums=(0, 1))(K0, S0)
    fd_k = central(lambda k: loss(float(k), S0), K0)
    fd_s = central(lambda s: loss(K0, s), S0, h=1e-4)
    assert dk == pytest.approx(float(fd_k), rel=1e-6)
    np.testing.assert_allclose(ds, fd_s, rtol=1e-5, atol=1e-9)
    uk, us = ad.grad(unrolled_loss, argnums=(0, 1))(K0, S0)
    assert dk == pytest.approx(uk, rel=1e-9)
    np.testing.assert_allclose(ds, us, rtol=1e-9, atol=1e-14)
    # forward mode agrees (one tangent solve per direction)
    tangent = ad.jvp(lambda s: loss(K0, s), S0, np.ones(N))[1]
    assert tangent == pytest.approx(float(np.sum(ds)), rel=1e-9)


def test_steady_state_against_torch_func():
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("torch.func")
    u = steady(K0, S0)
    lap = torch.tensor(LAP)

    def residual(u, k, s):
        return lap @ u + k * u**3 - s
    args = tuple(torch.tensor(v, dtype=torch.float64) for v in (u, K0, S0))
    ju, jk, js = tf.jacrev(residual, argnums=(0, 1, 2))(*args)
    du_dk = -torch.linalg.solve(ju, jk).numpy()
    du_ds = -torch.linalg.solve(ju, js).numpy()
    np.testing.assert_allclose(ad.jacobian(lambda k: steady(k, S0))(K0), du_dk, rtol=1e-9)
    np.testing.assert_allclose(ad.jacobian(lambda s: steady(K0, s))(S0), du_ds, rtol=1e-9,
                               atol=1e-15)
    np.testing.assert_allclose(ad.jacobian(lambda s: steady(K0, s), mode="forward")(S0),
                               du_ds, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("tangent_solve", ["cg", "dense", "user"])
def test_steady_state_tangent_solves_and_a_matrix_free_solver(tangent_solve):
    # J = LAP + diag(3 k u^2) is symmetric positive definite: CG applies
    calls = []

    def user(matvec, b):
        calls.append(1)
        return ad.linalg.cg(lambda v: matvec(v), b)

    def newton_cg(residual, u):
        # a matrix-free Newton: each step a CG solve on jvps of the residual
        for _ in range(30):
            r = residual(u)
            if np.linalg.norm(r) < 1e-11 * np.linalg.norm(S0):
                return u
            u = u - ad.linalg.cg(lambda v: ad.jvp(residual, u, v)[1], r)
        raise AssertionError("no convergence")
    solve = user if tangent_solve == "user" else tangent_solve
    g = ad.grad(lambda s: loss(K0, s, solve=newton_cg, tangent_solve=solve))(S0)
    np.testing.assert_allclose(g, ad.grad(lambda s: loss(K0, s))(S0), rtol=1e-8)
    assert calls or tangent_solve != "user"


def test_recorded_and_tensor_code():
    s0 = ad.Tensor.variable(S0, ad.WengertList())
    value = loss(K0, s0)
    np.testing.assert_allclose(value.derivatives()[s0], ad.grad(lambda s: loss(K0, s))(S0),
                               rtol=1e-12)
    F = ad.record(lambda s: loss(K0, s), S0, tensor=True)
    s1 = 1.5 * S0
    assert F(s1) == pytest.approx(loss(K0, s1), rel=1e-12)
    np.testing.assert_allclose(F.gradient(s1), central(lambda s: loss(K0, s), s1, h=1e-4),
                               rtol=1e-5, atol=1e-9)


def test_number_parameters_scaling_arrays_in_both_modes():
    # a * src with a a number: a Record/Trace times an array would be an object array;
    # the derivative's recording gives numbers as 0-d tensors instead
    src = np.array([1.0, 2.0, 3.0])

    def f(p):
        return ad.custom_root(lambda x, k, a: x**3 + k * x - a * src, np.ones(3),
                              args=(p[0], p[1]))
    p = np.array([2.0, 1.5])
    x = f(p)
    want = -np.linalg.solve(np.diag(3 * x**2 + 2.0), np.stack([x, -src], 1))
    np.testing.assert_allclose(ad.jacobian(f)(p), want, atol=1e-12)
    np.testing.assert_allclose(ad.jacobian(f, mode="forward")(p), want, atol=1e-12)


def test_tensors_on_every_device(device):
    # the root of a Tensor on a device is a Tensor there; its gradient read on the host
    t0 = np.array([1.0, 2.0, 3.0])
    t = ad.Tensor.variable(t0, ad.WengertList(), device=device)
    x = ad.custom_root(lambda x, t: x**3 + x - t, np.ones(3), args=(t,))
    assert x.device == t.device
    np.testing.assert_allclose(x.value**3 + x.value, t0, atol=1e-12)
    np.testing.assert_allclose(ad.sum(x * x).derivatives()[t],
                               2 * x.value / (3 * x.value**2 + 1), atol=1e-12)


def test_parameters_as_a_structure():
    def f(p):
        return ad.custom_root(lambda x, p: p["a"] * x + p["b"][0] * x**3 - p["b"][1], 1.0,
                              args=(p,))
    p = {"a": 2.0, "b": (1.0, 3.0)}
    x = f(p)                                    # x = 1: 2 + 1 - 3
    assert x == pytest.approx(1.0, abs=1e-13)
    d = ad.grad(f)(p)
    jx = p["a"] + 3 * p["b"][0] * x**2        # df/dx = 5
    assert d["a"] == pytest.approx(-x / jx)
    assert d["b"][0] == pytest.approx(-x**3 / jx)
    assert d["b"][1] == pytest.approx(1 / jx)


# ---- an inner optimisation: argmin as the root of the gradient ----

def test_argmin_of_ridge_regression_against_its_closed_form(rng):
    a = rng.normal(size=(15, 5))
    y = rng.normal(size=15)

    def objective(w, lam):
        r = a @ w - y
        return 0.5 * ad.sum(r * r) + 0.5 * lam * ad.sum(w * w)

    def argmin(lam):
        return ad.custom_root(ad.grad(objective), np.zeros(5), args=(lam,),
                              tangent_solve="cg")
    lam = 0.7
    m = a.T @ a + lam * np.eye(5)
    w = np.linalg.solve(m, a.T @ y)
    np.testing.assert_allclose(argmin(lam), w, atol=1e-12)
    np.testing.assert_allclose(ad.jacobian(argmin)(lam), -np.linalg.solve(m, w), atol=1e-12)


def test_argmin_of_logistic_regression_against_finite_differences(rng):
    a = rng.normal(size=(30, 3))
    labels = (rng.random(30) < 0.5).astype(float)

    def objective(w, lam):
        z = a @ w
        return ad.sum(ad.log(1 + ad.exp(z)) - labels * z) + 0.5 * lam * ad.sum(w * w)

    def validation(lam):
        w = ad.custom_root(ad.grad(objective), np.zeros(3), args=(lam,), tangent_solve="cg")
        return ad.sum(w * np.array([1.0, -2.0, 0.5]))
    d = ad.grad(validation)(0.3)
    assert d == pytest.approx(float(central(lambda lam: validation(float(lam)), 0.3)),
                              rel=1e-6)


# ---- fixed points ----

def test_fixed_point_scalar_closed_form():
    x = lambda a: ad.fixed_point(lambda x, a: ad.cos(a * x), 0.5, args=(a,))  # noqa: E731
    s = x(1.0)
    assert s == pytest.approx(np.cos(s), abs=1e-12)
    want = -s * np.sin(s) / (1 + np.sin(s))
    assert ad.grad(x)(1.0) == pytest.approx(want, abs=1e-12)
    assert ad.derivative(x)(1.0) == pytest.approx(want, abs=1e-12)


def test_fixed_point_of_a_vector_contraction(rng):
    w = rng.normal(size=(6, 6)) * 0.2

    def g(x, w, b):
        return ad.tanh(w @ x + b)

    def f(b):
        return ad.sum(ad.fixed_point(g, np.zeros(6), args=(w, b)) * np.arange(6.0))
    b = rng.normal(size=6)
    np.testing.assert_allclose(ad.grad(f)(b), central(f, b), rtol=1e-6, atol=1e-9)
    dw = ad.grad(lambda w: ad.sum(ad.fixed_point(g, np.zeros(6), args=(w, b))))(w)
    fd = central(lambda w: float(np.sum(ad.fixed_point(g, np.zeros(6), args=(w, b)))), w)
    np.testing.assert_allclose(dw, fd, rtol=1e-6, atol=1e-9)


# ---- matrix-free linear solves ----

def test_cg_and_gmres_derivatives_in_b_and_the_operator(rng):
    m = rng.normal(size=(7, 7))
    spd = m @ m.T + 7 * np.eye(7)
    nonsym = m + 7 * np.eye(7)
    b = rng.normal(size=7)
    weights = rng.normal(size=7)
    for solver, a in ((ad.linalg.cg, spd), (ad.linalg.gmres, nonsym)):
        def f(a, b, solver=solver):
            return ad.sum(weights * solver(lambda v, a: a @ v, b, (a,)))
        x = np.linalg.solve(a, b)
        np.testing.assert_allclose(solver(lambda v, a: a @ v, b, (a,)), x, rtol=1e-9)
        da, db = ad.grad(f, argnums=(0, 1))(a, b)
        lam = np.linalg.solve(a.T, weights)       # d(w.x)/db = A^-T w, d/dA = -lam x^T
        np.testing.assert_allclose(db, lam, rtol=1e-8)
        np.testing.assert_allclose(da, -np.outer(lam, x), rtol=1e-8, atol=1e-14)
        v = rng.normal(size=7)
        tangent = ad.jvp(lambda b: f(a, b), b, v)[1]
        assert tangent == pytest.approx(float(lam @ v), rel=1e-8)


def test_gmres_matches_dense_solve_derivative_through_a_parameterised_operator():
    def matvec(v, s):                    # tridiagonal, not symmetric, entries moved by s
        return 4.0 * v + s[0] * ad.concatenate([v[1:], np.zeros(1)]) \
            - s[1] * ad.concatenate([np.zeros(1), v[:-1]])
    n = 9
    b = np.linspace(1.0, 2.0, n)
    s = np.array([0.7, -1.3])
    dense = lambda s: 4.0 * np.eye(n) + s[0] * np.eye(n, k=1) - s[1] * np.eye(n, k=-1)  # noqa

    def f(s):
        return ad.sum(ad.linalg.gmres(matvec, b, (s,)) ** 2)

    x = np.linalg.solve(dense(s), b)
    assert f(s) == pytest.approx(float(np.sum(x**2)), rel=1e-9)
    # d/ds_j sum x^2 = 2 x . dx/ds_j, dx/ds_j = -A^-1 (dA/ds_j) x
    want = [2 * x @ -np.linalg.solve(dense(s), da @ x)
            for da in (np.eye(n, k=1), -np.eye(n, k=-1))]
    np.testing.assert_allclose(ad.grad(f)(s), want, rtol=1e-8)
    np.testing.assert_allclose(ad.jacobian(f, mode="forward")(s), want, rtol=1e-8)


# ---- errors: nothing silently wrong ----

def test_non_convergence_raises():
    with pytest.raises(ad.ConvergenceError, match="fixed_point"):
        ad.fixed_point(lambda x: 2.0 * x + 1.0, 0.0)
    with pytest.raises(ad.ConvergenceError, match=r"\|A x - b\|"):
        ad.linalg.cg(lambda v: LAP @ v, S0, maxiter=2)
    with pytest.raises(ad.ConvergenceError, match="gmres"):
        ad.linalg.gmres(lambda v: LAP @ v, S0, restart=2, maxiter=1)
    indefinite = np.diag([1.0, -1.0, 2.0, -3.0])
    with pytest.raises(ad.ConvergenceError, match="symmetric positive definite"):
        ad.linalg.cg(lambda v: indefinite @ v, np.ones(4), maxiter=3)
    with pytest.raises(ad.ConvergenceError, match="newton"):
        ad.custom_root(lambda x: x * x + 1.0, 1.0)              # no real root
    # a solver that returns something that is no root: refused, no wrong derivative
    with pytest.raises(ad.ConvergenceError, match="not a root"):
        ad.grad(lambda a: ad.custom_root(lambda x, a: x * x - a, 1.0, args=(a,),
                                         solve=lambda r, x0: x0))(2.0)
    # the derivative's own solve not converging
    with pytest.raises(ad.ConvergenceError, match="derivative"):
        ad.grad(lambda s: loss(K0, s, maxiter=1, tangent_solve="cg"))(S0)


def test_closed_over_differentiated_values_raise():
    with pytest.raises(TypeError, match="args="):
        ad.grad(lambda a: ad.custom_root(lambda x: x * x - a, 1.0))(2.0)
    with pytest.raises(TypeError, match="args="):
        ad.derivative(lambda a: ad.fixed_point(lambda x: ad.cos(a * x), 0.5))(1.0)
    with pytest.raises(TypeError, match="args="):
        ad.grad(lambda b: ad.sum(ad.linalg.cg(lambda v: v * b, np.ones(3))))(np.ones(3) * 2)
    # a closed-over constant is fine
    c = 2.0
    assert ad.custom_root(lambda x: x * x - c, 1.0) == pytest.approx(np.sqrt(2.0))


def test_second_order_by_reverse_over_reverse():
    # sqrt'' = -a^(-3/2) / 4
    assert ad.hessian(sqrt)(2.0) == pytest.approx(-0.25 * 2.0**-1.5, abs=1e-14)
    h = ad.jacobian(ad.grad(lambda a: sqrt(a[0]) * a[1]), mode="reverse")(np.array([2.0, 1.0]))
    np.testing.assert_allclose(h, [[-0.25 * 2.0**-1.5, 0.5 / np.sqrt(2.0)],
                                   [0.5 / np.sqrt(2.0), 0.0]], atol=1e-14)
    # the steady state's Hessian in the source: the unrolled solver's, and an HVP
    hess = ad.hessian(lambda s: loss(K0, s))(S0)
    unrolled = ad.hessian(lambda s: unrolled_loss(K0, s))(S0)
    np.testing.assert_allclose(hess, unrolled, rtol=1e-8, atol=1e-12 * np.abs(unrolled).max())
    v = np.linspace(-1.0, 1.0, N)
    np.testing.assert_allclose(ad.hvp(lambda s: loss(K0, s), S0, v), unrolled @ v,
                               rtol=1e-8, atol=1e-12 * np.abs(unrolled @ v).max())
    # numbers and arrays of parameters together, against differences of the gradient
    p0 = np.array([K0, 1.0])

    def scaled(p):
        return loss(p[0], S0 * p[1])
    fd = np.array([(ad.grad(scaled)(p0 + e) - ad.grad(scaled)(p0 - e)) / 2e-5
                   for e in np.eye(2) * 1e-5])
    np.testing.assert_allclose(ad.hessian(scaled)(p0), fd, rtol=1e-6)
    # fixed points and the linear solves
    x = lambda a: ad.fixed_point(lambda x, a: ad.cos(a * x), 0.5, args=(a,))  # noqa: E731
    fd = (ad.grad(x)(1.0 + 1e-5) - ad.grad(x)(1.0 - 1e-5)) / 2e-5
    assert ad.hessian(x)(1.0) == pytest.approx(fd, rel=1e-7)
    k = np.array([[4.0, 1.0], [1.0, 3.0]])
    for solver in (ad.linalg.cg, ad.linalg.gmres):
        def f(c, solver=solver):
            return ad.sum(solver(lambda v, c: k @ v + c * v, np.array([1.0, 2.0]), (c,)) ** 2)
        # sum x^2 with x = (K + c)^-1 b: d2/dc2 = 6 x^T (K + c)^-2 x... by eigenvalues
        lam, q = np.linalg.eigh(k)
        y = q.T @ np.array([1.0, 2.0])
        want = float(np.sum(6 * y**2 / (lam + 0.5) ** 4))
        assert ad.hessian(f)(0.5) == pytest.approx(want, rel=1e-9)


def test_unsupported_orders_raise_a_clear_error():
    for unsupported in (lambda: ad.derivative(ad.derivative(sqrt))(2.0),
                        lambda: ad.jacobian(ad.grad(lambda a: sqrt(a[0]) * a[1]),
                                            mode="forward")(np.ones(2)),
                        lambda: ad.derivative(lambda a: ad.hessian(sqrt)(a))(2.0),
                        lambda: ad.grad(lambda a: ad.hessian(sqrt)(a))(2.0)):
        with pytest.raises(NotImplementedError, match="reverse over reverse"):
            unsupported()


def test_bad_arguments():
    with pytest.raises(ValueError, match="tangent_solve"):
        ad.custom_root(lambda x: x, 1.0, tangent_solve="lu")
    with pytest.raises(ValueError, match="x's shape"):
        ad.custom_root(lambda x: ad.sum(x), np.ones(3))
    with pytest.raises(TypeError, match="callable"):
        ad.linalg.cg(np.eye(3), np.ones(3))
    with pytest.raises(ValueError, match="b's shape"):
        ad.linalg.gmres(lambda v: v, np.ones(3), x0=np.ones(2))
