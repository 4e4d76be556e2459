"""Tensors (issue 4): every op's gradient against central finite differences and PyTorch,
on every backend (numpy always; the first OpenCL device when pyopencl finds one).

One test body per backend: the ``device`` fixture names the device every tensor of a test
is made on. Cases come from the rule table where they can (every unary and binary rule),
and from short lists of shapes for broadcasting, reductions, matmul and indexing.
"""
from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest
import torch

import easyad as ad
from easyad import _rules

torch.set_default_dtype(torch.float64)

# the `device` fixture (numpy, and every working OpenCL device) is in conftest.py
_OPENCL = [d.name for d in ad.devices() if d.kind == "opencl"][:1]   # one, to compare with


@pytest.fixture
def rng():
    return np.random.default_rng(4)


# ---- oracles ----

def grads_easyad(f, arrays, device, dtype=None):
    """Value of the scalar f(*tensors) and its gradient with respect to each array."""
    lst = ad.WengertList()
    ts = [ad.Tensor.variable(a, lst, device=device, dtype=dtype) for a in arrays]
    out = f(*ts)
    d = out.derivatives()
    return out.number, [d[t] for t in ts]


def grads_torch(f, arrays):
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    out = f(*ts)
    out.backward()
    return out.item(), [t.grad.numpy() if t.grad is not None else np.zeros(t.shape)
                        for t in ts]


def directional_fd(f, arrays, directions, h=1e-6):
    """Central difference of f along the directions (one per array), on numpy floats."""
    plus = [a + h * v for a, v in zip(arrays, directions)]
    minus = [a - h * v for a, v in zip(arrays, directions)]
    return (f(*plus) - f(*minus)) / (2 * h)


def value_of(f, arrays, device):
    out = f(*[ad.Tensor.constant(a, device=device) for a in arrays])
    return float(out)


def check(f_ad, f_torch, arrays, device, rng, rtol=1e-7, atol=1e-9, fd=True):
    value, grads = grads_easyad(f_ad, arrays, device)
    ref_value, ref_grads = grads_torch(f_torch, arrays)
    np.testing.assert_allclose(value, ref_value, rtol=rtol, atol=atol)
    for g, r, a in zip(grads, ref_grads, arrays):
        assert g.shape == np.shape(a)
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)
    if fd:
        directions = [rng.standard_normal(np.shape(a)) for a in arrays]
        slope = directional_fd(lambda *xs: value_of(f_ad, xs, device), arrays, directions)
        predicted = sum(float(np.sum(g * v)) for g, v in zip(grads, directions))
        assert abs(slope - predicted) <= 1e-5 * (1 + abs(predicted))


def sample(rng, domain, shape):
    lo, hi = domain
    lo, hi = max(lo, -3.0), min(hi, 3.0)
    margin = 0.1 * (hi - lo)
    return rng.uniform(lo + margin, hi - margin, size=shape)


_TORCH = {"neg": torch.neg, "cbrt": lambda x: torch.sign(x) * torch.abs(x) ** (1.0 / 3.0),
          "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
UNARY = [r for r in _rules.DIFFERENTIATED_RULES if r.arity == 1]
# (polygamma's integer order has no torch tensor form: tests/test_special_rows.py)
BINARY = [r for r in _rules.RULES if r.arity == 2 and not r.integer_order]


def torch_function(rule):
    """torch's function of the row: its spelling (a name or an expression in x, y), or
    torch's function of the row's name (digamma: accurate to 1e-9, enough here)."""
    if rule.name in _TORCH:
        return _TORCH[rule.name]
    spelling = rule.spelling("torch") or rule.name
    if spelling.isidentifier():
        return getattr(torch, spelling)
    return lambda *args: eval(spelling, vars(torch), dict(zip("xy", args)))  # noqa: S307


def easyad_function(rule):
    if rule.operator and rule.arity == 2:
        return lambda x, y: getattr(type(x), f"__{rule.operator}__")(x, y) \
            if isinstance(x, ad.Tensor) else getattr(type(y), f"__r{rule.operator}__")(y, x)
    return getattr(ad, rule.name) if hasattr(ad, rule.name) else \
        (lambda x: getattr(x, f"__{rule.operator}__")())


# ---- elementwise rules ----

@pytest.mark.parametrize("rule", UNARY, ids=lambda r: r.name)
def test_unary_rule(rule, device, rng):
    x = sample(rng, rule.domain[0], (3, 4))
    w = rng.standard_normal((3, 4))
    f = easyad_function(rule)
    tf = torch_function(rule)
    check(lambda t: ad.sum(f(t) * w), lambda t: (tf(t) * torch.tensor(w)).sum(), [x],
          device, rng)


@pytest.mark.parametrize("rule", BINARY, ids=lambda r: r.name)
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)),
                                    ((3, 4), ())], ids=str)
