"""TensorFunction batches on the numpy device whose fused programs have matmul, linear,
reduce and guard steps (easyad/compiler/program/batch_np.py): each run of C steps one
loop over the points, each product step one product for the whole batch; checked
against one replay per point, torch.func.vmap and hand-derived formulas."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
import easyad.nn.functional as nf
from easyad.compiler.program import batch_np, fused_c

torch = pytest.importorskip("torch")
tf = pytest.importorskip("torch.func")

_rng = np.random.default_rng(40)
W1 = _rng.normal(size=(6, 6)) / 2
W2 = _rng.normal(size=(6, 6)) / 2
A = _rng.normal(size=(5, 6))
Y = _rng.normal(size=5)
WL = _rng.normal(size=(5, 4)) / 2
BL = _rng.normal(size=5)
WO = _rng.normal(size=(1, 5)) / 2
XL = _rng.normal(size=(3, 4))
TL = _rng.normal(size=(3, 1))
WC = _rng.normal(size=(4, 3))
TARGET = np.array([2, 0, 1, 1])
W3 = _rng.normal(size=(2, 4, 5)) / 2
L = _rng.normal(size=(5, 3))


def _t(a, like):
    return torch.tensor(a, dtype=like.dtype)


def _c(a, x):       # a constant in x's dtype (float32 programs stay float32)
    return a.astype(np.float32) if str(x.dtype).endswith("float32") else a


def mlp(x, m=ad):                # x @ W twice: the points' rows one GEMM each
    return m.sum(m.tanh(m.tanh(x @ _c(W1, x)) @ _c(W2, x))) if m is ad else \
        torch.sum(torch.tanh(torch.tanh(x @ _t(W1, x)) @ _t(W2, x)))


def least_squares(w, m=ad):      # A @ w with A constant: the vectors as rows of one product
    if m is ad:
        return ad.sum((A @ w - Y) ** 2)
    return torch.sum((_t(A, w) @ w - _t(Y, w)) ** 2)


def gram(x, m=ad):               # both operands the point's own (a stack of products)
    return ad.sum(ad.tanh(x @ x.T)) if m is ad else torch.sum(torch.tanh(x @ x.T))


def layers(x, m=ad):             # linear steps with biases, a point a mini-batch of rows
    if m is ad:
        return ad.sum(nf.linear(ad.tanh(nf.linear(x, _c(WL, x), _c(BL, x))), _c(WO, x),
                                 0.5))
    h = torch.tanh(torch.nn.functional.linear(x, _t(WL, x), _t(BL, x)))
    return torch.sum(torch.nn.functional.linear(h, _t(WO, x)) + 0.5)


def reduced(x, m=ad):            # reductions over some axes
    if m is ad:
        return ad.sum(ad.sin(ad.sum(x @ W1[:4, :4], axis=0)) * ad.sum(x * x, axis=1)[0])
    y = x @ _t(W1[:4, :4], x)
    return torch.sum(torch.sin(y.sum(0)) * (x * x).sum(1)[0])


def entropy(x, m=ad):            # cross-entropy of tanh(x @ WC) (softmax_c's C functions)
    if m is ad:
        return nf.cross_entropy(ad.tanh(x @ WC), TARGET)
    return torch.nn.functional.cross_entropy(torch.tanh(x @ _t(WC, x)), torch.tensor(TARGET))


def stacked(x, m=ad):            # a shared stack of matrices against the point's matrix
    return ad.sum(ad.sin(x @ W3)) if m is ad else torch.sum(torch.sin(x @ _t(W3, x)))


def left(x, m=ad):               # a shared matrix on the left of the point's matrix
    return ad.sum(ad.sin(L @ x)) if m is ad else torch.sum(torch.sin(_t(L, x) @ x))


def parameters(d, m=ad):         # the point a layer's parameters: a bias row a point
    if m is ad:
        return ad.sum((nf.linear(ad.tanh(nf.linear(XL, d["w"], d["b"])), WO) - TL) ** 2)
    x = _t(XL, d["w"])
    h = torch.tanh(torch.nn.functional.linear(x, d["w"], d["b"]))
    return torch.sum((torch.nn.functional.linear(h, _t(WO, x)) - _t(TL, x)) ** 2)


PROGRAMS = {"mlp": (mlp, (6,)), "least squares": (least_squares, (6,)),
            "gram": (gram, (3, 4)), "layers": (layers, (3, 4)), "reduced": (reduced, (3, 4)),
            "entropy": (entropy, (4, 4)), "stacked": (stacked, (3, 4)), "left": (left, (3, 2))}
CASES = [(name, np.float64) for name in sorted(PROGRAMS)] + [
    ("mlp", np.float32), ("layers", np.float32)]


@pytest.fixture
def products(monkeypatch):
    """The shapes of the batched programs' products."""
    made = []
    original = batch_np._matmul

    def counting(a, b):
        made.append((a.shape, b.shape))
        return original(a, b)
    monkeypatch.setattr(batch_np, "_matmul", counting)
    return made


