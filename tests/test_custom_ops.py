"""User array operations (``ad.primitive(vjp=...)``, ``ArrayPrimitive``) in every mode, and
``ad.eval_shape`` through them and through nn models and losses.

References: torch.autograd (gradients), torch.func.hessian (second derivatives through a
differentiable vjp), central differences (the fallback), and the operation written with
built-in tensor operations.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import easyad as ad

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(14)


# ---- the operations under test ----

def _logsumexp(x):
    m = np.max(x, axis=-1, keepdims=True)
    return (m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True)))[..., 0]


def _logsumexp_vjp(g, x, out):
    # softmax(x) * g, written with easyad operations: differentiable again
    return ad.exp(x - out[..., None]) * g[..., None]


logsumexp = ad.define("logsumexp_rows", _logsumexp, vjp=_logsumexp_vjp, differentiable=True,
                      shape=lambda x: x.shape[:-1])


@ad.primitive(vjp=lambda g, x, out: g / (1.0 + ad.exp(-x)), differentiable=True)
def softplus(x):
    return np.logaddexp(0.0, x)


@ad.primitive(vjp=lambda g, a, b, out: (g @ b.T, a.T @ g),
              jvp=lambda t, a, b, out: t[0] @ b + a @ t[1])
def matmul(a, b):
    return a @ b


@ad.primitive(vjp="numeric")
def box(x, y):
    return np.sin(x) * y + x ** 2


def _torch(a):
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)


def _weights(shape):
    return RNG.normal(size=shape)


# ---- values: plain arrays are just f ----

def test_plain_arrays_call_f():
    x = RNG.normal(size=(3, 4))
    np.testing.assert_allclose(logsumexp(x), np.log(np.exp(x).sum(-1)), rtol=1e-14)
    assert isinstance(softplus(np.array([0.0])), np.ndarray)
    assert softplus(0.0) == np.log(2.0)


# ---- reverse mode, against torch.autograd ----

def test_reverse_against_torch(device):
    x = RNG.normal(size=(4, 5))
    w = _weights((4,))
    lst = ad.WengertList()
    t = ad.Tensor.variable(x, lst, device=device)
    loss = ad.sum(logsumexp(t) * w) + ad.sum(softplus(t))
    tx = _torch(x)
    ref = (torch.logsumexp(tx, -1) * torch.tensor(w)).sum() + torch.nn.functional.softplus(tx).sum()
    ref.backward()
    assert abs(loss.number - ref.item()) < 1e-12
    np.testing.assert_allclose(loss.derivatives()[t], tx.grad.numpy(), rtol=1e-12, atol=1e-13)


def test_two_inputs_and_scalars(device):
    a, b = RNG.normal(size=(3, 4)), RNG.normal(size=(4, 2))
    lst = ad.WengertList()
    ta, tb = ad.Tensor.variable(a, lst, device=device), ad.Tensor.variable(b, lst, device=device)
    s = lst.variable(1.5)
    loss = ad.sum(matmul(ta, tb) * s)
    d = loss.derivatives()
    g = np.ones((3, 2)) * 1.5
    np.testing.assert_allclose(d[ta], g @ b.T, rtol=1e-13)
    np.testing.assert_allclose(d[tb], a.T @ g, rtol=1e-13)
    assert abs(d[s] - (a @ b).sum()) < 1e-12


def test_constant_operands_and_no_tape(device):
    x = RNG.normal(size=(2, 3))
    c = ad.Tensor.constant(x, device=device)
    out = softplus(c)
    assert out.tape is None
    np.testing.assert_allclose(out.value, np.logaddexp(0, x), rtol=1e-14)
    lst = ad.WengertList()
    b = ad.Tensor.variable(RNG.normal(size=(3, 2)), lst, device=device)
    d = ad.sum(matmul(x, b)).derivatives()      # a numpy array as a constant operand
    np.testing.assert_allclose(d[b], x.T @ np.ones((2, 2)), rtol=1e-13)


def test_float32_stays_float32(device):
    lst = ad.WengertList()
    t = ad.Tensor.variable(np.ones((2, 3), np.float32), lst, device=device)
    out = softplus(t)
    assert out.dtype == np.float32
    assert ad.sum(out).derivatives()[t].dtype == np.float32


def test_scalar_output_is_a_record():
    lst = ad.WengertList()
    t = ad.Tensor.variable(np.array([1.0, 2.0]), lst)
    norm = ad.define("norm", lambda v: np.sqrt(np.sum(v * v)),
                     vjp=lambda g, v, out: g * v / out)
    r = norm(t)
    assert isinstance(r, ad.Record)
    np.testing.assert_allclose(r.derivatives()[t], np.array([1.0, 2.0]) / np.sqrt(5.0))


def test_functional_api_object_arrays():
    x = np.array([0.3, -1.2, 2.0])
    g = ad.grad(lambda v: ad.sum(softplus(v) * v))(x)
    sig = 1 / (1 + np.exp(-x))
    np.testing.assert_allclose(g, sig * x + np.logaddexp(0, x), rtol=1e-13)
    jr = ad.jacobian(lambda v: softplus(v), mode="reverse")(x)
    jf = ad.jacobian(lambda v: softplus(v), mode="forward")(x)
    np.testing.assert_allclose(jr, np.diag(sig), rtol=1e-13)
    np.testing.assert_allclose(jf, np.diag(sig), rtol=1e-13)
    ad.check_gradients(lambda v: ad.sum(softplus(v) * v), x)


def test_vjp_errors_are_clear():
    bad_shape = ad.define("bad_shape", lambda x: x * 2, vjp=lambda g, x, out: g[:1])
    bad_count = ad.define("bad_count", lambda x, y: x * y, vjp=lambda g, x, y, out: g)
    lst = ad.WengertList()
    t = ad.Tensor.variable(np.ones(3), lst)
    with pytest.raises(ad.ShapeError, match="bad_shape"):
        ad.sum(bad_shape(t)).derivatives()
    with pytest.raises(TypeError, match="bad_count"):
        ad.sum(bad_count(t, t)).derivatives()
    with pytest.raises(TypeError, match="not both"):
        ad.define("both", lambda x: x, lambda x: 1.0, vjp=lambda g, x, out: g)


# ---- second order: a differentiable vjp, against torch.func.hessian ----

def test_hessian_through_differentiable_vjp(device):
    x = RNG.normal(size=(3, 4))
    w = _weights((3,))
    lst = ad.WengertList()
    t = ad.Tensor.variable(x, lst, device=device)
    loss = ad.sum(logsumexp(t * t) * w) + ad.sum(softplus(t) * t)
    d = loss.derivatives(create_graph=True)
    v = RNG.normal(size=x.shape)
    hvp = ad.sum(d[t] * v).derivatives()[t]

    def f(z):
        return (torch.logsumexp(z * z, -1) * torch.tensor(w)).sum() + \
            (torch.nn.functional.softplus(z) * z).sum()
    H = torch.func.hessian(f)(torch.tensor(x)).reshape(x.size, x.size).numpy()
    np.testing.assert_allclose(hvp.reshape(-1), H @ v.reshape(-1), rtol=1e-10, atol=1e-12)


def test_create_graph_needs_a_differentiable_vjp():
    lst = ad.WengertList()
    a = ad.Tensor.variable(np.ones((2, 2)), lst)
    loss = ad.sum(matmul(a, a))
    with pytest.raises(NotImplementedError, match="matmul"):
        loss.derivatives(create_graph=True)


# ---- forward mode ----

def test_forward_with_jvp_vjp_and_differences(device):
    a, b = RNG.normal(size=(3, 4)), RNG.normal(size=(4, 2))
    da, db = RNG.normal(size=a.shape), RNG.normal(size=b.shape)
    ta = ad.TraceTensor.variable(a, da, device=device)
    tb = ad.TraceTensor.variable(b, db, device=device)
    out = matmul(ta, tb)                                   # the user's jvp
    np.testing.assert_allclose(out.tangent, da @ b + a @ db, rtol=1e-13)
    assert out.device == ta.device
    x, dx = RNG.normal(size=(2, 3)), RNG.normal(size=(2, 3))
    lse = logsumexp(ad.TraceTensor.variable(x, dx, device=device))   # the vjp per output
    soft = np.exp(x - _logsumexp(x)[:, None])
    np.testing.assert_allclose(lse.tangent, (soft * dx).sum(-1), rtol=1e-13)
    y = RNG.normal(size=3)
    fd = box(ad.TraceTensor.variable(y, np.ones(3), device=device), 2.0)  # differences
    np.testing.assert_allclose(fd.tangent, 2 * np.cos(y) + 2 * y, rtol=1e-8)
    s = softplus(ad.Trace.variable(0.5))
    assert isinstance(s, ad.Trace) and abs(s.derivative - 1 / (1 + np.exp(-0.5))) < 1e-15


# ---- the finite-difference fallback ----

def test_numeric_fallback_first_and_second_order(device):
    x = RNG.normal(size=(2, 3))
    lst = ad.WengertList()
    t = ad.Tensor.variable(x, lst, device=device)
    y = lst.variable(1.7)
    loss = ad.sum(box(t, y))
    d = loss.derivatives()
    np.testing.assert_allclose(d[t], 1.7 * np.cos(x) + 2 * x, rtol=1e-8)
    assert abs(d[y] - np.sin(x).sum()) < 1e-8
    d2 = loss.derivatives(create_graph=True)
    h = ad.sum(d2[t]).derivatives()[t]         # d/dx of sum(dloss/dx): -y sin x + 2
    np.testing.assert_allclose(h, -1.7 * np.sin(x) + 2.0, rtol=1e-4, atol=1e-5)


def test_missing_vjp_warns_once():
    cube = ad.primitive(array=True)(lambda x: x ** 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g1 = ad.grad(lambda v: ad.sum(cube(v)))([1.0, 2.0])
        ad.grad(lambda v: ad.sum(cube(v)))([1.0, 2.0])
    assert len([w for w in caught if "central differences" in str(w.message)]) == 1
    np.testing.assert_allclose(g1, [3.0, 12.0], rtol=1e-8)


def test_defvjp_registration():
    @ad.primitive(array=True)
    def cumsum(x):
        return np.cumsum(x)

    @cumsum.defvjp
    def _(g, x, out):
        return np.cumsum(g[::-1])[::-1]

    @cumsum.defjvp
    def _(t, x, out):
        return np.cumsum(t[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = ad.grad(lambda v: ad.sum(cumsum(v) * v))([1.0, 2.0, 3.0])
    ref = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    (torch.cumsum(ref, 0) * ref).sum().backward()
    np.testing.assert_allclose(g, ref.grad.numpy(), rtol=1e-14)
    assert cumsum(ad.TraceTensor.variable(np.ones(3))).tangent.tolist() == [1.0, 2.0, 3.0]


def test_static_keyword_arguments():
    @ad.primitive(vjp=lambda g, x, out, axis: np.broadcast_to(np.expand_dims(g, axis),
                                                              x.shape).copy(),
                  shape=lambda x, axis: tuple(n for k, n in enumerate(x.shape) if k != axis))
    def total(x, axis):
        return np.sum(x, axis=axis)
    lst = ad.WengertList()
    t = ad.Tensor.variable(np.ones((2, 3)), lst)
    np.testing.assert_allclose(ad.sum(total(t, axis=1) * np.array([1.0, 2.0])).derivatives()[t],
                               [[1.0] * 3, [2.0] * 3])
    assert ad.eval_shape(lambda x: total(x, axis=0), (2, 3)).shape == (3,)


def test_replay_is_refused_clearly():
    with pytest.raises(TypeError, match="cannot be replayed"):
        ad.record(lambda v: ad.sum(softplus(v)), [1.0, 2.0])


# ---- eval_shape of custom operations ----

def test_eval_shape_of_custom_ops():
    # with shape=: f never runs; without: f runs once on zeros
    calls = []

    def traced(x):
        calls.append(x.shape)
        return x[:, :1] * 2
    op = ad.define("first_column", traced, vjp=lambda g, x, out: None)
    assert ad.eval_shape(logsumexp, (5, 7)) == ad.ShapeDtype((5,), np.float64)
    assert ad.eval_shape(op, ad.ShapeDtype((4, 3), np.float32)) == \
        ad.ShapeDtype((4, 1), np.float32)
    assert calls == [(4, 3)]
    with pytest.raises(ad.ShapeError):
        ad.eval_shape(lambda a, b: matmul(a, b) + a, (3, 4), (4, 2))