def test_binary_rule_broadcasting(rule, shapes, device, rng):
    x = sample(rng, rule.domain[0], shapes[0])
    y = sample(rng, rule.domain[1], shapes[1])
    f, tf = easyad_function(rule), torch_function(rule)
    out_shape = np.broadcast_shapes(*shapes)
    w = rng.standard_normal(out_shape)
    check(lambda a, b: ad.sum(f(a, b) * w),
          lambda a, b: (tf(a, b) * torch.tensor(w)).sum(), [x, y], device, rng)


@pytest.mark.parametrize("rule", BINARY, ids=lambda r: r.name)
def test_binary_rule_with_records_and_floats(rule, device, rng):
    # a Record on either side, and a plain float: the Record's adjoint is a float
    x = sample(rng, rule.domain[0], (5,))
    y = float(sample(rng, rule.domain[1], ()))
    f = easyad_function(rule)
    lst = ad.WengertList()
    t = ad.Tensor.variable(x, lst, device=device)
    r = lst.variable(y)
    out = ad.sum(f(t, r)) + ad.sum(f(r, t)) if rule.domain[0] == rule.domain[1] else \
        ad.sum(f(t, r))
    d = out.derivatives()
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.tensor(y, requires_grad=True)
    tf = torch_function(rule)
    ref = tf(tx, ty).sum() + tf(ty, tx).sum() if rule.domain[0] == rule.domain[1] else \
        tf(tx, ty).sum()
    ref.backward()
    np.testing.assert_allclose(out.number, ref.item(), rtol=1e-10)
    np.testing.assert_allclose(d[t], tx.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(d[r], ty.grad.item(), rtol=1e-9, atol=1e-12)
    # a plain float on the right: only the tensor is differentiated
    value, (g,) = grads_easyad(lambda a: ad.sum(f(a, y)), [x], device)
    np.testing.assert_allclose(g, tx.grad.numpy() * 0 + grads_torch(
        lambda a: tf(a, torch.tensor(y)).sum(), [x])[1][0], rtol=1e-9, atol=1e-12)


def test_generic_functions_and_numpy_ufuncs_dispatch(device, rng):
    x = rng.uniform(0.5, 2.0, (4,))
    lst = ad.WengertList()
    t = ad.Tensor.variable(x, lst, device=device)
    for name in ("sin", "arcsinh", "absolute", "log1p"):
        np.testing.assert_allclose(getattr(ad, name)(t).value, getattr(np, name)(x))
    np.testing.assert_allclose(np.exp(t).value, np.exp(x))
    np.testing.assert_allclose((x + t).value, 2 * x)          # ndarray on the left
    np.testing.assert_allclose(np.maximum(x, t * 2.0).value, 2 * x)
    np.testing.assert_allclose(ad.maximum(1.0, t).value, np.maximum(1.0, x))
    np.testing.assert_allclose(ad.atan2(1.0, t).value, np.arctan2(1.0, x))
    np.testing.assert_allclose((2.0 ** t).value, 2.0 ** x)
    np.testing.assert_allclose(np.sum(t).number, x.sum())


# ---- reductions ----

@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (1, True), ((0, 2), False),
                                           (-1, False), (None, True)], ids=str)
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin"])
def test_reductions(name, axis, keepdims, device, rng):
    x = rng.standard_normal((3, 4, 5))
    f = getattr(ad, name)
    tname = {"amax": "amax", "amin": "amin", "sum": "sum", "mean": "mean"}[name]
    tdim = axis if axis is not None else tuple(range(3))

    def tf(t):
        return getattr(torch, tname)(t, dim=tdim, keepdim=keepdims)
    w = rng.standard_normal(np.shape(getattr(np, name)(x, axis=axis, keepdims=keepdims)))
    check(lambda t: ad.sum(f(t, axis=axis, keepdims=keepdims) * w),
          lambda t: (tf(t) * torch.tensor(w)).sum(), [x], device, rng)


