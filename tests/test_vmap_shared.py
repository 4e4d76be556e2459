"""Per-example gradients of arguments that are the same in every example
(``transforms/vmap_shared.py``: probes at the frontier ops, a broadcast copy only where
another op reads the weights) against torch.func.vmap(grad) (float64, 1e-10), and the
paths that keep the general lift (nested vmaps, closures) against example-by-example
gradients."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
from easyad.transforms import vmap_shared

torch = pytest.importorskip("torch")
func = torch.func
TOL = 1e-10
rng = np.random.default_rng(271)
X = rng.normal(size=(5, 4))                 # 5 examples of 4
XS = rng.normal(size=(5, 2, 4))             # 5 examples of (2, 4): several rows each
W = rng.normal(size=(4, 3))
B = rng.normal(size=3)


def T(a):
    return torch.tensor(np.asarray(a), dtype=torch.float64)


def close(ours, theirs):
    theirs = theirs.detach().numpy()
    assert np.shape(ours) == tuple(theirs.shape), (np.shape(ours), theirs.shape)
    np.testing.assert_allclose(ours, theirs, rtol=TOL, atol=TOL)


@pytest.fixture
def copies(monkeypatch):
    """How many broadcast copies of a weight the gradients made (each read of a Shared's
    ``_value``)."""
    made = []
    original = vmap_shared.Frontier.input

    def counted(self, array, owner, part):
        if part is vmap_shared._same:
            made.append(array.shape)
        return original(self, array, owner, part)
    monkeypatch.setattr(vmap_shared.Frontier, "input", counted)
    return made


# each frontier op, the weight on either side, with numpy's broadcasting in one example
FRONTIER = {
    "x @ w": (lambda w, b, x: ad.sum(ad.sin(x @ w)), lambda w, b, x: torch.sin(x @ w).sum()),
    "rows @ w": (lambda w, b, x: ad.sum(ad.sin(x @ w) * b),
                 lambda w, b, x: (torch.sin(x @ w) * b).sum()),
    "w @ v": (lambda w, b, x: ad.sum(ad.cos(w @ (x @ w))),
                       lambda w, b, x: torch.cos(w @ (x @ w)).sum()),
    "y + b, b - y": (lambda w, b, x: ad.sum(ad.tanh(x @ w + b) * (b - x @ w)),
                     lambda w, b, x: (torch.tanh(x @ w + b) * (b - x @ w)).sum()),
    "b + y, y - b": (lambda w, b, x: ad.sum((b + x @ w) ** 2 - ad.exp(x @ w - b)),
                     lambda w, b, x: ((b + x @ w) ** 2 - torch.exp(x @ w - b)).sum()),
    "y * b, b * y": (lambda w, b, x: ad.sum(ad.sin(x @ w * b) + b * ad.cos(x @ w)),
                     lambda w, b, x: (torch.sin(x @ w * b) + b * torch.cos(x @ w)).sum()),
    "per-example scalar * b": (lambda w, b, x: ad.sum(ad.sum(x) * b),
                               lambda w, b, x: (x.sum() * b).sum()),
}


@pytest.mark.parametrize("case", sorted(FRONTIER))
def test_frontier_ops_against_torch_without_copies(case, copies):
    ours, theirs = FRONTIER[case]
    xs = XS if case == "rows @ w" else X
    got = ad.vmap(ad.grad(ours, argnums=(0, 1)), in_axes=(None, None, 0))(W, B, xs)
    want = func.vmap(func.grad(theirs, argnums=(0, 1)), in_dims=(None, None, 0))(
        T(W), T(B), T(xs))
    for g, h in zip(got, want):
        close(g, h)
    assert copies == [], f"{case}: the weights were copied per example: {copies}"


def test_other_uses_copy_the_weights_and_agree(copies):
    # W.T, W[...], W * W, sum(W), sin(W): the broadcast copy, beside frontier uses of W
    def loss(w, b, x):
        return (ad.sum(ad.sin(x @ w + b)) + ad.sum(w * w) * ad.sum(x) + ad.sum(w.T @ x[:4])
                + ad.sum(ad.sin(w[1:3, :2]) * b[:2]) + ad.sum(w) * b[0])

    def tloss(w, b, x):
        return ((torch.sin(x @ w + b)).sum() + (w * w).sum() * x.sum() + (w.T @ x[:4]).sum()
                + (torch.sin(w[1:3, :2]) * b[:2]).sum() + w.sum() * b[0])
    got = ad.vmap(ad.grad(loss, argnums=(0, 1)), in_axes=(None, None, 0))(W, B, X)
    want = func.vmap(func.grad(tloss, argnums=(0, 1)), in_dims=(None, None, 0))(
        T(W), T(B), T(X))
    for g, h in zip(got, want):
        close(g, h)
    assert sorted(copies) == [(5, 3), (5, 4, 3)]      # one copy of each, made once


def mlp(params, x, y):
    (w1, b1), (w2, b2) = params
    z = ad.tanh(x @ w1 + b1) @ w2 + b2
    return ad.logsumexp(z) - ad.sum(z * y)


def tmlp(params, x, y):
    (w1, b1), (w2, b2) = params
    z = torch.tanh(x @ w1 + b1) @ w2 + b2
    return z.logsumexp(0) - (z * y).sum()


def test_the_benchmarks_mlp_makes_no_copy_and_matches_torch(copies):
    params = [(rng.normal(size=(4, 6)), rng.normal(size=6)),
              (rng.normal(size=(6, 3)), rng.normal(size=3))]
    y = np.eye(3)[rng.integers(0, 3, 5)]
    tparams = [tuple(T(p) for p in layer) for layer in params]
    (value, aux), got = ad.vmap(ad.value_and_grad(lambda p, x, y: (mlp(p, x, y), x * 2.0),
                                                  has_aux=True),
                                in_axes=(None, 0, 0))(params, X, y)
    want = func.vmap(func.grad(tmlp), in_dims=(None, 0, 0))(tparams, T(X), T(y))
    for layer, tlayer in zip(got, want):
        for g, h in zip(layer, tlayer):
            close(g, h)
    close(value, func.vmap(tmlp, in_dims=(None, 0, 0))(tparams, T(X), T(y)))
    np.testing.assert_array_equal(aux, X * 2.0)
    assert copies == []
    # grad with has_aux: (gradient, aux)
    got, aux = ad.vmap(ad.grad(lambda p, x, y: (mlp(p, x, y), ad.sum(x)), has_aux=True),
                       in_axes=(None, 0, 0))(params, X, y)
    close(got[0][0], want[0][0])
    np.testing.assert_allclose(aux, X.sum(axis=1), rtol=1e-14)


def test_unused_weights_zero_and_mixed_leaves():
    # an unused weight: zeros per example; a 0-d leaf and an array in one argument
    def loss(p, x):
        w, c, v = p
        return ad.sum(ad.tanh(x @ w)) * c
    p = (W, np.float64(0.7), np.ones(2))
    got = ad.vmap(ad.grad(loss), in_axes=(None, 0))(p, X)
    for k in range(5):
        want = ad.grad(loss)(p, X[k])
        for g, h in zip(got, want):
            np.testing.assert_allclose(g[k], h, rtol=1e-12, atol=1e-12)
    assert got[2].shape == (5, 2) and not got[2].any()
    # the weights and a batched argument differentiated together
    got = ad.vmap(ad.grad(lambda w, x: ad.sum(ad.sin(x @ w) * x[0]), argnums=(0, 1)),
                  in_axes=(None, 0))(W, X)
    want = func.vmap(func.grad(lambda w, x: (torch.sin(x @ w) * x[0]).sum(), argnums=(0, 1)),
                     in_dims=(None, 0))(T(W), T(X))
    for g, h in zip(got, want):
        close(g, h)


def test_nested_vmaps_and_closures_keep_the_general_path():
    xx = rng.normal(size=(2, 5, 4))

    def loss(p, x):
        w, b = p
        return ad.sum(ad.tanh(x @ w + b) * b)
    inner = ad.vmap(ad.grad(loss), in_axes=(None, 0))
    got = ad.vmap(inner, in_axes=(None, 0))((W, B), xx)
    per_row = ad.vmap(lambda x: ad.grad(lambda p: loss(p, x))((W, B)))(xx[0])
    for i in range(2):
        for j in range(5):
            want = ad.grad(loss)((W, B), xx[i, j])
            for g, h in zip(got, want):
                np.testing.assert_allclose(g[i, j], h, rtol=1e-12, atol=1e-12)
            if i == 0:
                for g, h in zip(per_row, want):
                    np.testing.assert_allclose(g[j], h, rtol=1e-12, atol=1e-12)


def test_transforms_inside_and_around_against_torch():
    # a transform opened inside f (a gradient penalty, an inner gradient by the weights)
    # reads the broadcast copy: a probe's product would take W as a constant there, and
    # the second derivatives through it would be wrong
    tw, tx = T(W), T(X)

    def penalty(w, x):
        g = ad.grad(lambda z: ad.sum(ad.tanh(z @ w)))(x)
        return ad.sum(g ** 2) + ad.sum(ad.sin(x @ w))

    def tpenalty(w, x):
        g = func.grad(lambda z: torch.tanh(z @ w).sum())(x)
        return (g ** 2).sum() + torch.sin(x @ w).sum()

    def inner_by_w(w, x):
        return ad.sum(ad.grad(lambda v: ad.sum(ad.tanh(x @ v)))(w) * w)

    def tinner_by_w(w, x):
        return (func.grad(lambda v: torch.tanh(x @ v).sum())(w) * w).sum()
    for ours, theirs in ((penalty, tpenalty), (inner_by_w, tinner_by_w)):
        close(ad.vmap(ad.grad(ours), in_axes=(None, 0))(W, X),
              func.vmap(func.grad(theirs), in_dims=(None, 0))(tw, tx))

    # transforms around the vmap: the general path
    def loss(w, x):
        return ad.sum(ad.tanh(x @ w))

    def tloss(w, x):
        return torch.tanh(x @ w).sum()
    V = rng.normal(size=W.shape)
    per_example = ad.vmap(ad.grad(loss), in_axes=(None, 0))
    tper_example = func.vmap(func.grad(tloss), in_dims=(None, 0))
    close(ad.jvp(lambda w: per_example(w, X), W, V)[1],
          func.jvp(lambda w: tper_example(w, tx), (tw,), (T(V),))[1])
    close(ad.grad(lambda w: ad.sum(per_example(w, X) ** 2))(W),
          func.grad(lambda w: (tper_example(w, tx) ** 2).sum())(tw))