def _check(got, want, dtype, tol=None):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = tol or (1e-12 if dtype == np.float64 else 1e-5)
    scale = np.abs(want).max() if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


def _expected_products(fused):
    count = 0
    for kind, item in fused.plan.schedule:
        if kind == "py" and item.op in ("matmul", "linear"):
            count += 1
        elif kind == "py" and item.op == "linear_vjp":
            count += sum(item.params.needs[:2])
    return count


def _torch(f, X, V, dtype):
    """value, gradient, hvp (direction a point, and V[0] for all) by torch.func.vmap."""
    x, v = torch.tensor(X), torch.tensor(V)
    g = tf.grad(lambda z: f(z, torch))
    values = tf.vmap(lambda z: f(z, torch))(x)
    grads = tf.vmap(g)(x)
    hvp = tf.vmap(lambda z, d: tf.jvp(g, (z,), (d,))[1])(x, v)
    shared = tf.vmap(lambda z: tf.jvp(g, (z,), (v[0],))[1])(x)
    return [t.numpy() for t in (values, grads, hvp, shared)]


@pytest.mark.parametrize("name, dtype", CASES)
def test_programs_batch(name, dtype, products):
    f, shape = PROGRAMS[name]
    F = ad.record(f, np.ones(shape, dtype=dtype), tensor=True)
    rng = np.random.default_rng(41)
    count = 9
    X = rng.normal(size=(count,) + shape).astype(dtype)
    V = rng.normal(size=(count,) + shape).astype(dtype)
    values, grads = F.value_and_gradient(X)
    fused = F._bound["gradient"]
    assert isinstance(fused, fused_c.FusedProgram) and not fused.batchable()
    assert batch_np.batched(fused) is not None
    # one product per product step for the whole batch, not one per point
    assert len(products) == _expected_products(fused) > 0
    assert values.dtype == grads.dtype == dtype     # (constants in x's dtype)
    batch = [values, grads, F(X), F.hvp(X, V), F.hvp(X, V[0])]
    points = [np.stack(k) for k in zip(*[(
        *F.value_and_gradient(X[b]), F(X[b]), F.hvp(X[b], V[b]), F.hvp(X[b], V[0]))
        for b in range(count)])]
    points[0] = points[0].astype(dtype)           # (a point's value: a Python float)
    points[2] = points[2].astype(dtype)
    for got, want in zip(batch, points):          # one replay per point
        _check(got, want, dtype)
    want = _torch(f, X, V, dtype)
    tol = 1e-10 if dtype == np.float64 else 1e-4
    for got, ref in zip([values, grads, batch[3], batch[4], batch[2]], want + [want[0]]):
        _check(got, ref.astype(got.dtype), dtype, tol)


def test_softmax_is_lowered_and_batched():
    F = ad.record(entropy, np.ones((4, 4)), tensor=True)
    F.value_and_gradient(np.ones((2, 4, 4)))
    fused = F._bound["gradient"]
    assert fused.lowered and batch_np.batched(fused) is not None