def test_max_ties_share_the_derivative(device):
    x = np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]])
    value, (g,) = grads_easyad(lambda t: ad.sum(t.max(axis=1)), [x], device)
    np.testing.assert_allclose(g, [[0, 0.5, 0.5], [0.5, 0, 0.5]])
    _, (gt,) = grads_torch(lambda t: t.amax(dim=1).sum(), [x])
    np.testing.assert_allclose(g, gt)


def test_reduction_to_one_number_is_a_record(device):
    lst = ad.WengertList()
    t = ad.Tensor.variable(np.ones((2, 3)), lst, device=device)
    assert isinstance(t.sum(), ad.Record) and t.sum().number == 6.0
    assert isinstance(ad.Tensor.constant(np.ones(3), device=device).sum(), float)
    assert isinstance(t.sum(axis=None, keepdims=True), ad.Tensor)


# ---- matmul ----

@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)),
                                    ((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                                    ((2, 1, 3, 4), (5, 4, 2)), ((4,), (4,))], ids=str)
def test_matmul(shapes, device, rng):
    a, b = rng.standard_normal(shapes[0]), rng.standard_normal(shapes[1])
    w = rng.standard_normal(np.shape(a @ b))
    check(lambda x, y: ad.sum((x @ y) * w), lambda x, y: ((x @ y) * torch.tensor(w)).sum(),
          [a, b], device, rng)


# ---- shape operations and indexing ----

@pytest.mark.parametrize("case", [
    ("reshape", lambda t: t.reshape(4, 6), lambda t: t.reshape(4, 6)),
    ("reshape-1", lambda t: t.reshape((-1, 3)), lambda t: t.reshape(-1, 3)),
    ("T", lambda t: t.T, lambda t: t.permute(2, 1, 0)),
    ("transpose", lambda t: t.transpose(1, 0, 2), lambda t: t.permute(1, 0, 2)),
    ("slice", lambda t: t[1:, ::2], lambda t: t[1:, ::2]),
    ("int", lambda t: t[1], lambda t: t[1]),
    ("ellipsis", lambda t: t[..., 1:3], lambda t: t[..., 1:3]),
    ("newaxis", lambda t: t[:, None, 1], lambda t: t[:, None, 1]),
    ("negative-step", lambda t: t[::-1, 2:0:-1], lambda t: t.flip(0)[:, 2:0:-1]
     if False else torch.flip(t, [0])[:, [2, 1]]),
    ("int-array", lambda t: t[[0, 1, 0]], lambda t: t[[0, 1, 0]]),
    ("int-arrays", lambda t: t[[0, 1], :, [3, 2]], lambda t: t[[0, 1], :, [3, 2]]),
    ("mask", lambda t: t[t.value > 0], lambda t: t[t.detach() > 0]),
], ids=lambda c: c[0])
def test_shape_operations(case, device, rng):
    _, f, tf = case
    x = rng.standard_normal((2, 3, 4))
    w = rng.standard_normal(np.shape(tf(torch.tensor(x)).numpy()))
    check(lambda t: ad.sum(f(t) * w), lambda t: (tf(t) * torch.tensor(w)).sum(), [x], device,
          rng)


def test_single_element_is_a_record(device):
    lst = ad.WengertList()
    t = ad.Tensor.variable(np.arange(6.0).reshape(2, 3), lst, device=device)
    e = t[1, 2]
    assert isinstance(e, ad.Record) and e.number == 5.0
    d = (e * e).derivatives()
    np.testing.assert_allclose(d[t], [[0, 0, 0], [0, 0, 10.0]])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concatenate_and_stack(axis, device, rng):
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    w = rng.standard_normal(np.concatenate([a, b, a], axis=axis).shape)
    check(lambda x, y: ad.sum(ad.concatenate([x, y, x], axis=axis) * w),
          lambda x, y: (torch.cat([x, y, x], dim=axis) * torch.tensor(w)).sum(), [a, b],
          device, rng)
    w = rng.standard_normal(np.stack([a, b], axis=axis).shape)
    check(lambda x, y: ad.sum(ad.stack([x, y], axis=axis) * w),
          lambda x, y: (torch.stack([x, y], dim=axis) * torch.tensor(w)).sum(), [a, b],
          device, rng)


