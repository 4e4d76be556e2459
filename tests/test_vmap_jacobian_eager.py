"""Batched Jacobians as one computation (issue 27 item 1): ``ad.vmap(ad.jacobian(f))``
eager in forward mode is one pass with f's values once and the basis one batched tangent
(not the batch copied along the basis); ``ad.vjp`` of one tensor output sweeps seeded
with the weights; the replayed program's tangent loop reads operands that are the same
along the basis in order (an outer loop), and its final move of the basis axis is a
view. Every result is checked against torch.func, against easyad's own per-example
Jacobians (bit for bit where no BLAS product rounds apart) and finite differences.
"""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
from easyad.compiler.program import cstyle, fused_c
from easyad.transforms import vmap_lift

torch = pytest.importorskip("torch")
func = torch.func
rng = np.random.default_rng(2711)
A = rng.normal(size=(5, 5)) / 3.0
C = rng.normal(size=5)
X = rng.normal(size=(7, 5))


def f(v):
    return ad.tanh(A @ v + C) * v[0] + ad.exp(ad.sin(v) * v[1:3].sum()) / (1.0 + v * v)


def tf(v):
    tA, tC = torch.tensor(A), torch.tensor(C)
    return torch.tanh(tA @ v + tC) * v[0] + torch.exp(torch.sin(v) * v[1:3].sum()) / \
        (1.0 + v * v)


def per_example(mode):
    return np.stack([ad.jacobian(f, mode=mode)(x) for x in X])


def finite_differences(x, h=1e-6):
    g = lambda z: np.asarray(ad.vmap(f)(z[None])[0])      # noqa: E731
    return np.stack([(g(x + h * e) - g(x - h * e)) / (2 * h) for e in np.eye(len(x))], -1)


@pytest.mark.parametrize("mode", ["forward", "reverse", "auto"])
def test_batched_jacobians_match_torch_per_example_and_finite_differences(mode):
    J = ad.vmap(ad.jacobian(f, mode=mode))(X)
    assert isinstance(J, np.ndarray) and J.shape == (7, 5, 5)
    theirs = func.vmap(func.jacrev(tf))(torch.tensor(X)).numpy()
    np.testing.assert_allclose(J, theirs, rtol=1e-12, atol=1e-12)
    # easyad's Jacobian of each example alone: the same rules in one pass (A @ v of the
    # batch is one BLAS product, of one example another: they may round apart)
    each = per_example("reverse" if mode == "reverse" else "forward")
    np.testing.assert_allclose(J, each, rtol=1e-15, atol=4e-16)
    np.testing.assert_allclose(J[3], finite_differences(X[3]), rtol=1e-6, atol=1e-7)
    # without a product, bit for bit
    g = lambda v: ad.exp(ad.sin(v) * v[1:3].sum()) / (1.0 + v * v)      # noqa: E731
    one = "reverse" if mode == "reverse" else "forward"
    assert ad.vmap(ad.jacobian(g, mode=mode))(X).tobytes() == \
        np.stack([ad.jacobian(g, mode=one)(x) for x in X]).tobytes()


def test_the_forward_jacobian_is_one_pass_with_a_batched_tangent(monkeypatch):
    seen = []
    real = vmap_lift._basis_tangent

    def spy(one, x, t):
        seen.append((x.shape, t._value.shape))
        return real(one, x, t)
    monkeypatch.setattr(vmap_lift, "_basis_tangent", spy)
    J = ad.vmap(ad.jacobian(f, mode="forward"))(X)
    # f's values at the 7 points once; the 5 basis directions as one batch of tangents
    assert seen == [((7, 5), (5, 7, 5))]
    np.testing.assert_allclose(J, per_example("forward"), rtol=1e-15, atol=4e-16)


