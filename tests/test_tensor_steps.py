"""Issue 16 item 1: every built-in tensor operation's vjp is data, a step (``_steps.Step``:
``__call__`` is the vjp, its method ``graph`` the vjp in recorded operations), no closure
per operation. For a battery of operations: each node on the list holds a step (the
variables the shared ``_no_vjp``), the gradients are finite differences' (or the hand
formula's), second derivatives through the steps (create_graph) are finite differences of
the gradient, and the steps hold no tape (recording leaves no garbage cycles)."""
import functools
import gc
import types

import numpy as np
import pytest

import easyad as ad
from easyad import _tapeview
from easyad._core import ElementwiseStep, _CoreStep, _released_vjp
from easyad.nn import functional as F
from easyad.tensor import _devices, _structural
from easyad.tensor._base import _no_vjp
from easyad.tensor._steps import Step

OPENCL = [d.name for d in ad.devices() if d.kind == "opencl"]

_R = np.random.default_rng(20260516)
C3, C4 = _R.standard_normal(3), _R.standard_normal(4)
C43, C34 = _R.standard_normal((4, 3)), _R.standard_normal((3, 4))
W, B = _R.standard_normal((5, 4)), _R.standard_normal(5)
M45, M223 = _R.standard_normal((4, 5)), _R.standard_normal((2, 2, 3))
TARGETS = np.array([1, 3, 0])


# name: (f of tensors -> a scalar, input shapes, labels of nodes f must record)
CASES = {
    "sum": (lambda x: x.sum(), [(3, 4)], {"sum"}),
    "sum_axis": (lambda x: (x.sum(axis=1) * C3).sum(), [(3, 4)], {"sum"}),
    "sum_keepdims": (lambda x: (x.sum(axis=0, keepdims=True) ** 2 * C4).sum(), [(3, 4)],
                     {"sum"}),
    "mean": (lambda x: (x.mean(axis=1) ** 2).sum() + ad.mean(x), [(3, 4)], {"sum"}),
    "max": (lambda x: x.max() + (x.max(axis=1) * C3).sum(), [(3, 4)], {"max"}),
    "min": (lambda x: (x.min(axis=0) * C4).sum() + ad.amin(x), [(3, 4)], {"min"}),
    "reshape": (lambda x: (x.reshape((4, 3)) ** 2 * C43).sum(), [(3, 4)], {"reshape"}),
    "transpose": (lambda x: (x.transpose((1, 0)) * C43).sum(), [(3, 4)], {"transpose"}),
    "T": (lambda x: (ad.sin(x.T) * C43).sum(), [(3, 4)], {"transpose"}),
    "slice": (lambda x: (x[1:, ::2] ** 2).sum() + x[-1].sum(), [(3, 4)], {"getitem"}),
    "int_index": (lambda x: x[1, 2] * 3.0 + x[0, 0] * x[2, 3], [(3, 4)], {"getitem"}),
    "fancy_index": (lambda x: (x[[0, 2, 0]] ** 2 * C34).sum()
                    + (x[np.array([0, 1, 1]), np.array([3, 2, 2])] * C3).sum(), [(3, 4)],
                    {"getitem"}),
    "matmul": (lambda a, b: ((a @ b) ** 2).sum(), [(3, 4), (4, 5)], {"matmul"}),
    "matmul_const": (lambda x: ((x @ M45) ** 2).sum() + (C3 @ x @ C4), [(3, 4)], {"matmul"}),
    "matmul_batched": (lambda a, b: ((a @ b) ** 2).sum() + ((a @ M223) * 0.5).sum(),
                       [(2, 3, 2), (2, 3)], {"matmul"}),
    "matmul_vectors": (lambda a, b: a @ b + (a @ ad.sin(b)) ** 2, [(4,), (4,)], {"matmul"}),
    "concatenate": (lambda a, b: (ad.concatenate([a, b * 2.0, a], axis=1) ** 2).sum(),
                    [(3, 2), (3, 4)], {"concatenate"}),
    "stack": (lambda a, b: (ad.stack([a, ad.exp(b)], axis=1) ** 2 * C3[:, None]).sum(),
              [(3,), (3,)], {"concatenate", "reshape"}),
    "where": (lambda a, b: (ad.where(a > 0.0, a * b, b ** 2) * C34).sum()
              + ad.where(b < 0.0, b, 2.0).sum(), [(3, 4), (3, 4)], {"where"}),
    "linear": (lambda x, w, b: (F.linear(x, w, b) ** 2).sum(), [(3, 4), (5, 4), (5,)],
               {"linear"}),
    "linear_no_bias": (lambda x: (F.linear(x, W) ** 2).sum() + (F.linear(x, W, 0.5)).sum(),
                       [(3, 4)], {"linear"}),
    "cross_entropy": (lambda z: F.cross_entropy(z, TARGETS)
                      + F.cross_entropy(z * 2.0, TARGETS, reduction="sum"), [(3, 4)],
                      {"cross_entropy"}),
    "sigmoid": (lambda x: (F.sigmoid(x) * C34).sum(), [(3, 4)], {"sigmoid"}),
    "elementwise": (lambda a, b: (ad.sin(a) * b + ad.exp(-a) / (1.0 + b ** 2) - 3.0).sum(),
                    [(3, 4), (3, 4)], {"sin", "mul", "exp", "div"}),
}