def test_where_and_relu(device, rng):
    x = rng.standard_normal((3, 4))
    y = rng.standard_normal((4,))
    check(lambda a, b: ad.sum(ad.where(a > 0, a * b, b) ** 2),
          lambda a, b: (torch.where(a > 0, a * b, b) ** 2).sum(), [x, y], device, rng)
    check(lambda a: ad.sum(ad.maximum(a, 0.0) * 3.0), lambda a: (torch.relu(a) * 3.0).sum(),
          [x], device, rng)
    # the unselected branch contributes exactly nothing, even where its derivative is inf
    v = np.array([0.0, 4.0, -1.0])
    _, (g,) = grads_easyad(lambda a: ad.sum(ad.where(a > 0, ad.sqrt(a), 0.0)), [v], device)
    np.testing.assert_allclose(g, [0.0, 0.25, 0.0])


# ---- softmax family ----

@pytest.mark.parametrize("name", ["logsumexp", "softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [None, 1, 0])
def test_softmax_family(name, axis, device, rng):
    if name != "logsumexp" and axis is None:
        pytest.skip("softmax takes one axis")
    x = rng.standard_normal((3, 4)) * 3
    tf = {"logsumexp": lambda t: torch.logsumexp(t, dim=axis if axis is not None else (0, 1)),
          "softmax": lambda t: torch.softmax(t, dim=axis),
          "log_softmax": lambda t: torch.log_softmax(t, dim=axis)}[name]
    w = rng.standard_normal(np.shape(tf(torch.tensor(x)).detach().numpy()))
    f = getattr(ad, name)
    check(lambda t: ad.sum(f(t, axis=axis) * w) if np.shape(w) else f(t, axis=axis) * float(w),
          lambda t: (tf(t) * torch.tensor(w)).sum(), [x], device, rng)


def test_softmax_family_is_stable(device):
    x = np.array([[1000.0, 1000.0, -1000.0], [-np.inf, 0.0, 1.0]])
    lse = ad.logsumexp(ad.Tensor.constant(x, device=device), axis=1).value
    np.testing.assert_allclose(lse, torch.logsumexp(torch.tensor(x), dim=1).numpy())
    sm = ad.softmax(ad.Tensor.constant(x, device=device), axis=1).value
    np.testing.assert_allclose(sm, torch.softmax(torch.tensor(x), dim=1).numpy())
    assert np.all(np.isfinite(ad.log_softmax(ad.Tensor.constant(x[:1], device=device)).value))


# ---- records and tensors on one list ----

def test_records_and_tensors_combine(device, rng):
    x = rng.standard_normal((4,))
    lst = ad.WengertList()
    a = lst.variable(0.7)
    t = ad.Tensor.variable(x, lst, device=device)
    s = ad.sum(ad.sin(a * t + a))                  # tensor ops reading a Record
    z = s * a + ad.exp(a)                          # scalar ops after a tensor reduction
    d = z.derivatives()
    ta = torch.tensor(0.7, requires_grad=True)
    tt = torch.tensor(x, requires_grad=True)
    ref = torch.sin(ta * tt + ta).sum() * ta + torch.exp(ta)
    ref.backward()
    np.testing.assert_allclose(z.number, ref.item(), rtol=1e-12)
    np.testing.assert_allclose(d[a], ta.grad.item(), rtol=1e-10)
    np.testing.assert_allclose(d[t], tt.grad.numpy(), rtol=1e-10)


def test_derivatives_lookup_rules(device):
    lst = ad.WengertList()
    t = ad.Tensor.variable(np.ones(3), lst, device=device)
    u = ad.Tensor.variable(np.ones(2), lst, device=device)   # nothing flows into u
    h = (t * 2.0).retain()
    k = t * 3.0
    out = ad.sum(h * k)
    d = out.derivatives()
    np.testing.assert_allclose(d[u], np.zeros(2))
    np.testing.assert_allclose(d[h], 3.0 * np.ones(3))
    with pytest.raises(ValueError, match="retain"):
        d[k]
    other = ad.WengertList()
    v = ad.Tensor.variable(np.ones(3), other, device=device)
    with pytest.raises(ad.TapeMismatchError):
        d[v]
    with pytest.raises(ad.TapeMismatchError):
        t + v
    with pytest.raises(ad.TapeMismatchError):
        t * other.variable(1.0)
    with pytest.raises(TypeError):
        t + ad.Trace.variable(1.0)
    lst.clear()
    with pytest.raises(ad.StaleRecordError):
        t * 2.0


def test_backward_from_a_tensor_with_a_seed(device, rng):
    x = rng.standard_normal((2, 3))
    seed = rng.standard_normal((2, 3))
    lst = ad.WengertList()
    t = ad.Tensor.variable(x, lst, device=device)
    y = ad.exp(t) * 2.0
    d = y.derivatives(seed)
    np.testing.assert_allclose(d[t], 2.0 * np.exp(x) * seed)
    with pytest.raises(ValueError, match="seed"):
        y.derivatives()


# ---- shapes ----

@pytest.mark.parametrize("f,shapes,match", [
    (lambda a, b: a + b, [(3, 4), (5,)], r"add: shapes \(3, 4\) and \(5,\)"),
    (lambda a, b: a @ b, [(3, 4), (5, 2)], r"matmul: shapes \(3, 4\) and \(5, 2\)"),
    (lambda a, b: ad.concatenate([a, b], axis=0), [(3, 4), (3, 5)],
     r"concatenate: shapes \(3, 4\) and \(3, 5\)"),
    (lambda a, b: ad.where(a > 0, a, b), [(3, 4), (2, 4)], "where: shapes"),
    (lambda a, b: a.reshape(5, 3) * b, [(3, 4), (1,)], r"reshape: cannot reshape \(3, 4\)"),
    (lambda a, b: ad.sum(a, axis=2) + b, [(3, 4), (4,)], "sum: axis 2"),
], ids=["broadcast", "matmul", "concatenate", "where", "reshape", "axis"])
def test_shape_errors(f, shapes, match, device):
    with pytest.raises(ad.ShapeError, match=match):
        ad.eval_shape(f, *shapes)
    arrays = [np.ones(s) for s in shapes]
    backend = ad.Tensor.constant(np.ones(1), device=device).device.backend
    gc.collect()
    before = backend.live_buffers
    lst = ad.WengertList()
    ts = [ad.Tensor.variable(a, lst, device=device) for a in arrays]
    with pytest.raises(ad.ShapeError, match=match):
        f(*ts)
    assert issubclass(ad.ShapeError, ValueError)
    del ts
    lst.clear()
    gc.collect()
    assert backend.live_buffers <= before   # nothing of the failed operation stays alive


def test_eval_shape():
    def model(x, w1, w2):
        h = ad.maximum(x @ w1, 0.0)
        return ad.log_softmax(h @ w2, axis=-1), ad.sum(h), h[:, 1:3].T
    out = ad.eval_shape(model, (8, 3), (3, 16), (16, 4))
    assert tuple(o.shape for o in out) == ((8, 4), (), (2, 8))
    assert all(o.dtype == np.float64 for o in out)



def test_eval_shape_through_nn_and_losses(device):
    # parameters live on a device; while eval_shape runs they are shapes only
    F = ad.nn.functional
    model = ad.nn.Sequential(ad.nn.Linear(784, 32, device=device), ad.nn.Tanh(),
                             ad.nn.Linear(32, 10, device=device))
    assert ad.eval_shape(lambda x: model(x), (16, 784)) == ad.ShapeDtype((16, 10), np.float64)
    targets = ad.ShapeDtype((16,), np.int64)
    out = ad.eval_shape(lambda x, t: {"loss": F.cross_entropy(model(x), t),
                                      "rows": [F.cross_entropy(model(x), t, reduction="none")],
                                      "p": (ad.softmax(model(x)), ad.logsumexp(model(x), 1))},
                        (16, 784), targets)
    assert out == {"loss": ad.ShapeDtype(()), "rows": [ad.ShapeDtype((16,))],
                   "p": (ad.ShapeDtype((16, 10)), ad.ShapeDtype((16,)))}
    for loss in (F.mse_loss, F.l1_loss, F.binary_cross_entropy,
                 F.binary_cross_entropy_with_logits):
        assert ad.eval_shape(loss, (4, 3), (4, 3)).shape == ()
        assert ad.eval_shape(lambda a, b: loss(a, b, reduction="none"), (4, 3),
                             (4, 3)).shape == (4, 3)
    assert ad.eval_shape(F.nll_loss, (4, 3), np.array([0, 1, 2, 0])).shape == ()
    assert ad.eval_shape(F.cross_entropy, (4, 3), (4, 3)).shape == ()     # probabilities
    for act in (F.relu, F.gelu, F.sigmoid, F.tanh, F.log_softmax, F.dropout):
        assert ad.eval_shape(act, (4, 3)).shape == (4, 3)
    with pytest.raises(ad.ShapeError, match="linear"):
        ad.eval_shape(lambda x: model(x), (16, 783))
    with pytest.raises(ad.ShapeError):
        ad.eval_shape(F.mse_loss, (4, 3), (4, 2))


def test_eval_shape_arguments_and_results(device):
    w = ad.Tensor.constant(np.ones((3, 4)), device=device)    # made outside: by its shape
    params = {"W": (3, 4), "b": ad.ShapeDtype((4,), np.float32)}
    out = ad.eval_shape(lambda p, x, scale: [x @ p["W"] * scale + p["b"], x @ w, None],
                        params, (8, 3), 2.0)
    assert out == [ad.ShapeDtype((8, 4), np.float64), ad.ShapeDtype((8, 4)), None]
    assert ad.eval_shape(lambda x: x, (2,), dtype=np.float32).dtype == np.float32
    assert ad.eval_shape(lambda x, k: x.sum(axis=k), (2, 5), k=0).shape == (5,)
    assert ad.eval_shape(lambda x: x > 0, (3,)).dtype == np.bool_
    with pytest.raises(TypeError, match="eval_shape"):
        ad.eval_shape(lambda x: "text", (3,))
    with pytest.raises(TypeError, match="no values"):
        ad.eval_shape(lambda x: x.value, (3,))


# ---- dtypes, devices, memory ----

def test_float32(device, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    lst = ad.WengertList()
    t = ad.Tensor.variable(x, lst, device=device, dtype=np.float32)
    y = ad.tanh(t) * 2.0 + t ** 2
    assert y.dtype == np.float32 and y.value.dtype == np.float32
    g = ad.sum(y).derivatives()[t]
    np.testing.assert_allclose(g, 2.0 / np.cosh(x) ** 2 + 2 * x, rtol=1e-5)
    assert (t + np.ones(4)).dtype == np.float64   # float64 arrays promote, like numpy


def test_devices_listing():
    names = [d.name for d in ad.devices()]
    assert names[0] == "numpy"
    assert ad.get_device().name in names
    with pytest.raises(ValueError, match="no device"):
        ad.set_device("opencl:99")


def test_backends_agree(rng):
    if not _OPENCL:
        pytest.skip("no OpenCL device")
    x = rng.standard_normal((5, 6))
    w = rng.standard_normal((6, 3))

    def f(a, b):
        h = ad.tanh(a @ b) + ad.softmax(a, axis=0)[:, :3]
        return ad.logsumexp(h, axis=0).sum() + ad.amax(ad.abs(a)) * ad.mean(h ** 2)
    v1, g1 = grads_easyad(f, [x, w], "numpy")
    v2, g2 = grads_easyad(f, [x, w], _OPENCL[0])
    np.testing.assert_allclose(v1, v2, rtol=1e-12)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)


def test_memory_is_released_each_step(device, rng):
    """1000 steps that clear the list: host memory and live buffers do not grow."""
    x = rng.standard_normal((16, 8))
    w0 = rng.standard_normal((8, 4))
    lst = ad.WengertList()
    backend = ad.Tensor.constant(w0, device=device).device.backend

    def step():
        lst.clear()
        w = ad.Tensor.variable(w0, lst, device=device)
        loss = ad.mean(ad.log_softmax(ad.tanh(ad.Tensor.constant(x, device=device) @ w)) ** 2)
        return loss.derivatives()[w]
    for _ in range(20):
        step()
    gc.collect()
    tracemalloc.start()
    before_buffers = backend.live_buffers
    first = tracemalloc.take_snapshot()
    for _ in range(1000):
        step()
    gc.collect()
    second = tracemalloc.take_snapshot()
    tracemalloc.stop()
    growth = sum(s.size_diff for s in second.compare_to(first, "filename"))
    assert growth < 200_000, f"host memory grew by {growth} bytes over 1000 steps"
    assert backend.live_buffers <= before_buffers + 8


# ---- forward mode: TraceTensor ----

def test_trace_tensor_rules_match_reverse_mode(device, rng):
    """For every rule: the tangent equals the reverse-mode gradient times the direction."""
    for rule in _rules.RULES:
        xs = [sample(rng, rule.domain[k], (3, 4)) for k in range(rule.arity)]
        vs = [rng.standard_normal((3, 4)) for _ in xs]
        f = easyad_function(rule)
        traced = f(*[ad.TraceTensor.variable(x, v, device=device) for x, v in zip(xs, vs)])
        _, grads = grads_easyad(lambda *ts: ad.sum(f(*ts) * 1.0), xs, device)
        np.testing.assert_allclose(traced.tangent, sum(g * v for g, v in zip(grads, vs)),
                                   rtol=1e-10, atol=1e-12, err_msg=rule.name)
        np.testing.assert_allclose(traced.value, f(*[ad.Tensor.constant(x, device=device)
                                                     for x in xs]).value, rtol=1e-14)


def test_trace_tensor_structural_ops(device, rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    da, db = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))

    def f(x, y):
        h = ad.tanh(x @ y) + ad.softmax(x, axis=0)[:, 1:3]
        h = ad.concatenate([h, ad.where(h > 0, h, 0.0) * 2.0], axis=0)
        return ad.logsumexp(h, axis=1).sum() + ad.amax(x.T, axis=0).mean() + x[1, 2] * y[0, 1]
    z = f(ad.TraceTensor.variable(a, da, device=device),
          ad.TraceTensor.variable(b, db, device=device))
    assert isinstance(z, ad.Trace)
    value, (ga, gb) = grads_easyad(f, [a, b], device)
    np.testing.assert_allclose(z.number, value, rtol=1e-12)
    np.testing.assert_allclose(z.derivative, np.sum(ga * da) + np.sum(gb * db), rtol=1e-10)
    with pytest.raises(TypeError, match="do not mix"):
        ad.TraceTensor.variable(a, device=device) + ad.Tensor.variable(a, ad.WengertList(),
                                                                       device=device)


def test_readme_tensor_example():
    import pathlib
    import re
    text = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text.split("### Tensors and devices")[1],
                       flags=re.S)[0]
    ns: dict = {}
    exec(block, ns)
    assert ns["d"][ns["W"]].shape == (3, 4) and isinstance(ns["d"][ns["b"]], float)
    assert ad.eval_shape(lambda x, w: x @ w, (8, 3), (3, 4)).shape == (8, 4)


