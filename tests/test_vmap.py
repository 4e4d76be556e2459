"""ad.vmap against torch.func.vmap (float64, 1e-10): elementwise, reductions, matmul and
an MLP, indexing, concatenate, nested vmaps, in_axes/out_axes, per-example derivatives,
recorded replays, and bad input."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad

torch = pytest.importorskip("torch")
func = torch.func
TOL = 1e-10


def tv(f, in_axes=0, out_axes=0):
    """torch.func.vmap with JAX's (and easyad's) keyword names."""
    return func.vmap(f, in_dims=in_axes, out_dims=out_axes)
rng = np.random.default_rng(27)


def T(a):
    return torch.tensor(np.asarray(a), dtype=torch.float64)


def close(ours, theirs):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    ours = np.asarray(ours.value if hasattr(ours, "value") else ours)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    np.testing.assert_allclose(ours, theirs, rtol=TOL, atol=TOL)


X = rng.normal(size=(5, 3))
Y = rng.normal(size=(5, 3))
W = rng.normal(size=(3, 4))


@pytest.mark.parametrize("case", ["elementwise", "broadcast", "reductions", "max",
                                  "mean", "reshape", "transpose", "index", "slice",
                                  "concatenate", "where", "logsumexp"])
def test_against_torch(case):
    ours, theirs = {
        "elementwise": (lambda x, y: ad.sin(x) * y + ad.exp(x) / (1.0 + y * y),
                        lambda x, y: torch.sin(x) * y + torch.exp(x) / (1.0 + y * y)),
        "broadcast": (lambda x, y: x[:, None] * y + x,
                      lambda x, y: x[:, None] * y + x),
        "reductions": (lambda x, y: ad.sum(x * y) + (x * x).sum(axis=0),
                       lambda x, y: (x * y).sum() + (x * x).sum(0)),
        "max": (lambda x, y: x.max() + y.min(axis=0),
                lambda x, y: x.max() + y.min(0).values),
        "mean": (lambda x, y: ad.mean(x * y), lambda x, y: (x * y).mean()),
        "reshape": (lambda x, y: (x * y).reshape(3, 1) @ x.reshape(1, 3),
                    lambda x, y: (x * y).reshape(3, 1) @ x.reshape(1, 3)),
        "transpose": (lambda x, y: (x.reshape(3, 1) * y).T * 2.0,
                      lambda x, y: (x.reshape(3, 1) * y).T * 2.0),
        "index": (lambda x, y: x[np.array([2, 0])] * y[1],
                  lambda x, y: x[torch.tensor([2, 0])] * y[1]),
        "slice": (lambda x, y: x[1:] - y[:-1], lambda x, y: x[1:] - y[:-1]),
        "concatenate": (lambda x, y: ad.concatenate([x, y * 2.0, np.ones(2)]),
                        lambda x, y: torch.cat([x, y * 2.0, torch.ones(2, dtype=x.dtype)])),
        "where": (lambda x, y: ad.where(x > 0.0, x * y, -y),
                  lambda x, y: torch.where(x > 0.0, x * y, -y)),
        "logsumexp": (lambda x, y: ad.logsumexp(x * y), lambda x, y: (x * y).logsumexp(0)),
    }[case]
    close(ad.vmap(ours)(X, Y), tv(theirs)(T(X), T(Y)))


def _mlp(params, x):
    (w1, b1), (w2, b2) = params
    h = ad.tanh(x @ w1 + b1)
    return ad.logsumexp(h @ w2 + b2)


def _torch_mlp(params, x):
    (w1, b1), (w2, b2) = params
    return (torch.tanh(x @ w1 + b1) @ w2 + b2).logsumexp(0)


PARAMS = [(rng.normal(size=(3, 6)), rng.normal(size=6)), (rng.normal(size=(6, 2)),
                                                          rng.normal(size=2))]
TPARAMS = [tuple(T(p) for p in layer) for layer in PARAMS]


def test_matmul_both_sides_and_mlp():
    close(ad.vmap(lambda x: W.T @ x)(X), tv(lambda x: T(W).T @ x)(T(X)))
    A = rng.normal(size=(5, 3, 3))
    close(ad.vmap(lambda a, x: a @ x)(A, X), tv(lambda a, x: a @ x)(T(A), T(X)))
    close(ad.vmap(lambda a: a @ W)(A), tv(lambda a: a @ T(W))(T(A)))
    close(ad.vmap(_mlp, in_axes=(None, 0))(PARAMS, X),
          tv(_torch_mlp, in_axes=(None, 0))(TPARAMS, T(X)))


def test_per_example_gradients_of_an_mlp():
    ours = ad.vmap(ad.grad(_mlp), in_axes=(None, 0))(PARAMS, X)
    theirs = tv(func.grad(_torch_mlp), in_axes=(None, 0))(TPARAMS, T(X))
    for a, b in zip(ours, theirs):
        for p, q in zip(a, b):
            close(p, q)
    # the input gradient too (argnums), and value_and_grad's per-example values
    v, g = ad.vmap(ad.value_and_grad(_mlp, argnums=1), in_axes=(None, 0))(PARAMS, X)
    close(g, tv(func.grad(_torch_mlp, argnums=1), in_axes=(None, 0))(TPARAMS, T(X)))
    close(v, tv(_torch_mlp, in_axes=(None, 0))(TPARAMS, T(X)))


def f3(x):
    return ad.sum(ad.sin(x) * x[0]) + x[1] ** 3


def t3(x):
    return (torch.sin(x) * x[0]).sum() + x[1] ** 3


def test_hessians_jacobians_and_vjps():
    close(ad.vmap(ad.hessian(f3))(X), tv(func.hessian(t3))(T(X)))
    g = lambda x: ad.sin(x) * x[0] + x ** 2        # noqa: E731
    tg = lambda x: torch.sin(x) * x[0] + x ** 2    # noqa: E731
    for mode in ("forward", "reverse", "auto"):
        close(ad.vmap(ad.jacobian(g, mode=mode))(X), tv(func.jacrev(tg))(T(X)))
    # the Jacobian as a vmap of vjps over the basis of the outputs
    x0 = X[0]
    rows = ad.vmap(lambda u: ad.vjp(g, x0, u)[1])(np.eye(3))
    close(rows, func.jacrev(tg)(T(x0)))
    cols = ad.vmap(lambda v: ad.jvp(g, x0, v)[1], out_axes=1)(np.eye(3))
    close(cols, func.jacfwd(tg)(T(x0)))
    close(ad.vmap(lambda x, v: ad.hvp(f3, x, v))(X, Y),
          tv(lambda x, v: func.jvp(func.grad(t3), (x,), (v,))[1])(T(X), T(Y)))


def test_closures_keep_the_levels_apart():
    # the inner grad differentiates w only; x, batched, is a constant of it
    ours = ad.vmap(lambda x: ad.grad(lambda w: ad.sum(ad.sin(w * x) * x))(W[:, 0]))(X)
    theirs = tv(lambda x: func.grad(lambda w: (torch.sin(w * x) * x).sum())(
        T(W[:, 0])))(T(X))
    close(ours, theirs)
    # a Jacobian (the basis batched around the batch) of a function closing over y
    for mode in ("forward", "reverse"):
        close(ad.vmap(lambda x, y: ad.jacobian(lambda v: ad.sin(v * y) * y[0], mode=mode)(x))(
            X, Y), tv(lambda x, y: func.jacrev(lambda v: torch.sin(v * y) * y[0])(x))(T(X), T(Y)))
    # grad of a function that calls vmap: the outer variable closed over by the batch
    outer = ad.grad(lambda w: ad.sum(ad.vmap(lambda x: ad.sum(ad.tanh(x @ w)))(X)))(W)
    touter = func.grad(lambda w: tv(lambda x: torch.tanh(x @ w).sum())(T(X)).sum())(
        T(W))
    close(outer, touter)


def test_nested_vmap_and_axes():
    Z = rng.normal(size=(5, 3, 4))
    close(ad.vmap(ad.vmap(lambda z, w: ad.sum(z * w), in_axes=(1, None)),
                  in_axes=(0, None))(Z, W[:, 0]),
          tv(tv(lambda z, w: (z * w).sum(), in_axes=(1, None)),
                    in_axes=(0, None))(T(Z), T(W[:, 0])))
    # an inner vmap over another axis, closing over the outer example
    ours = ad.vmap(lambda x: ad.vmap(lambda w: ad.sum(x * w), in_axes=1)(W))(X)
    theirs = tv(lambda x: tv(lambda w: (x * w).sum(), in_axes=1)(T(W)))(T(X))
    close(ours, theirs)
    close(ad.vmap(lambda z: z * 2.0, in_axes=2, out_axes=1)(Z),
          tv(lambda z: z * 2.0, in_axes=2, out_axes=1)(T(Z)))
    out = ad.vmap(lambda x: (x.sum(), 3.0 * x), out_axes=(0, -1))(X)
    close(out[1], (3.0 * X).T)
    close(ad.vmap(ad.vmap(ad.grad(f3)))(Z.transpose(0, 2, 1)),
          tv(tv(func.grad(t3)))(T(Z.transpose(0, 2, 1))))


def test_recorded_replays_on_numpy_and_opencl():
    F = ad.record(ad.vmap(lambda x: ad.sum(ad.tanh(x @ W) * 2.0)), X, tensor=True)
    close(F(Y), tv(lambda x: (torch.tanh(x @ T(W)) * 2.0).sum())(T(Y)))
    opencl = [d for d in ad.devices() if getattr(d, "kind", "") == "opencl"]
    if opencl:
        G = ad.record(ad.vmap(lambda x: ad.sum(ad.sin(x) * x)), X, tensor=True,
                      device=opencl[0])
        close(G(Y), (np.sin(Y) * Y).sum(1))
        eager = ad.vmap(lambda x: ad.sum(ad.tanh(x @ W) * x[0]))(
            ad.Tensor.constant(Y, device=opencl[0]))
        close(eager, (np.tanh(Y @ W) * Y[:, :1]).sum(1))


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="different sizes"):
        ad.vmap(lambda x, y: x + y)(X, np.ones((4, 3)))
    with pytest.raises(ValueError, match="in_axes has 1 entries for 2"):
        ad.vmap(lambda x, y: x + y, in_axes=(0,))(X, Y)
    with pytest.raises(ValueError, match="has no axis 2"):
        ad.vmap(lambda x: x, in_axes=2)(X)
    with pytest.raises(TypeError, match="in_axes takes ints"):
        ad.vmap(lambda x: x, in_axes="0")
    with pytest.raises(ValueError, match="maps no argument"):
        ad.vmap(lambda x: x, in_axes=None)(X)
    with pytest.raises(TypeError, match="Python control flow"):
        ad.vmap(lambda x: x if x[0] > 0 else -x)(X)
    with pytest.raises(ValueError, match="out_axes None"):
        ad.vmap(lambda x: x, out_axes=None)(X)
    # every op of the table batches (put by a rule of vmap's own: it needs the size), so
    # an op without one is registered here
    import dataclasses
    unbatched = dataclasses.replace(ad.ops.get("put"), name="put_unbatched_for_test")
    ad.ops.register(unbatched)
    try:
        with pytest.raises(NotImplementedError, match="no batching rule"):
            ad.vmap(lambda x: ad.ops.call(unbatched, (x,),
                                          {"shape": (4,), "key": (slice(0, 3),)}))(X)
    finally:
        ad.ops.unregister("put_unbatched_for_test")


def test_the_outer_product_path_of_the_numpy_matmul():
    # per-example gradients of a linear layer are stacks of outer products (k = 1): the
    # numpy device multiplies instead of calling np.matmul; same numbers, same shapes
    from easyad.tensor import _blas
    a, b = rng.normal(size=(4, 3, 1)), rng.normal(size=(4, 1, 5))
    assert np.array_equal(_blas.matmul(a, b), np.matmul(a, b))
    assert np.array_equal(_blas.matmul(a, b[0]), np.matmul(a, b[0]))
    assert np.array_equal(_blas.matmul(a, np.ones(1)), np.matmul(a, np.ones(1)))
