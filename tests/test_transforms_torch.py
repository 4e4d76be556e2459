"""The transforms over arrays and structures, validated against PyTorch's torch.func.

Each case is one function written twice, for easyad and for torch, of an array or a
structure of arrays (dicts, tuples); every transform (grad, value_and_grad, jacobian by
both modes, hessian, hvp, jvp, vjp) must agree with its torch.func counterpart (grad,
jacrev, jacfwd, hessian, jvp of grad, jvp, vjp) to 1e-10 in float64, on numpy and on
every working OpenCL device. Points are random without ties (max, maximum and where are
differentiable there).
"""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad

torch = pytest.importorskip("torch")
tf = pytest.importorskip("torch.func")

TOL = 1e-10


@pytest.fixture
def on_device(device):
    previous = ad.get_device()
    ad.set_device(device)
    yield device
    ad.set_device(previous)


def _torch(x):
    if isinstance(x, dict):
        return {k: _torch(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_torch(v) for v in x)
    return torch.tensor(np.asarray(x), dtype=torch.float64)


def _numpy(x):
    if isinstance(x, dict):
        return {k: _numpy(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_numpy(v) for v in x)
    if isinstance(x, torch.Tensor):
        return x.detach().numpy()
    return np.asarray(x)


def close(ours, theirs, what=""):
    """Same structure, same values (to TOL, relative to the larger magnitudes)."""
    theirs = _numpy(theirs)
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and set(ours) == set(theirs), what
        for k in theirs:
            close(ours[k], theirs[k], f"{what}[{k!r}]")
        return
    if isinstance(theirs, (tuple, list)):
        assert isinstance(ours, (tuple, list)) and len(ours) == len(theirs), what
        for i, (a, b) in enumerate(zip(ours, theirs)):
            close(a, b, f"{what}[{i}]")
        return
    a, b = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL * max(1.0, float(np.max(np.abs(b)))
                                                               if b.size else 1.0),
                               err_msg=what)


RNG = np.random.default_rng(20261123)


def _mlp():
    sizes = [(6, 5), (5, 3)]
    params = {}
    for k, (i, o) in enumerate(sizes):
        params[f"W{k}"] = RNG.normal(size=(o, i)) / np.sqrt(i)
        params[f"b{k}"] = RNG.normal(size=(o,)) * 0.1
    X = RNG.normal(size=(4, 6))
    labels = np.array([0, 2, 1, 2])

    def ours(p):
        h = ad.tanh(X @ p["W0"].T + p["b0"])
        logits = h @ p["W1"].T + p["b1"]
        return ad.mean(ad.logsumexp(logits, axis=1) - logits[np.arange(4), labels])

    def theirs(p):
        h = torch.tanh(torch.tensor(X) @ p["W0"].T + p["b0"])
        return torch.nn.functional.cross_entropy(h @ p["W1"].T + p["b1"],
                                                 torch.tensor(labels))
    return ours, theirs, params


def _softmax_ce():
    W = RNG.normal(size=(3, 4))
    onehot = np.eye(3)[[0, 2, 1, 1, 0]]
    X = RNG.normal(size=(5, 4))

    def ours(w):
        p = ad.softmax(X @ w.T, axis=1)
        return -ad.sum(onehot * ad.log(p)) / 5.0

    def theirs(w):
        p = torch.softmax(torch.tensor(X) @ w.T, dim=1)
        return -torch.sum(torch.tensor(onehot) * torch.log(p)) / 5.0
    return ours, theirs, W


def _logsumexp():
    return (lambda x: ad.logsumexp(x * x + x), lambda x: torch.logsumexp(x * x + x, 0),
            RNG.normal(size=5))


def _matmul_chain():
    p = {"A": RNG.normal(size=(3, 4)), "B": RNG.normal(size=(4, 2)), "c": RNG.normal(size=2)}
    return (lambda p: ad.sum(ad.sin(ad.tanh(p["A"] @ p["B"]) @ p["c"])),
            lambda p: torch.sum(torch.sin(torch.tanh(p["A"] @ p["B"]) @ p["c"])), p)


def _broadcasting():
    x = (RNG.normal(size=(3, 1)), RNG.normal(size=(1, 4)), RNG.normal(size=4))
    return (lambda t: ad.sum(ad.exp(t[0] * t[1] + t[2]) / (1.0 + t[0] ** 2)),
            lambda t: torch.sum(torch.exp(t[0] * t[1] + t[2]) / (1.0 + t[0] ** 2)), x)


def _indexing():
    x = RNG.normal(size=(4, 5))
    return (lambda x: ad.sum(x[1:, ::2] ** 3) * x[0, 1] + ad.sum(ad.sin(x[[0, 2, 2], 3])),
            lambda x: torch.sum(x[1:, ::2] ** 3) * x[0, 1] + torch.sum(torch.sin(x[[0, 2, 2], 3])),
            x)


def _reductions():
    x = RNG.normal(size=(3, 4))
    return (lambda x: ad.sum(ad.mean(x * x, axis=0) * ad.amax(x, axis=0))
            + ad.amin(ad.sum(x, axis=1)) ** 2,
            lambda x: torch.sum(torch.mean(x * x, 0) * torch.amax(x, 0))
            + torch.amin(torch.sum(x, 1)) ** 2, x)


def _joins():
    x = (RNG.normal(size=(2, 3)), RNG.normal(size=(1, 3)))
    return (lambda t: ad.sum(ad.cos(ad.concatenate([t[0], t[1] ** 2], axis=0)))
            * ad.sum(ad.stack([t[0][0], t[1][0]], axis=1) ** 3),
            lambda t: torch.sum(torch.cos(torch.cat([t[0], t[1] ** 2], 0)))
            * torch.sum(torch.stack([t[0][0], t[1][0]], 1) ** 3), x)


def _where_maximum():
    x = {"a": RNG.normal(size=6), "b": RNG.normal(size=6)}
    return (lambda p: ad.sum(ad.where(p["a"] > 0, p["a"] ** 3, ad.sin(p["b"]) * p["a"])
                             + ad.maximum(p["a"], p["b"]) ** 2),
            lambda p: torch.sum(torch.where(p["a"] > 0, p["a"] ** 3, torch.sin(p["b"]) * p["a"])
                                + torch.maximum(p["a"], p["b"]) ** 2), x)


CASES = {"mlp": _mlp, "softmax_cross_entropy": _softmax_ce, "logsumexp": _logsumexp,
         "matmul_chain": _matmul_chain, "broadcasting": _broadcasting, "indexing": _indexing,
         "reductions": _reductions, "concatenate_stack": _joins,
         "where_maximum": _where_maximum}


def _direction(x):
    if isinstance(x, dict):
        return {k: _direction(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_direction(v) for v in x)
    return RNG.normal(size=np.shape(x))


@pytest.mark.parametrize("case", sorted(CASES))
def test_scalar_functions_against_torch_func(case, on_device):
    ours, theirs, x = CASES[case]()
    tx, v = _torch(x), _direction(x)
    value, gradient = ad.value_and_grad(ours)(x)
    assert value == pytest.approx(float(theirs(tx)), rel=TOL, abs=TOL)
    close(gradient, tf.grad(theirs)(tx), f"{case} grad")
    close(ad.grad(ours)(x), gradient, f"{case} grad again")
    close(ad.hessian(ours)(x), tf.hessian(theirs)(tx), f"{case} hessian")
    close(ad.hvp(ours, x, v), tf.jvp(tf.grad(theirs), (tx,), (_torch(v),))[1], f"{case} hvp")
    close(ad.jvp(ours, x, v)[1], tf.jvp(theirs, (tx,), (_torch(v),))[1], f"{case} jvp")
    close(ad.vjp(ours, x, 2.5)[1], tf.vjp(theirs, tx)[1](torch.tensor(2.5))[0], f"{case} vjp")
    close(ad.jacobian(ours, mode="forward")(x), tf.jacfwd(theirs)(tx), f"{case} jacfwd")
    # hessian = jacobian of grad: both compositions of the transforms
    close(ad.jacobian(ad.grad(ours))(x), tf.hessian(theirs)(tx), f"{case} jacobian(grad)")


def _vector_case():
    x = {"W": RNG.normal(size=(3, 4)), "v": RNG.normal(size=4)}
    ours = lambda p: ad.softmax(p["W"] @ p["v"]) * ad.sum(p["W"] ** 2, axis=1)  # noqa: E731
    theirs = lambda p: torch.softmax(p["W"] @ p["v"], 0) * torch.sum(p["W"] ** 2, 1)  # noqa: E731
    return ours, theirs, x


def test_vector_functions_against_torch_func(on_device):
    ours, theirs, x = _vector_case()
    tx = _torch(x)
    close(ad.jacobian(ours, mode="reverse")(x), tf.jacrev(theirs)(tx), "jacrev")
    close(ad.jacobian(ours, mode="forward")(x), tf.jacfwd(theirs)(tx), "jacfwd")
    close(ad.jacobian(ours)(x), tf.jacrev(theirs)(tx), "jacobian auto")
    u, v = RNG.normal(size=3), _direction(x)
    close(ad.vjp(ours, x, u)[1], tf.vjp(theirs, tx)[1](torch.tensor(u))[0], "vjp")
    value, tangent = ad.jvp(ours, x, v)
    close(value, theirs(tx), "jvp value")
    close(tangent, tf.jvp(theirs, (tx,), (_torch(v),))[1], "jvp")


def test_mlp_module_hessian_against_torch_func(on_device):
    """An nn.Sequential's loss with respect to all its parameters (functional_call)."""
    model = ad.nn.Sequential(ad.nn.Linear(5, 4, generator=1), ad.nn.Tanh(),
                             ad.nn.Linear(4, 3, generator=2))
    params = {k: p.data for k, p in model.named_parameters()}
    X, labels = RNG.normal(size=(6, 5)), np.array([0, 1, 2, 2, 1, 0])
    ours = lambda p: ad.nn.cross_entropy(ad.nn.functional_call(model, p, X), labels)  # noqa: E731
    reference = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(),
                                    torch.nn.Linear(4, 3)).double()
    names = dict(zip(params, (n for n, _ in reference.named_parameters())))

    def theirs(p):
        out = tf.functional_call(reference, {names[k]: v for k, v in p.items()}, (_torch(X),))
        return torch.nn.functional.cross_entropy(out, torch.tensor(labels))
    tp = _torch(params)
    close(ad.grad(ours)(params), tf.grad(theirs)(tp), "grad")
    close(ad.hessian(ours)(params), tf.hessian(theirs)(tp), "hessian")
    v = _direction(params)
    close(ad.hvp(ours, params, v), tf.jvp(tf.grad(theirs), (tp,), (_torch(v),))[1], "hvp")


def test_scipy_style_args_pass_through_every_transform():
    f = lambda x, a, b: ad.sum(a * x ** 3) + b  # noqa: E731
    x, a = np.array([1.0, 2.0]), np.array([2.0, -1.0])
    expected_grad, expected_hessian = 3 * a * x ** 2, np.diag(6 * a * x)
    close(ad.grad(f)(x, a, 5.0), expected_grad)
    close(ad.grad(f)(x, args=(a, 5.0)), expected_grad)
    close(ad.value_and_grad(f)(x, args=(a, 5.0))[1], expected_grad)
    close(ad.jacobian(f, mode="forward")(x, args=(a, 5.0)), expected_grad)
    close(ad.jacobian(f, mode="reverse")(x, a, 5.0), expected_grad)
    close(ad.hessian(f)(x, args=(a, 5.0)), expected_hessian)
    close(ad.hvp(f, x, [1.0, 0.0], args=(a, 5.0)), expected_hessian[:, 0])
    close(ad.jvp(f, x, [1.0, 1.0], args=(a, 5.0))[1], expected_grad.sum())
    close(ad.vjp(f, x, 2.0, args=(a, 5.0))[1], 2 * expected_grad)
    assert ad.check_gradients(f, x, args=(a, 5.0)).max_error < 1e-6
    with pytest.raises(TypeError, match="not both"):
        ad.grad(f)(x, a, args=(5.0,))


def test_transforms_compose():
    g = lambda x: x ** 3 * ad.sin(x)  # noqa: E731
    t = torch.tensor(0.7, dtype=torch.float64)
    tg = lambda x: x ** 3 * torch.sin(x)  # noqa: E731
    assert ad.grad(ad.grad(g))(0.7) == pytest.approx(float(tf.grad(tf.grad(tg))(t)), rel=TOL)
    assert ad.grad(ad.grad(ad.grad(g)))(0.7) == pytest.approx(
        float(tf.grad(tf.grad(tf.grad(tg)))(t)), rel=TOL)
    f = lambda x: ad.sum(ad.exp(x[0] * x) * x[1:2])  # noqa: E731
    tfun = lambda x: torch.sum(torch.exp(x[0] * x) * x[1:2])  # noqa: E731
    x = np.array([0.3, -0.5, 0.8])
    close(ad.jacobian(ad.grad(f))(x), tf.jacrev(tf.grad(tfun))(_torch(x)))
    close(ad.jacobian(ad.jacobian(f, mode="reverse"), mode="reverse")(x),
          tf.hessian(tfun)(_torch(x)))


@pytest.mark.parametrize("case", ["mlp", "logsumexp", "indexing", "where_maximum"])
def test_modes_nest_in_every_order(case, on_device):
    """Forward over reverse (jacfwd of grad, jvp of grad), reverse over forward (grad of a
    jvp, jacrev of jacfwd) and forward over forward (scalars), against torch.func."""
    ours, theirs, x = CASES[case]()
    tx, v = _torch(x), _direction(x)
    H = tf.hessian(theirs)(tx)
    close(ad.jacobian(ad.grad(ours), mode="forward")(x), H, f"{case} jacfwd(grad)")
    close(ad.jvp(ad.grad(ours), x, v)[1], tf.jvp(tf.grad(theirs), (tx,), (_torch(v),))[1],
          f"{case} jvp(grad)")
    close(ad.grad(lambda z: ad.jvp(ours, z, v)[1])(x),
          tf.grad(lambda z: tf.jvp(theirs, (z,), (_torch(v),))[1])(tx), f"{case} grad(jvp)")
    close(ad.jacobian(ad.jacobian(ours, mode="forward"), mode="reverse")(x), H,
          f"{case} jacrev(jacfwd)")


def test_scalar_modes_nest_to_any_depth():
    g = lambda x: x ** 3 * ad.sin(x)  # noqa: E731
    tg = lambda x: x ** 3 * torch.sin(x)  # noqa: E731
    t = torch.tensor(0.7, dtype=torch.float64)
    second = float(tf.grad(tf.grad(tg))(t))
    third = float(tf.grad(tf.grad(tf.grad(tg)))(t))
    for d2 in (ad.derivative(ad.derivative(g)), ad.derivative(ad.grad(g)),
               ad.grad(ad.derivative(g)), ad.grad(ad.grad(g))):
        assert d2(0.7) == pytest.approx(second, rel=TOL)
    for d3 in (ad.derivative(ad.derivative(ad.derivative(g))),
               ad.grad(ad.derivative(ad.grad(g))), ad.derivative(ad.grad(ad.grad(g)))):
        assert d3(0.7) == pytest.approx(third, rel=TOL)
    x = np.array([0.7, -0.4])       # arrays nest as scalars do: three forward levels
    close(ad.jacobian(ad.jacobian(ad.jacobian(lambda x: ad.sum(ad.sin(x) * x ** 3),
                                              mode="forward"), mode="forward"),
                      mode="forward")(x),
          tf.jacfwd(tf.jacfwd(tf.jacfwd(lambda x: torch.sum(torch.sin(x) * x ** 3))))(
              _torch(x)), "jacfwd^3")


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_over_forward_on_arrays(case, on_device):
    """A forward transform inside a forward transform on arrays (TraceTensors of
    TraceTensors): jacfwd(jacfwd(f)) is the Hessian, jvp of a jvp a second directional
    derivative, against torch.func at 1e-10."""
    ours, theirs, x = CASES[case]()
    tx, v, w = _torch(x), _direction(x), _direction(x)
    close(ad.jacobian(ad.jacobian(ours, mode="forward"), mode="forward")(x),
          tf.jacfwd(tf.jacfwd(theirs))(tx), f"{case} jacfwd(jacfwd)")
    ours_vw = ad.jvp(lambda z: ad.jvp(ours, z, v)[1], x, w)
    theirs_vw = tf.jvp(lambda z: tf.jvp(theirs, (z,), (_torch(v),))[1], (tx,), (_torch(w),))
    close(ours_vw[0], theirs_vw[0], f"{case} jvp value")
    close(ours_vw[1], theirs_vw[1], f"{case} jvp(jvp)")


def test_forward_over_forward_vector_output(on_device):
    """jacfwd(jacfwd(g)) of a vector function: the (m, n, n) second derivatives."""
    A = RNG.normal(size=(3, 4))
    x = RNG.normal(size=4)

    def ours(x):
        return ad.concatenate([ad.tanh(A @ x) * x[:3], ad.softmax(x)[1:] ** 2])

    def theirs(x):
        return torch.cat([torch.tanh(torch.tensor(A) @ x) * x[:3], torch.softmax(x, 0)[1:] ** 2])
    close(ad.jacobian(ad.jacobian(ours, mode="forward"), mode="forward")(x),
          tf.jacfwd(tf.jacfwd(theirs))(_torch(x)), "vector jacfwd(jacfwd)")


def test_create_graph_through_every_tensor_operation(on_device):
    """Second derivatives by z.derivatives(create_graph=True) on tensors, against torch."""
    x0 = RNG.normal(size=(3, 4))
    lst = ad.WengertList()
    x = ad.Tensor.variable(x0, lst)
    y = ad.sum(ad.softmax(x @ x.T, axis=1) * ad.tanh(x[:, 1:]).T.reshape(3, 3))
    gx = y.derivatives(create_graph=True)[x]
    v = RNG.normal(size=x0.shape)
    hv = ad.sum(gx * v).derivatives()[x]

    def ty(t):
        return torch.sum(torch.softmax(t @ t.T, 1) * torch.tanh(t[:, 1:]).T.reshape(3, 3))
    tx = _torch(x0)
    close(gx.value, tf.grad(ty)(tx), "create_graph gradient")
    close(hv, tf.jvp(tf.grad(ty), (tx,), (_torch(v),))[1], "create_graph hvp")