@pytest.mark.parametrize("shapes", [((1,), (2, 3)), ((2, 1, 3), (4, 1)), ((), (2, 2)),
                                    ((0, 3), (3,)), ((3, 1, 1), (1, 1))], ids=str)
def test_broadcasting_edge_cases(shapes, device, rng):
    x, y = rng.standard_normal(shapes[0]), rng.standard_normal(shapes[1])
    lst = ad.WengertList()
    a, b = ad.Tensor.variable(x, lst, device=device), ad.Tensor.variable(y, lst, device=device)
    z = a * b + ad.sin(a) - b / 3.0
    np.testing.assert_allclose(z.value, x * y + np.sin(x) - y / 3.0)
    w = rng.standard_normal(z.shape)
    loss = ad.sum(z * w)
    d = loss.derivatives() if isinstance(loss, ad.Record) else None
    ta, tb = torch.tensor(x, requires_grad=True), torch.tensor(y, requires_grad=True)
    ((ta * tb + torch.sin(ta) - tb / 3.0) * torch.tensor(w)).sum().backward()
    if d is not None:
        np.testing.assert_allclose(d[a], ta.grad.numpy(), atol=1e-12)
        np.testing.assert_allclose(d[b], tb.grad.numpy(), atol=1e-12)


def test_device_choice(monkeypatch):
    from easyad.tensor import _devices
    monkeypatch.setattr(_devices, "_chosen", [])
    monkeypatch.setenv("EASYAD_DEVICE", "numpy")
    assert ad.get_device().name == "numpy"
    assert ad.Tensor.constant(np.ones(2)).device.name == "numpy"
    if _OPENCL:
        monkeypatch.setenv("EASYAD_DEVICE", "opencl")
        assert ad.Tensor.constant(np.ones(2)).device.kind == "opencl"
        assert ad.set_device("numpy").name == "numpy"
        assert ad.Tensor.constant(np.ones(2)).device.name == "numpy"   # set beats the env