def _inputs(shapes, device):
    rng = np.random.default_rng(7)
    lst = ad.WengertList()
    values = [rng.uniform(0.2, 1.4, s) * rng.choice([-1.0, 1.0], s) for s in shapes]
    return lst, values, [ad.Tensor.variable(v, lst, device=device) for v in values]


def _value(f, values, device):
    return float(f(*[ad.Tensor.constant(v, device=device) for v in values]))


def _central_differences(f, values, k, device, h=1e-6):
    g = np.zeros(values[k].shape)
    for i in np.ndindex(g.shape):
        up, down = [v.copy() for v in values], [v.copy() for v in values]
        up[k][i] += h
        down[k][i] -= h
        g[i] = (_value(f, up, device) - _value(f, down, device)) / (2 * h)
    return g


def nodes(lst):
    """Every node entry of ``lst``."""
    view = _tapeview.TapeView(lst)
    return [lst._node(e) for e in range(len(view)) if view.kind(e) == _tapeview.NODE]


def assert_steps(lst):
    """Every node's vjp is a step and its graph the step's method (a node of the core's
    steps, ElementwiseStep's or _CoreStep's, may leave graph None: the sweep reads the
    step's own); a variable's vjp is the shared ``_no_vjp``."""
    found = nodes(lst)
    assert found
    for node in found:
        if not node.inputs:
            assert node.label == "variable" and node.vjp is _no_vjp and node.graph is None
            continue
        assert not isinstance(node.vjp, (types.FunctionType, functools.partial)), node
        assert not isinstance(node.graph, (types.FunctionType, functools.partial)), node
        if type(node.vjp) is ElementwiseStep:     # the core's: its graph a method of it
            assert node.graph is None and node.vjp.graph is not None
            continue
        assert isinstance(node.vjp, Step), (node, node.vjp)
        if node.graph is None and isinstance(node.vjp, _CoreStep):
            assert node.vjp.graph is not None
            continue
        assert node.graph.__self__ is node.vjp, node
    return {node.label for node in found}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_node_holds_a_step_and_gradients_are_finite_differences(name, device):
    f, shapes, labels = CASES[name]
    lst, values, xs = _inputs(shapes, device)
    z = f(*xs)
    assert labels <= assert_steps(lst), (labels, assert_steps(lst))
    d = z.derivatives()
    assert z.number == pytest.approx(_value(f, values, device), rel=1e-12, abs=1e-12)
    for k, x in enumerate(xs):
        np.testing.assert_allclose(d[x], _central_differences(f, values, k, device),
                                   rtol=1e-6, atol=1e-7, err_msg=f"input {k}")


def test_ties_share_the_adjoint_of_max_and_min(device):
    lst = ad.WengertList()
    x = ad.Tensor.variable(np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.5]]), lst, device=device)
    z = x.max() + (x.min(axis=1) * np.array([1.0, 10.0])).sum()
    assert {"max", "min"} <= assert_steps(lst)
    np.testing.assert_array_equal(z.derivatives()[x], [[1.0, 0.5, 0.5], [0.0, 0.0, 10.0]])


def test_astype_steps(device):
    lst = ad.WengertList()
    x0 = np.array([[0.5, -1.25], [2.0, 3.5]])
    x = ad.Tensor.variable(x0, lst, device=device)
    y = x.astype(np.float32)
    assert y.dtype == np.float32
    z = ((y * 3.0).astype(np.float64) ** 2).sum()
    assert "astype" in assert_steps(lst)
    np.testing.assert_allclose(z.derivatives()[x], 18.0 * x0, rtol=1e-6)
    d = z.derivatives(create_graph=True)                 # the graph converts back too
    hv = (d[x] * np.ones((2, 2))).sum().derivatives()[x]
    np.testing.assert_allclose(hv, np.full((2, 2), 18.0), rtol=1e-6)


