"""The functional API (grad, value_and_grad, jacobian, jvp, vjp, derivative) and
check_gradients, against independent references:

- hand-derived gradients and Jacobians of classic test problems (Rosenbrock, Powell
  singular, Wood, Beale, helical valley; More, Garbow & Hillstrom 1981), written out below
  in plain numpy;
- sympy's symbolic derivatives;
- central finite differences (scipy.optimize.approx_fprime);
- and, for scipy embedding, BFGS reaching Rosenbrock's known minimum.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.optimize
import sympy as sp

import easyad as ad

SQRT5, SQRT10 = math.sqrt(5.0), math.sqrt(10.0)


# ---- the test problems: f written once (runs on floats, Traces and Records) ---------------
# ---- and its derivatives derived by hand ---------------------------------------------------

def rosenbrock(x):
    return np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def rosenbrock_grad(x):
    g = np.zeros_like(x)
    g[:-1] = -400.0 * x[:-1] * (x[1:] - x[:-1] ** 2) - 2.0 * (1.0 - x[:-1])
    g[1:] += 200.0 * (x[1:] - x[:-1] ** 2)
    return g


def wood(x):
    x1, x2, x3, x4 = x
    return (100 * (x2 - x1 ** 2) ** 2 + (1 - x1) ** 2 + 90 * (x4 - x3 ** 2) ** 2 + (1 - x3) ** 2
            + 10.1 * ((x2 - 1) ** 2 + (x4 - 1) ** 2) + 19.8 * (x2 - 1) * (x4 - 1))


def wood_grad(x):
    x1, x2, x3, x4 = x
    return np.array([
        -400 * x1 * (x2 - x1 ** 2) - 2 * (1 - x1),
        200 * (x2 - x1 ** 2) + 20.2 * (x2 - 1) + 19.8 * (x4 - 1),
        -360 * x3 * (x4 - x3 ** 2) - 2 * (1 - x3),
        180 * (x4 - x3 ** 2) + 20.2 * (x4 - 1) + 19.8 * (x2 - 1),
    ])


def powell(x):
    x1, x2, x3, x4 = x
    return [x1 + 10 * x2, SQRT5 * (x3 - x4), (x2 - 2 * x3) ** 2, SQRT10 * (x1 - x4) ** 2]


def powell_jac(x):
    x1, x2, x3, x4 = x
    a, b = 2 * (x2 - 2 * x3), 2 * SQRT10 * (x1 - x4)
    return np.array([[1, 10, 0, 0], [0, 0, SQRT5, -SQRT5], [0, a, -2 * a, 0], [b, 0, 0, -b]],
                    dtype=float)


BEALE_Y = (1.5, 2.25, 2.625)


def beale(x):
    return [y - x[0] * (1 - x[1] ** i) for i, y in enumerate(BEALE_Y, 1)]


def beale_jac(x):
    return np.array([[-(1 - x[1] ** i), x[0] * i * x[1] ** (i - 1)] for i in (1, 2, 3)])


def helical(x):
    # theta in [-1/4, 3/4): a branch on the sign of x1, as in the original definition
    theta = ad.atan(x[1] / x[0]) / (2 * math.pi)
    if x[0] < 0:
        theta = theta + 0.5
    return [10 * (x[2] - 10 * theta), 10 * (ad.sqrt(x[0] ** 2 + x[1] ** 2) - 1), x[2]]


def helical_jac(x):
    x1, x2, _ = x
    rho2 = x1 ** 2 + x2 ** 2
    dtheta = np.array([-x2, x1]) / (2 * math.pi * rho2)
    return np.array([[*(-100 * dtheta), 10],
                     [10 * x1 / math.sqrt(rho2), 10 * x2 / math.sqrt(rho2), 0],
                     [0, 0, 1]])


def sum_of_squares(residuals):
    def f(x):
        return sum(r * r for r in residuals(x))
    f.__name__ = f"sum_of_squares({residuals.__name__})"
    return f


def sum_of_squares_grad(residuals, jac):
    def g(x):
        r = np.array([float(v) for v in residuals(x)])
        return 2 * jac(x).T @ r
    return g


# standard starting points plus seeded points near them
STARTS = {
    "rosenbrock": [-1.2, 1.0], "rosenbrock5": [-1.2, 1.0, -1.2, 1.0, 0.5],
    "wood": [-3.0, -1.0, -3.0, -1.0], "powell": [3.0, -1.0, 0.0, 1.0], "beale": [1.0, 1.0],
    "helical": [-1.0, 0.0, 0.0],
}


def points(name, count=3):
    rng = np.random.default_rng(sum(map(ord, name)))
    start = np.array(STARTS[name])
    return [start] + [start + rng.uniform(-0.5, 0.5, start.size) for _ in range(count - 1)]


SCALAR_PROBLEMS = {  # name: (f, hand-derived gradient, point name)
    "rosenbrock": (rosenbrock, rosenbrock_grad, "rosenbrock"),
    "rosenbrock5": (rosenbrock, rosenbrock_grad, "rosenbrock5"),
    "wood": (wood, wood_grad, "wood"),
    "powell_ss": (sum_of_squares(powell), sum_of_squares_grad(powell, powell_jac), "powell"),
    "beale_ss": (sum_of_squares(beale), sum_of_squares_grad(beale, beale_jac), "beale"),
    "helical_ss": (sum_of_squares(helical), sum_of_squares_grad(helical, helical_jac), "helical"),
}
VECTOR_PROBLEMS = {  # name: (residuals, hand-derived Jacobian)
    "powell": (powell, powell_jac), "beale": (beale, beale_jac), "helical": (helical, helical_jac),
}
SCALAR_CASES = [(name, i) for name, (_, _, p) in SCALAR_PROBLEMS.items() for i in range(3)]
VECTOR_CASES = [(name, i) for name in VECTOR_PROBLEMS for i in range(3)]


def close(actual, expected, rtol=1e-12, atol=1e-12):
    scale = max(1.0, np.max(np.abs(expected), initial=0.0))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol * scale)


# ---- the hand derivations themselves agree with finite differences -------------------

@pytest.mark.parametrize("name,i", SCALAR_CASES)
def test_hand_gradients_are_right(name, i):
    f, g, p = SCALAR_PROBLEMS[name]
    x = points(p)[i]
    fd = scipy.optimize.approx_fprime(x, lambda v: float(f(v)), 1e-7 * max(1.0, np.max(np.abs(x))))
    close(g(x), fd, rtol=1e-4, atol=1e-5)


# ---- grad and value_and_grad ---------------------------------------------------------

@pytest.mark.parametrize("name,i", SCALAR_CASES)
def test_grad_matches_hand_derivation(name, i):
    f, g, p = SCALAR_PROBLEMS[name]
    x = points(p)[i]
    result = ad.grad(f)(x)
    assert isinstance(result, np.ndarray) and result.dtype == np.float64 and result.shape == x.shape
    close(result, g(x))


@pytest.mark.parametrize("name", ["rosenbrock", "wood", "helical_ss"])
def test_value_and_grad(name):
    f, g, p = SCALAR_PROBLEMS[name]
    x = points(p)[1]
    value, gradient = ad.value_and_grad(f)(x)
    assert type(value) is float
    assert value == pytest.approx(float(f(x)), rel=1e-14)
    close(gradient, g(x))


def test_grad_records_one_tape_and_calls_f_once():
    seen = []

    def f(x):
        seen.append(x)
        return x[0] * x[1] + ad.exp(x[2])

    result = ad.grad(f)([1.0, 2.0, 0.0])
    assert len(seen) == 1
    (x,) = seen
    # a Tensor on one fresh list, whose single elements are scalar Records on it
    assert isinstance(x, ad.Tensor) and x.shape == (3,) and x.tape is not None
    assert all(isinstance(v, ad.Record) and v.tape is x.tape for v in x)
    assert x[1] is x[1]                    # each element once: one variable per element
    close(result, [2.0, 1.0, 1.0])


def test_grad_against_sympy():
    s = sp.symbols("a b c", real=True)
    expression = sp.exp(s[0] * s[1]) / (1 + s[2] ** 2) + sp.log(1 + s[0] ** 2) * sp.atan(s[2]) \
        + sp.sqrt(s[1]) * sp.cosh(s[2] - s[0])

    def f(x):
        return (ad.exp(x[0] * x[1]) / (1 + x[2] ** 2) + ad.log(1 + x[0] ** 2) * ad.atan(x[2])
                + ad.sqrt(x[1]) * ad.cosh(x[2] - x[0]))

    for x in ([0.3, 1.7, -0.4], [-1.1, 0.2, 2.5]):
        subs = dict(zip(s, map(sp.Float, x)))
        expected = [float(sp.diff(expression, v).evalf(30, subs=subs)) for v in s]
        close(ad.grad(f)(x), expected, rtol=1e-13)
        close(ad.jacobian(f, mode="forward")(x), expected, rtol=1e-13)


def test_integer_inputs_are_promoted():
    seen = []

    def f(x):
        seen.append(x[0].number)
        return x[0] / x[1]  # true division: 1/2, not 0

    value, gradient = ad.value_and_grad(f)([1, 2])
    assert value == 0.5 and type(seen[0]) is float
    close(gradient, [0.5, -0.25])
    assert ad.jacobian(f)(np.array([1, 2])).dtype == np.float64


def test_constant_output_has_zero_gradient():
    assert np.array_equal(ad.grad(lambda x: 3.0)([1.0, 2.0]), [0.0, 0.0])
    assert ad.value_and_grad(lambda x: 7)([1.0])[0] == 7.0
    assert np.array_equal(ad.grad(lambda x: ad.Record.constant(2.0))([1.0]), [0.0])
    # an input that is not used has derivative 0
    close(ad.grad(lambda x: x[0] * 2)([1.0, 5.0]), [2.0, 0.0])
    jac = ad.jacobian(lambda x: [x[0] * x[1], 1.0, np.float64(2.0)], mode="reverse")([2.0, 3.0])
    assert np.array_equal(jac, [[3.0, 2.0], [0.0, 0.0], [0.0, 0.0]])
    jac = ad.jacobian(lambda x: [x[0] * x[1], 1.0], mode="forward")([2.0, 3.0])
    assert np.array_equal(jac, [[3.0, 2.0], [0.0, 0.0]])


def test_extra_arguments_reach_f():
    def f(x, a, b):
        return a * x[0] ** 2 + b * x[1]

    close(ad.grad(f)([1.0, 1.0], 3.0, 5.0), [6.0, 5.0])
    close(ad.jacobian(f)([2.0, 1.0], 1.0, 0.0), [4.0, 0.0])
    assert ad.derivative(lambda x, c: c * x * x)(3.0, 2.0) == 12.0


# ---- jacobian ------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["auto", "forward", "reverse"])
@pytest.mark.parametrize("name,i", VECTOR_CASES)
def test_jacobian_matches_hand_derivation(name, i, mode):
    f, jac = VECTOR_PROBLEMS[name]
    x = points(name)[i]
    result = ad.jacobian(f, mode=mode)(x)
    assert result.dtype == np.float64 and result.shape == (len(f(x)), x.size)
    close(result, jac(x))


@pytest.mark.parametrize("name,i", VECTOR_CASES)
def test_jacobian_modes_agree(name, i):
    f, _ = VECTOR_PROBLEMS[name]
    x = points(name)[i]
    forward = ad.jacobian(f, mode="forward")(x)
    reverse = ad.jacobian(f, mode="reverse")(x)
    close(forward, reverse, rtol=1e-14, atol=1e-15)


def _spy(f):
    calls = []

    def spied(x):
        calls.append(type(x[0]).__name__ if len(x) else "empty")
        return f(x)
    return spied, calls


def test_jacobian_modes_cost_what_they_say():
    # n = 2 inputs, m = 3 outputs: auto is forward, 2 passes of Traces
    f, calls = _spy(lambda x: [x[0], x[0] * x[1], x[1] ** 2])
    ad.jacobian(f)([1.0, 2.0])
    assert calls == ["Trace", "Trace"]
    # n = 3, m = 1: one forward pass tells m, then one recording
    f, calls = _spy(lambda x: [x[0] * x[1] * x[2]])
    close(ad.jacobian(f)([1.0, 2.0, 3.0]), [[6.0, 3.0, 2.0]])
    assert calls == ["Trace", "Record"]
    f, calls = _spy(lambda x: [x[0], x[1], x[2]])
    ad.jacobian(f, mode="forward")([1.0, 2.0, 3.0])
    assert calls == ["Trace"] * 3
    f, calls = _spy(lambda x: [x[0], x[1], x[2], x[0]])
    ad.jacobian(f, mode="reverse")([1.0, 2.0, 3.0])
    assert calls == ["Record"]


def test_jacobian_of_a_scalar_is_the_gradient():
    for mode in ("auto", "forward", "reverse"):
        result = ad.jacobian(rosenbrock, mode=mode)(np.array(STARTS["rosenbrock5"]))
        assert result.shape == (5,)
        close(result, rosenbrock_grad(np.array(STARTS["rosenbrock5"])))
        # a sequence of length 1 is a sequence: one row
        assert ad.jacobian(lambda x: [rosenbrock(x)], mode=mode)([-1.2, 1.0]).shape == (1, 2)
        assert ad.jacobian(lambda x: np.array([x[0] * 2]), mode=mode)([1.0]).shape == (1, 1)


def test_jacobian_of_vectorised_numpy_code():
    a = np.array([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])

    def f(x):
        return np.tanh(a @ x)  # an object array of Records/Traces in, numpy all the way

    x = np.array([0.2, -0.1, 0.3])
    expected = (1 - np.tanh(a @ x) ** 2)[:, None] * a
    for mode in ("forward", "reverse"):
        close(ad.jacobian(f, mode=mode)(x), expected)


def test_jacobian_with_no_inputs_or_outputs():
    assert ad.jacobian(lambda x: [1.0, 2.0])(np.zeros(0)).shape == (2, 0)
    assert ad.jacobian(lambda x: [], mode="reverse")([1.0]).shape == (0, 1)
    assert ad.jacobian(lambda x: [], mode="forward")([1.0]).shape == (0, 1)


# ---- jvp and vjp ---------------------------------------------------------------------

@pytest.mark.parametrize("name,i", VECTOR_CASES)
def test_jvp_and_vjp_against_hand_jacobian(name, i, rng):
    f, jac = VECTOR_PROBLEMS[name]
    x = points(name)[i]
    J = jac(x)
    v, u = rng.standard_normal(J.shape[1]), rng.standard_normal(J.shape[0])
    value, tangent = ad.jvp(f, x, v)
    close(value, [float(r) for r in f(x)])
    close(tangent, J @ v)
    value, cotangent = ad.vjp(f, x, u)
    close(value, [float(r) for r in f(x)])
    close(cotangent, u @ J)
    assert cotangent.shape == x.shape


def test_jvp_and_vjp_of_scalar_functions(rng):
    x = np.array(STARTS["rosenbrock5"])
    g = rosenbrock_grad(x)
    v = rng.standard_normal(5)
    value, tangent = ad.jvp(rosenbrock, x, v)
    assert type(value) is float and type(tangent) is float
    assert tangent == pytest.approx(g @ v, rel=1e-13)
    value, cotangent = ad.vjp(rosenbrock, x, 2.0)
    assert type(value) is float
    close(cotangent, 2.0 * g)
    close(ad.vjp(rosenbrock, x, [2.0])[1], 2.0 * g)


def test_jvp_is_one_forward_pass_seeded_with_v():
    seen = []

    def f(x):
        seen.append([(t.number, t.derivative) for t in x])
        return x[0] * x[1]

    assert ad.jvp(f, [2.0, 3.0], [1.0, -1.0]) == (6.0, 1.0)
    assert seen == [[(2.0, 1.0), (3.0, -1.0)]]


def test_vjp_zero_weight_contributes_nothing():
    # the second output's derivative is inf at 0; weighted 0 it must not poison the result
    def f(x):
        return [x[0] * 3.0, ad.sqrt(x[1])]

    value, cotangent = ad.vjp(f, [1.0, 0.0], [1.0, 0.0])
    assert np.array_equal(cotangent, [3.0, 0.0])
    close(value, [3.0, 0.0])


def test_derivative_of_scalar_functions():
    t = sp.Symbol("t", real=True)
    for expression, function in [
        (t * sp.sin(t), lambda x: x * ad.sin(x)),
        (sp.exp(-t ** 2) / (1 + t ** 4), lambda x: ad.exp(-x ** 2) / (1 + x ** 4)),
        (sp.atan(t) ** 3, lambda x: ad.atan(x) ** 3),
    ]:
        for x in (-1.3, 0.4, 2.0):
            expected = float(sp.diff(expression, t).evalf(30, subs={t: sp.Float(x)}))
            assert ad.derivative(function)(x) == pytest.approx(expected, rel=1e-13, abs=1e-15)
    assert type(ad.derivative(ad.sin)(1)) is float
    close(ad.derivative(lambda x: [x, x * x, 1.0])(3.0), [1.0, 6.0, 0.0])


# ---- scipy embedding -----------------------------------------------------------------

@pytest.mark.parametrize("x0", [[-1.2, 1.0], [-1.2, 1.0, -1.2, 1.0, 0.5]])
def test_bfgs_minimises_rosenbrock(x0):
    result = scipy.optimize.minimize(rosenbrock, x0, jac=ad.grad(rosenbrock), method="BFGS",
                                     options={"gtol": 1e-9})
    assert result.success, result.message
    np.testing.assert_allclose(result.x, np.ones(len(x0)), atol=1e-6)


def test_scipy_args_and_least_squares():
    def shifted(x, c):
        return rosenbrock(x - c)

    c = np.array([0.5, -0.5])
    result = scipy.optimize.minimize(shifted, [0.0, 0.0], args=(c,), jac=ad.grad(shifted),
                                     method="BFGS", options={"gtol": 1e-9})
    np.testing.assert_allclose(result.x, 1.0 + c, atol=1e-6)
    # a Jacobian for least squares: Powell's function has its minimum 0 at the origin
    fit = scipy.optimize.least_squares(lambda x: np.array(powell(x), dtype=float),
                                       [3.0, -1.0, 0.0, 1.0], jac=ad.jacobian(powell),
                                       xtol=1e-15, ftol=1e-15, gtol=1e-15)
    assert np.max(np.abs(fit.x)) < 1e-3 and fit.cost < 1e-20


# ---- check_gradients -----------------------------------------------------------------

@pytest.mark.parametrize("name,i", SCALAR_CASES)
def test_check_gradients_passes_on_scalar_problems(name, i):
    f, g, p = SCALAR_PROBLEMS[name]
    x = points(p)[i]
    report = ad.check_gradients(f, x)
    close(report.forward, g(x))
    close(report.reverse, g(x))
    assert report.max_error <= np.max(report.tolerance)


@pytest.mark.parametrize("name,i", VECTOR_CASES)
def test_check_gradients_passes_on_jacobians(name, i):
    f, jac = VECTOR_PROBLEMS[name]
    x = points(name)[i]
    report = ad.check_gradients(f, x)
    assert report.finite_difference.shape == jac(x).shape
    close(report.finite_difference, jac(x), rtol=1e-6, atol=1e-6)


def _disagrees_in(mode_class, factor):
    """x0^2 + x1 on floats; AD of the given class sees factor * x0^2 instead."""
    def f(x):
        scale = factor if isinstance(x[0], mode_class) else 1.0
        return scale * x[0] ** 2 + x[1]
    return f


def test_check_gradients_reports_a_wrong_derivative_in_a_table():
    f = _disagrees_in((ad.Trace, ad.Record), 3.0)
    with pytest.raises(ad.GradientCheckError) as info:
        ad.check_gradients(f, [2.0, 5.0])
    assert isinstance(info.value, AssertionError)
    message = str(info.value)
    lines = message.splitlines()
    assert "1 of 2 derivatives disagree" in lines[0]
    assert lines[1].split() == ["index", "AD", "forward", "AD", "reverse", "finite",
                                "difference", "abs", "error"]
    index, forward, reverse, fd, error = lines[2].split()
    assert index == "[0]" and float(forward) == 12.0 and float(reverse) == 12.0
    assert float(fd) == pytest.approx(4.0, rel=1e-8)
    assert float(error) == pytest.approx(8.0, rel=1e-8)
    assert len(lines) == 3  # the right derivative (index 1) is not listed


@pytest.mark.parametrize("wrong_mode", [ad.Trace, ad.Record])
def test_check_gradients_checks_both_modes(wrong_mode):
    with pytest.raises(ad.GradientCheckError) as info:
        ad.check_gradients(_disagrees_in(wrong_mode, 2.0), [1.0, 0.0])
    row = str(info.value).splitlines()[2].split()
    forward, reverse = float(row[1]), float(row[2])
    assert (forward, reverse) == ((4.0, 2.0) if wrong_mode is ad.Trace else (2.0, 4.0))


def test_check_gradients_jacobian_table_has_row_and_column():
    def f(x):
        wrong = isinstance(x[0], (ad.Trace, ad.Record))
        return [x[0] * x[1], x[1] + (x[0] if wrong else 0.0)]

    with pytest.raises(ad.GradientCheckError) as info:
        ad.check_gradients(f, [1.0, 2.0])
    lines = str(info.value).splitlines()
    assert "d f_i / d x_j at [i, j]" in lines[0]
    assert len(lines) == 3 and lines[2].split()[:2] == ["[1,", "0]"]


def test_check_gradients_flags_nan():
    def f(x):  # AD: 0 * inf, which is NaN; floats: a smooth 0
        return x[0] * 0.0 + (ad.Trace(0.0, math.nan) if isinstance(x[0], ad.Trace) else 0.0)

    with pytest.raises(ad.GradientCheckError, match="nan"):
        ad.check_gradients(f, [1.0])


def test_check_gradients_step_is_relative_and_allows_for_rounding():
    # at x = 1e7 an absolute step of 1e-6 would drown log's derivative (1e-7) in rounding
    report = ad.check_gradients(lambda x: ad.log(x[0]), [1e7])
    assert report.finite_difference[0] == pytest.approx(1e-7, rel=1e-6)
    # a huge value with a small slope: the difference quotient is only good to about
    # eps * 1e8 / h; the check allows for that instead of failing a correct gradient
    ad.check_gradients(lambda x: 1e8 + 1e-3 * x[0] + x[0] ** 2, [0.25])
    # ... but a wrong gradient far beyond that bound still fails
    with pytest.raises(ad.GradientCheckError):
        ad.check_gradients(_disagrees_in((ad.Trace, ad.Record), 1.5), [1e3, 0.0])


def test_check_gradients_table_is_capped():
    def f(x):
        return np.sum(x * x) * (2.0 if isinstance(x[0], ad.Record) else 1.0)

    with pytest.raises(ad.GradientCheckError) as info:
        ad.check_gradients(f, np.arange(1.0, 41.0))
    message = str(info.value)
    assert "40 of 40 derivatives disagree" in message and "... and 15 more" in message


def test_check_gradients_rejects_bad_tolerances():
    with pytest.raises(ValueError, match="eps"):
        ad.check_gradients(rosenbrock, [1.0, 1.0], eps=0.0)


# ---- misuse: errors name the problem and the fix -------------------------------------

def test_grad_of_a_vector_output_points_to_jacobian():
    for bad in (powell, lambda x: np.array([x[0], x[1]]), lambda x: [x[0]]):
        with pytest.raises(TypeError, match=r"jacobian"):
            ad.grad(bad)([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(TypeError, match=r"returned shape \(4,\)"):
        ad.value_and_grad(powell)([1.0, 2.0, 3.0, 4.0])


def test_x0_of_any_shape():
    # a matrix point: the gradient has its shape (f written for arrays of any shape)
    W = np.arange(6.0).reshape(2, 3) / 4.0
    cube = lambda w: np.sum(w ** 3)  # noqa: E731
    for make in (ad.grad, lambda f: (lambda x: ad.value_and_grad(f)(x)[1]),
                 lambda f: ad.jacobian(f, mode="forward"), lambda f: ad.jacobian(f, "reverse")):
        close(make(cube)(W), 3 * W ** 2)
    close(ad.check_gradients(cube, W).reverse, 3 * W ** 2)
    assert ad.grad(lambda x: x * x)(3.0) == 6.0           # a number: a float back


@pytest.mark.parametrize("x0", [["a", "b"], [1 + 2j, 0], [None, 1.0]])
def test_x0_must_be_real(x0):
    with pytest.raises(TypeError, match="real numbers"):
        ad.grad(rosenbrock)(x0)


def test_direction_lengths_are_checked():
    with pytest.raises(ValueError, match=r"v must have the shape of x0's leaf, \(2,\)"):
        ad.jvp(rosenbrock, [1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"shape of x0's leaf, \(2,\), got \(\)"):
        ad.jvp(rosenbrock, [1.0, 2.0], 1.0)
    with pytest.raises(ValueError, match=r"one weight per output.*shape \(4,\)"):
        ad.vjp(powell, [1.0, 2.0, 3.0, 4.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="a scalar"):
        ad.vjp(rosenbrock, [1.0, 2.0], [1.0, 2.0])


@pytest.mark.parametrize("result,match", [
    (None, "NoneType"), ("1.0", "str"), (1 + 2j, "complex"), (["x", 1.0], "got str"),
    ({"a": [1.0, None]}, "NoneType"),
])
def test_f_must_return_numbers(result, match):
    for call in (lambda f: ad.grad(f)([1.0]), lambda f: ad.jacobian(f)([1.0]),
                 lambda f: ad.jvp(f, [1.0], [1.0]), lambda f: ad.vjp(f, [1.0], 1.0),
                 lambda f: ad.derivative(f)(1.0)):
        with pytest.raises(TypeError, match=match):
            call(lambda x: result)


def test_other_misuse():
    with pytest.raises(ValueError, match="mode must be one of 'auto', 'forward', 'reverse'"):
        ad.jacobian(rosenbrock, mode="sideways")
    # outputs of any shape: the Jacobian's shape is the output's and then the input's
    close(ad.jacobian(lambda x: np.ones((2, 2)) * x[0])([1.0]), np.ones((2, 2, 1)))
    with pytest.raises(ValueError, match="scalar x"):
        ad.derivative(ad.sin)([1.0, 2.0])
    outside = ad.WengertList().variable(1.0)
    with pytest.raises(TypeError, match="Record in forward mode"):
        ad.jacobian(lambda x: [x[0], outside], mode="forward")([1.0])
    with pytest.raises(TypeError, match="Trace in reverse mode"):
        ad.grad(lambda x: ad.Trace(1.0, 1.0))([1.0])
    with pytest.raises(ad.TapeMismatchError):
        ad.grad(lambda x: outside)([1.0])
    changing = iter([[1.0], [1.0, 2.0]])
    with pytest.raises(ValueError, match="must not change size"):
        ad.jacobian(lambda x: [x[0] * v for v in next(changing)], mode="forward")([1.0, 2.0])


def test_returned_callables_are_documented_and_named():
    for make in (ad.grad, ad.value_and_grad, ad.jacobian, ad.derivative):
        made = make(rosenbrock)
        assert made.__name__ == "rosenbrock" and "rosenbrock" in made.__doc__