def test_works_without_pyopencl():
    """With no pyopencl at all, only numpy is listed and tensors run on it."""
    import subprocess
    import sys
    code = (
        "import sys; sys.modules['pyopencl'] = None\n"
        "import numpy as np, easyad as ad\n"
        "assert [d.name for d in ad.devices()] == ['numpy'], ad.devices()\n"
        "lst = ad.WengertList()\n"
        "t = ad.Tensor.variable(np.arange(3.0), lst)\n"
        "assert ad.sum(t * t).derivatives()[t].tolist() == [0.0, 2.0, 4.0]\n"
        "try:\n    ad.set_device('opencl')\nexcept ad.DeviceError as e:\n"
        "    assert 'pyopencl' in str(e)\n"
        "else:\n    raise AssertionError('no error')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr


# ---- the eager dispatch (issue 16): its pieces against the plain definitions ----

def test_strong_zero_ufuncs():
    """The core's mul0/div0 ufuncs (the numpy backend's helpers) against numpy's masks, for
    zeros against inf and NaN, signed zeros, strided and scalar operands, float32."""
    from easyad import _core
    special = np.array([0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, np.nan, 3e-300, 1e300])
    a, b = np.meshgrid(special, special)
    a, b = a.ravel(), b.ravel()
    with np.errstate(all="ignore"):
        mul0 = np.where((a == 0) | (b == 0), 0.0, a * b)
        div0 = np.where(a == 0, 0.0, a / np.where(a == 0, 1.0, b))
        for got, want in ((_core._mul0_ufunc(a, b), mul0), (_core._div0_ufunc(a, b), div0),
                          (_core._mul0_ufunc(a[::3], b[::3]), mul0[::3]),
                          (_core._mul0_ufunc(a, 0.0), np.zeros_like(a)),
                          (_core._mul0_ufunc(2.0, b), np.where(b == 0, 0.0, 2.0 * b)),
                          (_core._div0_ufunc(a, 2.0), np.where(a == 0, 0.0, a / 2.0))):
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))  # zeros' signs
        f = a.astype(np.float32)
        assert _core._mul0_ufunc(f, 2.0).dtype == np.float32
        assert _core._mul0_ufunc(f, b).dtype == np.float64