@pytest.mark.skipif(not OPENCL, reason="no second device (no working OpenCL device)")
def test_to_steps(device):
    other = OPENCL[0] if device == "numpy" else "numpy"
    lst = ad.WengertList()
    x0 = np.array([0.5, -1.25, 2.0])
    x = ad.Tensor.variable(x0, lst, device=device)
    y = x.to(other)
    assert y.device.name == other
    z = (ad.sin(y) * y).sum()
    assert "to" in assert_steps(lst)
    np.testing.assert_allclose(z.derivatives()[x], np.cos(x0) * x0 + np.sin(x0), rtol=1e-12)
    d = z.derivatives(create_graph=True)
    assert d[x].device.name == device
    hv = (d[x] * np.ones(3)).sum().derivatives()[x]
    np.testing.assert_allclose(hv, 2 * np.cos(x0) - x0 * np.sin(x0), rtol=1e-12)


def test_from_scalars_steps():
    lst = ad.WengertList()
    a, b = lst.variable(1.5), lst.variable(-0.5)
    t = _structural.from_scalars(ad.Tensor, _devices.resolve("numpy"), np.dtype(np.float64),
                                 [a, 2.0, b * a, b], (2, 2))
    z = (t ** 2 * np.array([[1.0, 2.0], [3.0, 4.0]])).sum()
    assert "from_scalars" in assert_steps(lst)
    d = z.derivatives(create_graph=True)
    # z = a^2 + 8 + 3 a^2 b^2 + 4 b^2
    da, db = 2 * 1.5 + 6 * 1.5 * 0.25, 6 * 2.25 * -0.5 + 8 * -0.5
    assert d[a].number == pytest.approx(da, rel=1e-14)
    assert d[b].number == pytest.approx(db, rel=1e-14)
    assert d[a].derivatives()[b] == pytest.approx(12 * 1.5 * -0.5, rel=1e-14)


@pytest.mark.parametrize("name", sorted(CASES))
def test_second_derivatives_through_the_steps_are_finite_differences(name):
    """H v through each node's graph (create_graph) against central differences of the
    gradient along v."""
    f, shapes, _ = CASES[name]
    lst, values, xs = _inputs(shapes, "numpy")
    vs = [np.random.default_rng(3).standard_normal(s) for s in shapes]
    d = f(*xs).derivatives(create_graph=True)
    total = sum((d[x] * v).sum() for x, v in zip(xs, vs))
    assert_steps(lst)                             # what the graphs recorded: steps too
    hv = total.derivatives() if not isinstance(total, float) else None

    def gradient(point):
        lst2 = ad.WengertList()
        ts = [ad.Tensor.variable(p, lst2) for p in point]
        d2 = f(*ts).derivatives()
        return [d2[t] for t in ts]
    h = 1e-6
    up = gradient([x + h * v for x, v in zip(values, vs)])
    down = gradient([x - h * v for x, v in zip(values, vs)])
    for k, x in enumerate(xs):
        expected = (up[k] - down[k]) / (2 * h)
        got = hv[x] if hv is not None else np.zeros(x.shape)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, err_msg=f"input {k}")


def test_third_derivatives_through_put(device):
    """getitem's graph records put, whose graph records getitem again."""
    lst = ad.WengertList()
    x0, v = np.array([0.5, -1.0, 1.5, 2.0]), np.array([1.0, 2.0, -1.0, 3.0])
    x = ad.Tensor.variable(x0, lst, device=device)
    # x0^3 + x1^3 + 3 x2^3
    d1 = ((x[[0, 2, 2]] ** 3).sum() + (x[1:3] ** 3).sum()).derivatives(create_graph=True)[x]
    d2 = (d1 * v).sum().derivatives(create_graph=True)[x]
    assert "put" in assert_steps(lst)
    np.testing.assert_allclose(d2.value, [6, 6, 18, 0] * x0 * v, rtol=1e-14)
    d3 = (d2 * v).sum().derivatives()[x]
    np.testing.assert_allclose(d3, [6, 6, 18, 0] * v ** 2, rtol=1e-14)


def _softplus_vjp(g, x, out):
    return g / (1.0 + ad.exp(-x))


def _softplus(x):
    return np.logaddexp(0.0, x)


def _sin_times(x, y):
    return np.sin(x) * y


