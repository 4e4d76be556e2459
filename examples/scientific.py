"""easyad's derivatives in SciPy (docs/scientific.md): three fits.

1. An ODE model's parameters by least squares: the logistic equation y' = r y (1 - y/K),
   integrated by a fixed-step Runge-Kutta written in Python (so easyad differentiates
   through it), fitted to data made by scipy's solve_ivp; ad.scipy.least_squares gets
   the Jacobian from one recording. The fit is checked against the true parameters and
   against scipy's least_squares with finite differences.
2. A maximum-likelihood fit of a gamma distribution with ad.scipy.minimize (trust-exact:
   the Hessian replayed), standard errors from the inverse Hessian, checked against the
   hand-derived Fisher information n [[polygamma(1, k), -1/b], [-1/b, k/b^2]].
3. Lotka-Volterra's four parameters by least squares on solve_ivp (Radau) itself: the
   forward sensitivity equations S' = f_y S + f_p are integrated beside the model, their
   right-hand side written with forward-mode Traces (one direction per parameter) and
   recorded once; solve_ivp gets the system from the replay and Radau's ``jac`` from the
   replayed Jacobian, least_squares the sensitivities as its ``jac``. Checked against the
   true parameters, the sensitivities against finite differences, and the fit against
   scipy's least_squares with finite differences.

    python examples/scientific.py [--seed N]
"""
from __future__ import annotations

import argparse

import numpy as np
import scipy.integrate
import scipy.optimize
import scipy.special as sp

import easyad as ad


def logistic_rk4(p, t, y0, steps=8):
    """y at the times t (equally spaced) by classical Runge-Kutta, on any easyad number."""
    r, K = p[0], p[1]

    def f(y):
        return r * y * (1.0 - y / K)
    h = (t[1] - t[0]) / steps
    y, out = y0, [y0]
    for _ in range(len(t) - 1):
        for _ in range(steps):
            k1 = f(y)
            k2 = f(y + 0.5 * h * k1)
            k3 = f(y + 0.5 * h * k2)
            k4 = f(y + h * k3)
            y = y + h / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        out.append(y)
    return np.array(out, dtype=object)


def ode_fit(rng):
    t = np.linspace(0.0, 10.0, 21)
    truth = (0.9, 5.0)
    clean = scipy.integrate.solve_ivp(lambda s, y: truth[0] * y * (1 - y / truth[1]),
                                      (0.0, 10.0), [0.2], t_eval=t, rtol=1e-10,
                                      atol=1e-12).y[0]
    data = clean + 0.01 * rng.standard_normal(t.size)

    def residual(p):
        return logistic_rk4(p, t, 0.2) - data
    ours = ad.scipy.least_squares(residual, [0.5, 3.0])
    fd = scipy.optimize.least_squares(lambda p: np.asarray(residual(p), dtype=float),
                                      [0.5, 3.0])          # finite differences
    assert np.allclose(ours.x, truth, rtol=2e-2), ours.x
    assert np.allclose(ours.x, fd.x, rtol=1e-5), (ours.x, fd.x)
    return ours, fd


def gamma_mle(rng, n=400):
    data = rng.gamma(shape=3.0, scale=1 / 2.0, size=n)
    total, logs = data.sum(), np.log(data).sum()

    def nll(p):
        k, b = p[0], p[1]
        return -(n * k * ad.log(b) - n * ad.gammaln(k) + (k - 1.0) * logs - b * total)
    fit = ad.scipy.minimize(nll, [1.0, 1.0], method="trust-exact", tol=1e-12)
    k, b = fit.x
    H = ad.hessian(nll)(fit.x)
    fisher = n * np.array([[sp.polygamma(1, k), -1 / b], [-1 / b, k / b ** 2]])
    assert np.allclose(H, fisher, rtol=1e-12), (H, fisher)
    # the score is 0 at the optimum: digamma(k) = log(b) + mean(log x), k / b = mean(x)
    assert np.isclose(sp.psi(k), np.log(b) + logs / n) and np.isclose(k / b, total / n)
    return fit, np.sqrt(np.diag(np.linalg.inv(H)))


SIGN = np.array([1.0, -1.0])


def lotka_volterra(y, p):
    """Prey and predators: x' = a x - b x y, y' = c x y - d y (p = a, b, c, d)."""
    return y * (SIGN * p[[0, 3]] - SIGN * p[[1, 2]] * y[::-1])