def test_prepared_map_is_map(device, rng):
    """Backend.prepared_map gives map's buffers (the elementwise operations call it)."""
    be = ad.Tensor.constant(np.ones(1), device=device).device.backend
    x, y = rng.standard_normal((3, 4)), rng.standard_normal(4)
    bx, by = be.asarray(x, np.float64), be.asarray(y, np.float64)
    exprs = ("x * y + sin(x)", "mul0(x, div0(y, x))")
    dtypes = (np.dtype(np.float64),) * 2
    run = be.prepared_map("test", exprs, ("x", "y"))
    for got, want in zip(run((bx, by), (3, 4), dtypes),
                         be.map("test", exprs, {"x": bx, "y": by}, (3, 4), dtypes)):
        np.testing.assert_array_equal(be.to_numpy(got), be.to_numpy(want))


def test_host_buffers_counted_from_first_read():
    """The numpy backend counts buffers only once live_buffers was read (no weakref per
    buffer before), and from then on sees them released."""
    from easyad.tensor._numpy import NumpyBackend
    be = NumpyBackend(ad.Tensor.constant(np.ones(1)).device)
    be.asarray(np.ones(3), np.float64)
    assert be.live_buffers == 0
    kept = be.asarray(np.ones(3), np.float64)
    assert be.live_buffers == 1
    del kept
    gc.collect()
    assert be.live_buffers == 0


def test_elementwise_nodes_hold_no_closures():
    """An elementwise operation's node carries its vjp as data (ElementwiseStep), and
    Node is the core's class with the attributes the sweeps read."""
    from easyad._core import Node
    lst = ad.WengertList()
    x = ad.Tensor.variable(np.array([1.0, 2.0]), lst)
    y = ad.sin(x) * x
    node = lst._node(y.handle.index)
    assert type(node) is Node and node.label == "mul" and not node.retain
    assert node.inputs == (lst._node(y.handle.index).inputs[0], x.handle.index)
    assert type(node.vjp).__name__ == "ElementwiseStep" and node.graph is None  # vjp.graph
    np.testing.assert_allclose(ad.sum(y).derivatives()[x],
                               np.sin([1.0, 2.0]) + np.cos([1.0, 2.0]) * [1.0, 2.0])
