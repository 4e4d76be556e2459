"""Nested transforms whose inner ``f`` closes over the outer variable (issue 24, item 2).

Each transform call opens a level: a Trace of an outer transform met inside an inner one
is a constant of the outer level, never the inner perturbation (perturbation confusion),
and a reverse transform inside another records onto its list. Every order of modes, to
three levels, for scalars and arrays, against hand-derived values, sympy and torch.func.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import sympy as sp
import torch
import torch.func as tf

import easyad as ad
from easyad._evaluation import _open_level

torch.set_default_dtype(torch.float64)


# ---- the scalar transforms: T(g, p) is dg/dx at p, each a different entry point ---------

def _derivative(g, p):
    return ad.derivative(g)(p)


def _jvp(g, p):
    return ad.jvp(g, p, 1.0)[1]


def _jacobian_forward(g, p):
    return ad.jacobian(lambda v: g(v[0]), mode="forward")([p])[0]


def _grad(g, p):
    return ad.grad(g)(p)


def _value_and_grad(g, p):
    return ad.value_and_grad(g)(p)[1]


def _vjp(g, p):
    return ad.vjp(g, p, 1.0)[1]


def _jacobian_reverse(g, p):
    return ad.jacobian(lambda v: g(v[0]), mode="reverse")([p])[0]


FORWARD = [_derivative, _jvp, _jacobian_forward]
REVERSE = [_grad, _value_and_grad, _vjp, _jacobian_reverse]
SCALAR = FORWARD + REVERSE


def _names(ts):
    return [t.__name__.strip("_") for t in ts]


# ---- the issue's examples ---------------------------------------------------------------

def test_issue_examples_have_their_true_values():
    D = ad.derivative
    assert D(lambda x: D(lambda y: x * y)(2.0))(3.0) == 1.0
    assert D(lambda x: x * D(lambda y: x + y)(1.0))(1.0) == 1.0
    assert ad.jvp(lambda x: x * ad.jvp(lambda y: x + y, 1.0, 1.0)[1], 1.0, 1.0) == (1.0, 1.0)
    inner = lambda x: ad.jacobian(lambda y: x[0] + y[0], mode="forward")([1.0])[0]  # noqa: E731
    np.testing.assert_array_equal(
        ad.jacobian(lambda x: x[0] * inner(x), mode="forward")([1.0]), [1.0])
    rr = ad.grad(lambda x: x[0] * ad.grad(lambda y: x[0] * y[0])([1.0])[0])([3.0])
    np.testing.assert_array_equal(rr, [6.0])
    assert D(lambda x: x * ad.grad(lambda y: x * y)(1.0))(3.0) == 6.0     # forward/reverse


def test_results_are_plain_and_do_not_leak_a_perturbation():
    D = ad.derivative
    # the inner derivative is a value of the outer level: x, times x
    out = D(lambda x: D(lambda y: x * y)(2.0) * x)(3.0)
    assert type(out) is float and out == 6.0
    # jvp's value inside: 2 x, a Trace of the outer level
    assert D(lambda x: ad.jvp(lambda y: x * y, 2.0, 1.0)[0])(3.0) == 2.0
    seen = []

    def outer(x):
        d = D(lambda y: x * y * y)(2.0)       # 4 x: a Trace of the outer level
        seen.append((type(d).__name__, d.number, d.derivative))
        return d
    assert D(outer)(3.0) == 4.0
    assert seen == [("Trace", 12.0, 4.0)]
    # an inner result that does not depend on the outer variable is a plain constant
    assert D(lambda x: D(lambda y: y * y)(2.0) + x)(3.0) == 1.0
    # the inner transforms leave no level open behind them
    assert _open_level() == (0, None)


# ---- two levels: every pair of entry points ---------------------------------------------

def _two_level_reference(x):
    # F(x) = x * d/dy [sin(x y) + x y^2] at y = 0.7 = x^2 cos(0.7 x) + 1.4 x^2
    return 2 * x * np.cos(0.7 * x) - 0.7 * x ** 2 * np.sin(0.7 * x) + 2.8 * x


@pytest.mark.parametrize("inner", SCALAR, ids=_names(SCALAR))
@pytest.mark.parametrize("outer", SCALAR, ids=_names(SCALAR))
def test_two_levels_every_order(outer, inner):
    def F(x):
        return x * inner(lambda y: ad.sin(x * y) + x * y ** 2, 0.7)
    x0 = 1.3
    got = outer(F, x0)
    assert isinstance(got, float)        # a number: no Trace or Record leaks out
    assert got == pytest.approx(_two_level_reference(x0), rel=1e-13)


# ---- three levels -----------------------------------------------------------------------

def _three_level_reference(x0, y0, z0):
    x, y, z = sp.symbols("x y z")
    e3 = x * y * z ** 2 + sp.sin(x * z) * y
    c = x * sp.diff(e3, z).subs(z, z0)          # C(x, y) = x dE3/dz at z0
    b = sp.diff(y * c + x, y).subs(y, y0)       # B(x) = d/dy (y C + x) at y0
    return float(sp.diff(x * b, x).subs(x, x0))


# each order of modes, each with other entry points at each level
ORDERS = list(itertools.product((FORWARD, REVERSE), repeat=3))


@pytest.mark.parametrize("order", range(len(ORDERS)),
                         ids=["".join("F" if m is FORWARD else "R" for m in o) for o in ORDERS])
def test_three_levels_every_order(order):
    modes = ORDERS[order]
    t1, t2, t3 = (m[(order + k) % len(m)] for k, m in enumerate(modes))
    x0, y0, z0 = 0.9, -1.1, 0.6

    def C(x, y):
        return x * t3(lambda z: x * y * z ** 2 + ad.sin(x * z) * y, z0)

    def B(x):
        return t2(lambda y: y * C(x, y) + x, y0)

    got = t1(lambda x: x * B(x), x0)
    assert got == pytest.approx(_three_level_reference(x0, y0, z0), rel=1e-12)


# ---- second-order transforms inside others ----------------------------------------------

def test_hessian_and_hvp_close_over_an_outer_variable():
    D = ad.derivative
    # d/dx [d2/dy2 x y^3 at 2] = 6 * 2
    assert D(lambda x: ad.hessian(lambda y: x * y ** 3)(2.0))(1.5) == pytest.approx(12.0)
    assert ad.grad(lambda x: ad.hessian(lambda y: x * y ** 3)(2.0))(1.5) == pytest.approx(12.0)
    # hvp of x y0^2 y1 at y = (1, 2), v = (1, 1): H = [[2 y1, 2 y0], [2 y0, 0]] x
    y0, v = np.array([1.0, 2.0]), np.array([1.0, 1.0])
    expected = np.array([2 * 2.0 + 2 * 1.0, 2 * 1.0])            # d/dx (H v)
    for outer in ("forward", "reverse"):
        J = ad.jacobian(lambda x: ad.hvp(lambda y: x[0] * y[0] ** 2 * y[1], y0, v),
                        mode=outer)([0.5])
        np.testing.assert_allclose(J[:, 0], expected, rtol=1e-14)


@pytest.mark.parametrize("inner", SCALAR, ids=_names(SCALAR))
def test_hessian_and_hvp_of_a_function_with_an_inner_transform(inner):
    # f = x0 * d/dy (x0 x1 y^2) at 1 = 2 x0^2 x1: H = [[4 x1, 4 x0], [4 x0, 0]] (the
    # replay path records f, and the inner transform with it)
    def f(x):
        return x[0] * inner(lambda y: x[0] * x[1] * y * y, 1.0)
    x0, v = np.array([1.5, -0.5]), np.array([1.0, 2.0])
    H = np.array([[4 * x0[1], 4 * x0[0]], [4 * x0[0], 0.0]])
    np.testing.assert_allclose(ad.hessian(f)(x0), H, rtol=1e-14)
    np.testing.assert_allclose(ad.hvp(f, x0, v), H @ v, rtol=1e-14)


@pytest.mark.parametrize("inner", [_derivative, _jvp, _grad, _vjp], ids=_names(
    [_derivative, _jvp, _grad, _vjp]))
def test_record_replays_an_inner_transform_over_its_input(inner):
    # f = x0 * d/dy (x0 y^2) at 1 = 2 x0^2, recorded at 2 and replayed at 3
    F = ad.record(lambda x: x[0] * inner(lambda y: x[0] * y * y, 1.0), np.array([2.0]))
    z = np.array([3.0])
    assert F(z) == pytest.approx(18.0)
    np.testing.assert_allclose(F.gradient(z), [12.0], rtol=1e-14)
    np.testing.assert_allclose(F.hessian(z), [[4.0]], rtol=1e-14)


def test_record_inside_a_transform_refuses_the_outer_variable():
    # a recording cannot hold another level's values: it raises, never freezes them
    D = ad.derivative
    z = np.array([2.0])
    with pytest.raises(TypeError, match="do not mix"):
        D(lambda x: ad.record(lambda y: x * y[0], z)(z))(3.0)
    with pytest.raises(TypeError, match="f returned a Trace"):
        D(lambda x: ad.record(lambda y: D(lambda s: x * s * y[0])(1.0), z)(z))(3.0)
    with pytest.raises(ad.TapeMismatchError):
        ad.grad(lambda x: ad.record(lambda y: x * y[0], z)(z))(3.0)


# ---- arrays: the mixed partials of a Lagrangian -----------------------------------------

X0 = np.array([0.5, -1.2, 2.0])
Y0 = np.array([1.5, 0.3, -0.7])


def _lagrangian(x, y, lib):
    return lib.sum(x * x * y) + lib.sin(x[0]) * y[1] + lib.sum(lib.exp(x * y))


def _mixed_reference():
    # d/dy_j of (grad_x L)_i, by torch.func with the same closure
    x0, y0 = torch.tensor(X0), torch.tensor(Y0)
    return tf.jacrev(lambda y: tf.grad(lambda x: _lagrangian(x, y, torch))(x0))(y0).numpy()


INNER_GRADIENTS = {
    "grad": lambda y: ad.grad(lambda x: _lagrangian(x, y, ad))(X0),
    "value_and_grad": lambda y: ad.value_and_grad(lambda x: _lagrangian(x, y, ad))(X0)[1],
    "vjp": lambda y: ad.vjp(lambda x: _lagrangian(x, y, ad), X0, 1.0)[1],
    "jacobian_forward": lambda y: ad.jacobian(lambda x: _lagrangian(x, y, ad),
                                              mode="forward")(X0),
    "jacobian_reverse": lambda y: ad.jacobian(lambda x: _lagrangian(x, y, ad),
                                              mode="reverse")(X0),
}


@pytest.mark.parametrize("inner", list(INNER_GRADIENTS))
def test_lagrangian_mixed_partials_every_order(inner):
    g = INNER_GRADIENTS[inner]
    M = _mixed_reference()
    for mode in ("forward", "reverse"):
        np.testing.assert_allclose(ad.jacobian(g, mode=mode)(Y0), M, rtol=1e-13)
    v, u = np.array([1.0, 2.0, -1.0]), np.array([0.5, -1.0, 3.0])
    value, tangent = ad.jvp(g, Y0, v)
    np.testing.assert_allclose(value, g(Y0), rtol=1e-14)
    np.testing.assert_allclose(tangent, M @ v, rtol=1e-13)
    np.testing.assert_allclose(ad.vjp(g, Y0, u)[1], u @ M, rtol=1e-13)


def test_lagrangian_second_order_inside_a_transform():
    # d/dy_k of the Hessian in x, and of H v, with L closing over y (torch.func reference)
    x0, y0 = torch.tensor(X0), torch.tensor(Y0)
    v, w = np.array([1.0, -0.5, 2.0]), np.array([0.3, 1.0, -2.0])
    dH_ref = tf.jacrev(lambda y: tf.hessian(lambda x: _lagrangian(x, y, torch))(x0))(y0)
    dH_ref = dH_ref.numpy()                      # [i, j, k]: d/dy_k H_ij
    for mode in ("forward", "reverse"):
        dH = ad.jacobian(lambda y: ad.hessian(lambda x: _lagrangian(x, y, ad))(X0),
                         mode=mode)(Y0)
        np.testing.assert_allclose(dH, dH_ref, rtol=1e-13)
    hv = lambda y: ad.hvp(lambda x: _lagrangian(x, y, ad), X0, v)  # noqa: E731
    np.testing.assert_allclose(ad.jvp(hv, Y0, w)[1], np.einsum("ijk,j,k->i", dH_ref, v, w),
                               rtol=1e-13)
    np.testing.assert_allclose(ad.vjp(hv, Y0, w)[1], np.einsum("ijk,j,i->k", dH_ref, v, w),
                               rtol=1e-13)


# ---- arrays: three levels ---------------------------------------------------------------

def _g3(x, y, lib, z0):
    """grad_z of sum(x y z^2) + sum(sin(x z)) * sum(y) at z0."""
    return 2 * x * y * z0 + x * lib.cos(x * z0) * lib.sum(y)


def _torch_three(x0, y0, z0):
    def level3(x, y):
        return tf.grad(lambda z: torch.sum(x * y * z ** 2) +
                       torch.sum(torch.sin(x * z)) * torch.sum(y))(z0)

    def level2(x):
        return tf.grad(lambda y: torch.sum(level3(x, y) * x))(y0)
    return tf.jacrev(level2)(x0).numpy()


def _level(mode, kind):
    """A gradient (kind "grad") or Jacobian (kind "jac") transform in the mode."""
    if kind == "grad":
        return ad.grad if mode == "R" else (lambda f: ad.jacobian(f, mode="forward"))
    return lambda f: ad.jacobian(f, mode="forward" if mode == "F" else "reverse")


@pytest.mark.parametrize("modes", ["".join(m) for m in itertools.product("FR", repeat=3)])
def test_arrays_three_levels_every_order(modes):
    x0 = np.array([0.3, -0.8])
    y0 = np.array([1.1, 0.4])
    z0 = np.array([-0.5, 0.9])
    t1, t2, t3 = _level(modes[0], "jac"), _level(modes[1], "grad"), _level(modes[2], "grad")

    def level3(x, y):
        return t3(lambda z: ad.sum(x * y * z ** 2) + ad.sum(ad.sin(x * z)) * ad.sum(y))(z0)

    def level2(x):
        return t2(lambda y: ad.sum(level3(x, y) * x))(y0)

    got = t1(level2)(x0)
    ref = _torch_three(torch.tensor(x0), torch.tensor(y0), torch.tensor(z0))
    np.testing.assert_allclose(got, ref, rtol=1e-12)


# ---- structures, a point that is also closed over, tensor operations --------------------

@pytest.mark.parametrize("outer", [ad.derivative, lambda g: ad.grad(g)], ids=["F", "R"])
def test_structures_close_over_an_outer_variable(outer):
    # d/ds of sum(d/db [a s + sum(b s^2)]) = d/ds 2 s^2 = 4 s
    p0 = {"a": 1.0, "b": np.ones(2)}

    def body(p, s):
        return p["a"] * s + ad.sum(p["b"] * s * s)
    by_grad = outer(lambda s: ad.sum(ad.grad(lambda p: body(p, s))(p0)["b"]))(2.0)
    direction = {"a": 0.0, "b": np.ones(2)}
    by_jvp = outer(lambda s: ad.jvp(lambda p: body(p, s), p0, direction)[1])(2.0)
    assert by_grad == pytest.approx(8.0) and by_jvp == pytest.approx(8.0)


@pytest.mark.parametrize("inner", SCALAR, ids=_names(SCALAR))
@pytest.mark.parametrize("outer", [_derivative, _grad], ids=["F", "R"])
def test_the_outer_variable_as_point_and_closure(outer, inner):
    # d/dx [d/dy x y^2 at y = x] = d/dx 2 x^2 = 4 x
    assert outer(lambda x: inner(lambda y: x * y * y, x), 1.5) == pytest.approx(6.0)


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_matmul_closes_over_an_outer_matrix(mode):
    # grad_v (v . W v) = (W + W^T) v; its Jacobian by W: d/dW_ab = e_a v_b + e_b v_a
    v0 = np.array([1.0, 2.0])
    W0 = torch.tensor([[1.0, 2.0], [0.5, -1.0]])
    ref = tf.jacrev(lambda W: tf.grad(lambda v: v @ (W @ v))(torch.tensor(v0)))(W0)
    got = ad.jacobian(lambda W: ad.grad(lambda v: v @ (W @ v))(v0), mode=mode)(W0.numpy())
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-14)


# ---- what keeps its meaning -------------------------------------------------------------

def test_hand_made_traces_keep_their_meaning():
    # untagged: a Trace.variable is the one perturbation of its depth
    x = ad.Trace.variable(3.0)
    assert (x * x).derivative == 6.0
    # a transform at a hand-made Trace goes one level above it (forward over forward)
    t = ad.derivative(lambda y: y * y * y)(ad.Trace(3.0, 1.0))
    assert (t.number, t.derivative) == (27.0, 18.0)
    # the float Trace and a Record still refuse each other
    with pytest.raises(TypeError, match="do not mix"):
        ad.Trace(1.0, 1.0) * ad.WengertList().variable(1.0)


def test_a_failing_inner_transform_closes_its_level():
    def outer(x):
        return ad.derivative(lambda y: x * y * "no")(2.0)
    with pytest.raises(TypeError):
        ad.derivative(outer)(1.0)
    with pytest.raises(TypeError):
        ad.grad(lambda x: ad.grad(lambda y: x * y * "no")(2.0))(1.0)
    assert _open_level() == (0, None)
    out = ad.derivative(lambda x: x * x)(3.0)
    assert type(out) is float and out == 6.0


def test_unsupported_point_raises_a_clear_error():
    traces = np.array([ad.Trace(1.0, 1.0), ad.Trace(2.0, 0.0)], dtype=object)
    with pytest.raises(NotImplementedError, match="arrays of Traces"):
        ad.grad(lambda y: y[0] * y[1])(traces)