def test_parameters_as_the_point(products):
    """Per-point weights and biases with the data shared: hand-derived gradients."""
    x0 = {"w": np.ones((5, 4)), "b": np.ones(5)}
    F = ad.record(parameters, x0, tensor=True)
    rng = np.random.default_rng(42)
    X = {"w": rng.normal(size=(8, 5, 4)), "b": rng.normal(size=(8, 5))}
    values, grads = F.value_and_gradient(X)
    assert batch_np.batched(F._bound["gradient"]) is not None and products
    h = np.tanh(np.einsum("nk,bmk->bnm", XL, X["w"]) + X["b"][:, None, :])
    r = h @ WO.T - TL                                         # (B, 3, 1)
    np.testing.assert_allclose(values, np.sum(r * r, axis=(1, 2)), rtol=1e-12)
    dz = (2 * r @ WO) * (1 - h * h)                           # (B, 3, 5)
    np.testing.assert_allclose(grads["b"], dz.sum(axis=1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads["w"], np.einsum("bnm,nk->bmk", dz, XL), rtol=1e-12,
                               atol=1e-12)
    for b in (0, 7):
        value, g = F.value_and_gradient({"w": X["w"][b], "b": X["b"][b]})
        _check(values[b], value, np.float64)
        _check(grads["w"][b], g["w"], np.float64)


def test_least_squares_against_formulas():
    rng = np.random.default_rng(43)
    X, V = rng.normal(size=(40, 6)), rng.normal(size=(40, 6))
    F = ad.record(least_squares, np.ones(6), tensor=True)
    values, grads = F.value_and_gradient(X)
    r = X @ A.T - Y
    np.testing.assert_allclose(values, np.sum(r * r, axis=1), rtol=1e-12)
    np.testing.assert_allclose(grads, 2 * r @ A, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(F.hvp(X, V), 2 * V @ A.T @ A, rtol=1e-12, atol=1e-12)
    # the Hessian: the hvp program at every unit direction, one batch
    np.testing.assert_allclose(F.hessian(X[0]), 2 * A.T @ A, rtol=1e-12, atol=1e-12)


def test_chunks_one_product_per_step_and_chunk(monkeypatch, products):
    F = ad.record(mlp, np.ones(6), tensor=True)
    X = np.random.default_rng(44).normal(size=(30, 6))
    whole = F.value_and_gradient(X)
    fused = F._bound["gradient"]
    program = batch_np.batched(fused)
    monkeypatch.setattr(batch_np, "_BUDGET", 4 * (program.per_point + 6 * 8))  # x's row too
    products.clear()
    chunked = F.value_and_gradient(X)
    size = products[0][0][0]             # the points of a chunk (x @ W1's rows)
    assert 1 < size < 5 and len(products) == _expected_products(fused) * -(-30 // size)
    for got, want in zip(chunked, whole):
        np.testing.assert_array_equal(got, want)


def test_threads_give_the_same_bits(monkeypatch):
    """The C runs of a batch over threads (each its own pointer table) and in one loop."""
    F = ad.record(mlp, np.ones(6), tensor=True)
    X = np.random.default_rng(45).normal(size=(64, 6))
    monkeypatch.setattr(batch_np, "_PARALLEL", 1)
    threaded = F.value_and_gradient(X)
    monkeypatch.setattr(batch_np, "_PARALLEL", 1 << 60)
    for got, want in zip(threaded, F.value_and_gradient(X)):
        np.testing.assert_array_equal(got, want)


def branchy(x):     # a guard on a product's value
    z = x @ W1
    return ad.sum(ad.tanh(z)) if bool(ad.sum(z) > 0.0) else ad.sum(ad.exp(z))


def test_guard_divergence_falls_back(products):
    rng = np.random.default_rng(46)
    X = rng.normal(size=(20, 6))
    up = X * np.sign((X @ W1).sum(axis=1))[:, None]          # every point: sum(z) > 0
    F = ad.record(branchy, up[0], tensor=True)
    values, grads = F.value_and_gradient(up)
    np.testing.assert_allclose(values, np.tanh(up @ W1).sum(axis=1), rtol=1e-12)
    assert batch_np.batched(F._bound["gradient"]) is not None and products
    mixed = up.copy()
    mixed[3] *= -1.0                                          # one point down the other branch
    with pytest.raises(ad.BranchChangedError):
        F.value_and_gradient(mixed)
    R = ad.record(branchy, up[0], tensor=True, on_branch_change="retape")
    values, grads = R.value_and_gradient(mixed)
    z = mixed @ W1
    positive = z.sum(axis=1) > 0
    np.testing.assert_allclose(values, np.where(positive, np.tanh(z).sum(axis=1),
                                                np.exp(z).sum(axis=1)), rtol=1e-12)
    want = np.where(positive[:, None], (1 - np.tanh(z) ** 2) @ W1.T, np.exp(z) @ W1.T)
    np.testing.assert_allclose(grads, want, rtol=1e-12, atol=1e-12)


def test_one_c_loop_programs_keep_their_path(monkeypatch):
    """A program with no Python step still runs in one C loop (run_batch)."""
    F = ad.record(lambda x: ad.sum(ad.sin(x) * x), np.ones(5), tensor=True)
    X = np.random.default_rng(47).normal(size=(6, 5))
    monkeypatch.setattr(batch_np, "batched", lambda fused: pytest.fail("not one C loop"))
    values, grads = F.value_and_gradient(X)
    assert F._bound["gradient"].batchable()
    np.testing.assert_allclose(grads, np.cos(X) * X + np.sin(X), rtol=1e-14)


def test_jacobian_is_one_batch(products):
    """``F.jacobian``: the vjp program at every unit direction of the output, one batch
    (one product per product step for all the directions)."""
    F = ad.record(lambda x: ad.tanh(x @ W1) * 2.0, np.ones(6), tensor=True)
    x = np.random.default_rng(48).normal(size=6)
    t = np.tanh(x @ W1)
    np.testing.assert_allclose(F.jacobian(x), (2 * (1 - t * t))[:, None] * W1.T,
                               rtol=1e-12, atol=1e-14)
    assert len(products) == 2 and all(a[0] == 6 for a, _ in products)


def _scaled_by_argmax(x):     # a keyed guard (the argmax read on the host) and a product
    return ad.sum(ad.tanh(x @ W1)) * float(1 + np.argmax(x))


def test_a_keyed_guard_in_a_batch(products):
    F = ad.record(_scaled_by_argmax, np.array([0.0, 1.0, 0.0, 0.5, 0.0, 0.0]), tensor=True)
    X = np.random.default_rng(49).uniform(0.0, 1.0, size=(20, 6))
    X[:, 1] = 2.0                                   # the recorded argmax at every point
    values, grads = F.value_and_gradient(X)
    t = np.tanh(X @ W1)
    np.testing.assert_allclose(values, 2.0 * t.sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(grads, 2.0 * (1 - t * t) @ W1.T, rtol=1e-12, atol=1e-12)
    assert batch_np.batched(F._bound["gradient"]) is not None and products
    X[5, 3] = 3.0                                   # one point with another argmax
    with pytest.raises(ad.BranchChangedError):
        F.value_and_gradient(X)


def test_other_python_steps_replay_point_by_point(products):
    """A step ``batch_np`` does not batch (det: a backend op) keeps one replay per point."""
    def f(x):
        return ad.linalg.det(ad.tanh(x @ W1[:4, :4]).reshape((2, 2)) + 3.0)
    F = ad.record(f, np.full(4, 0.1), tensor=True)
    X = np.random.default_rng(50).normal(size=(5, 4)) / 4
    values, grads = F.value_and_gradient(X)
    assert batch_np.batched(F._bound["gradient"]) is None and not products
    t = np.tanh(X @ W1[:4, :4]).reshape(5, 2, 2) + 3.0
    np.testing.assert_allclose(values, np.linalg.det(t), rtol=1e-12)
    for b in (0, 4):
        np.testing.assert_array_equal(grads[b], F.gradient(X[b]))