def test_array_primitives_record_steps(device):
    """A user primitive's node holds a step too (the user's vjp is its data), with a graph
    for a differentiable vjp and for central differences, none otherwise."""
    softplus = ad.define("softplus", _softplus, vjp=_softplus_vjp, differentiable=True)
    plain = ad.define("plain", _softplus, vjp=_softplus_vjp)
    numeric = ad.define("numeric", _sin_times, vjp="numeric")
    lst = ad.WengertList()
    x0 = np.array([0.5, -1.0, 2.0])
    x = ad.Tensor.variable(x0, lst, device=device)
    y = lst.variable(1.5)
    z = (softplus(x) * numeric(x, y)).sum() + plain(x).sum()
    found = {node.label: node for node in nodes(lst)}
    for name in ("softplus", "plain", "numeric"):
        assert isinstance(found[name].vjp, Step)
    assert found["plain"].graph is None
    assert found["softplus"].graph.__self__ is found["softplus"].vjp
    assert found["numeric"].graph.__self__ is found["numeric"].vjp
    s = 1.0 / (1.0 + np.exp(-x0))
    d = z.derivatives()
    expected = (s * np.sin(x0) * 1.5 + np.logaddexp(0.0, x0) * np.cos(x0) * 1.5 + s)
    np.testing.assert_allclose(d[x], expected, rtol=1e-8)
    assert d[y] == pytest.approx(float((np.logaddexp(0.0, x0) * np.sin(x0)).sum()), rel=1e-8)
    lst2 = ad.WengertList()
    x2 = ad.Tensor.variable(x0, lst2, device=device)
    d2 = (softplus(x2) * numeric(x2, 1.5)).sum().derivatives(create_graph=True)[x2]
    hv = (d2 * np.ones(3)).sum().derivatives()[x2]
    sp, c, sn = s * (1.0 - s), np.cos(x0) * 1.5, np.sin(x0) * 1.5
    np.testing.assert_allclose(hv, sp * sn + 2 * s * c - np.logaddexp(0.0, x0) * sn,
                               rtol=1e-5)


def _mixed(x):
    """Every converted step in one function of a vector (12,)."""
    a = x.reshape((3, 4))
    h = F.sigmoid(F.linear(a, W, B))                                  # (3, 5)
    j = ad.concatenate([h, a[:, :2] * a[:, 1:3]], axis=1)             # (3, 7)
    k = ad.where(j > 0.3, j * j, j)
    logits = k @ np.linspace(-1.0, 1.0, 21).reshape(7, 3)             # (3, 3)
    return (F.cross_entropy(logits, np.array([2, 0, 1])) + (logits.T[0] ** 2).sum() * 0.1
            + a[[0, 2, 0]].sum(axis=0).max() + ad.sin(x[5]) * x[1])


def test_hessian_of_a_function_through_every_step(rng):
    x0 = rng.uniform(-1.0, 1.0, 12)
    grad = ad.grad(_mixed)
    h = 1e-6
    fd = np.stack([(grad(x0 + h * e) - grad(x0 - h * e)) / (2 * h) for e in np.eye(12)])
    H = ad.hessian(_mixed)(x0)
    np.testing.assert_allclose(H, fd, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(H, H.T, rtol=1e-12, atol=1e-12)
    v = rng.standard_normal(12)
    np.testing.assert_allclose(ad.hvp(_mixed, x0, v), fd.T @ v, rtol=1e-6, atol=1e-6)
    lst = ad.WengertList()
    x = ad.Tensor.variable(x0, lst)
    d = _mixed(x).derivatives(create_graph=True)
    assert {"linear", "sigmoid", "concatenate", "where", "matmul", "cross_entropy",
            "transpose", "getitem", "sum", "max", "reshape"} <= assert_steps(lst)
    np.testing.assert_allclose((d[x] * v).sum().derivatives()[x], fd.T @ v, rtol=1e-6,
                               atol=1e-6)


def test_a_releasing_sweep_drops_every_step(rng):
    lst = ad.WengertList()
    x = ad.Tensor.variable(rng.uniform(-1.0, 1.0, 12), lst)
    z = _mixed(x)
    lst._backward_from(z, None, True)
    for node in nodes(lst):
        if node.inputs:
            assert node.vjp is _released_vjp and node.graph is _released_vjp, node


def test_recording_leaves_no_garbage_cycles(rng):
    """A step holds no tape (nor a recorded tensor): a list and its tensors go with their
    last reference, without the cyclic collector."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for name in sorted(CASES):
            f, shapes, _ = CASES[name]
            lst, _, xs = _inputs(shapes, "numpy")
            f(*xs).derivatives()
            del lst, xs
        lst = ad.WengertList()
        _mixed(ad.Tensor.variable(rng.uniform(-1.0, 1.0, 12), lst)).derivatives(
            create_graph=True)
        del lst
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()