def sensitivity_system(w):
    """The model and its sensitivities S = dy/dp as one right-hand side of w = (y, S, p):
    column j of S' = f_y S + f_p is the tangent of f in the direction (S[:, j], e_j)."""
    y, S, p = w[:2], w[2:10].reshape(2, 4), w[10:]
    columns = []
    for j in range(4):
        yj = np.array([ad.Trace(y[i], S[i, j]) for i in range(2)], dtype=object)
        pj = np.array([ad.Trace(p[k], float(k == j)) for k in range(4)], dtype=object)
        columns.append([d.derivative for d in lotka_volterra(yj, pj)])
    return np.concatenate([lotka_volterra(y, p), np.array(columns, dtype=object).T.ravel()])


def lotka_volterra_fit(rng):
    t, y0, truth = np.linspace(0.0, 15.0, 31), np.array([2.0, 1.0]), np.array([1.0, 0.5, 0.3, 0.8])
    clean = scipy.integrate.solve_ivp(lambda s, y: lotka_volterra(y, truth), (0.0, 15.0), y0,
                                      t_eval=t, rtol=1e-10, atol=1e-12).y
    data = clean + 0.02 * rng.standard_normal(clean.shape)
    F = ad.record(sensitivity_system, np.concatenate([y0, np.zeros(8), truth]))

    solutions: dict = {}

    def solve(p):
        if tuple(p) not in solutions:        # residual and jac share one integration
            solutions.clear()
            sol = scipy.integrate.solve_ivp(
                lambda s, z: F(np.concatenate([z, p])), (0.0, 15.0),
                np.concatenate([y0, np.zeros(8)]), method="Radau", t_eval=t, rtol=1e-8,
                atol=1e-10, jac=lambda s, z: F.jacobian(np.concatenate([z, p]))[:, :10])
            assert sol.success, sol.message
            solutions[tuple(p)] = sol.y
        return solutions[tuple(p)]

    def residual(p):
        return (solve(p)[:2] - data).ravel()

    def jacobian(p):         # rows (species, time), columns the parameters
        return np.transpose(solve(p)[2:].reshape(2, 4, -1), (0, 2, 1)).reshape(-1, 4)

    start = [0.8, 0.4, 0.4, 0.6]
    ours = scipy.optimize.least_squares(residual, start, jac=jacobian)
    plain = scipy.optimize.least_squares(
        lambda p: (scipy.integrate.solve_ivp(lambda s, y: lotka_volterra(y, p), (0.0, 15.0),
                                             y0, t_eval=t, rtol=1e-8, atol=1e-10).y
                   - data).ravel(), start)                     # finite differences
    p, h = np.array([0.9, 0.45, 0.35, 0.7]), 1e-6
    fd = np.array([(residual(p + h * e) - residual(p - h * e)) / (2 * h) for e in np.eye(4)]).T
    J = jacobian(p)
    assert np.abs(J - fd).max() <= 1e-4 * np.abs(J).max(), np.abs(J - fd).max()
    assert np.allclose(ours.x, truth, rtol=2e-2), ours.x
    assert np.allclose(ours.x, plain.x, rtol=1e-5), (ours.x, plain.x)
    return ours, plain


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    ours, fd = ode_fit(rng)
    print(f"logistic ODE fit: r = {ours.x[0]:.4f}, K = {ours.x[1]:.4f} (true 0.9, 5.0), "
          f"finite differences: r = {fd.x[0]:.4f}, K = {fd.x[1]:.4f}")
    fit, stderr = gamma_mle(rng)
    print(f"gamma MLE: shape = {fit.x[0]:.3f} +- {stderr[0]:.3f}, "
          f"rate = {fit.x[1]:.3f} +- {stderr[1]:.3f} (true 3, 2)")
    ours, plain = lotka_volterra_fit(rng)
    print("Lotka-Volterra fit on solve_ivp (Radau) with recorded sensitivities: "
          f"a, b, c, d = {np.array2string(ours.x, precision=4)} (true 1, 0.5, 0.3, 0.8) in "
          f"{ours.nfev} integrations; finite differences: {np.array2string(plain.x, precision=4)}"
          f" in {plain.nfev} + {4 * plain.njev} integrations")


if __name__ == "__main__":
    main()