def test_closed_over_batched_values_and_a_second_argument():
    Y = rng.normal(size=(7, 5))
    ours = ad.vmap(lambda x, y: ad.jacobian(lambda v: ad.sin(v * y) * y[0] + v @ A,
                                            mode="forward")(x))(X, Y)
    tA = torch.tensor(A)
    theirs = func.vmap(lambda x, y: func.jacfwd(lambda v: torch.sin(v * y) * y[0] + v @ tA)(
        x))(torch.tensor(X), torch.tensor(Y)).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)


def test_strong_zeros_survive_the_batched_tangent():
    # d/dv of v[0] * sqrt(v) at v[k] = 0: the sqrt's infinite partial meets the zero
    # direction of every other basis element; each entry is easyad's per-example one
    x = np.abs(X.copy())
    x[:, 2] = 0.0
    g = lambda v: v[0] * ad.sqrt(v)            # noqa: E731
    J = ad.vmap(ad.jacobian(g, mode="forward"))(x)
    each = np.stack([ad.jacobian(g, mode="forward")(v) for v in x])
    assert J.tobytes() == each.tobytes()
    assert np.isinf(J[:, 2, 2]).all() and (J[:, 2, 0] == 0.0).all()


def test_vjp_of_one_tensor_output_is_the_weighted_sum_s_gradient_bitwise():
    x = X[0]
    u = rng.normal(size=5)
    value, cotangent = ad.vjp(f, x, u)
    assert cotangent.tobytes() == ad.grad(lambda z: ad.sum(f(z) * u))(x).tobytes()
    np.testing.assert_allclose(value, np.asarray(ad.vmap(f)(X[:1])[0]), rtol=0, atol=0)
    # an output weighted 0 passes on nothing, even where its derivative is infinite
    _, c = ad.vjp(ad.sqrt, np.array([0.0, 4.0]), np.array([0.0, 1.0]))
    assert c.tolist() == [0.0, 0.25]


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_the_replayed_tangent_loop_splits_and_keeps_every_bit(mode, monkeypatch):
    x = rng.normal(size=(64, 16))
    B = rng.normal(size=(16, 16)) / 4.0

    def h(v):
        return ad.tanh(B @ v + 1.0) * v[0]
    F = ad.record(ad.vmap(ad.jacobian(h, mode=mode)), x, tensor=True)
    split = F(x)
    source = F._bound["value"].source
    views = F._bound["value"].views
    monkeypatch.setattr(cstyle.Renderer, "_outer_split", lambda self, groups: None)
    monkeypatch.setattr(fused_c, "final_views", lambda program, outputs: (outputs, {}))
    G = ad.record(ad.vmap(ad.jacobian(h, mode=mode)), x, tensor=True)
    flat = G(x)
    assert "for (long o = 0;" not in G._bound["value"].source
    if mode == "forward":      # the (basis, batch, element) tangent loop: an outer loop
        # over (basis, batch) around a vector loop over the elements, x[0] loaded once
        # per outer step (no gather at a divided index in the vector loop)
        assert "for (long o = 0; o < 1024L; o++) {\n        const double" in source
        assert "for (long ii = 0; ii < 16L; ii++)" in source and "(ii / " not in source
    # the basis axis moved last: a view of the program's result, not a copy made in C
    assert views == {0: ((16, 64, 16), (1, 2, 0) if mode == "forward" else (1, 0, 2))}
    assert not split.flags.c_contiguous and flat.flags.c_contiguous
    assert split.shape == flat.shape == (64, 16, 16)
    assert split.tobytes() == flat.tobytes()
    y = rng.normal(size=(64, 16))
    assert F(y).tobytes() == G(y).tobytes()
    np.testing.assert_allclose(F(y), ad.vmap(ad.jacobian(h, mode=mode))(y), rtol=1e-13,
                               atol=1e-13)
    # a batch of points (one more leading axis): the same views, point by point
    ys = rng.normal(size=(3, 64, 16))
    assert F(ys).tobytes() == np.stack([G(v) for v in ys]).tobytes()
