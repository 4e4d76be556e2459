"""prod, cumprod and recurrence (and cumsum) in recorded programs' fused C (``Op.loop``,
``compiler/program/table_c.py``): each op step one C function of the program's library,
so value, gradient and Hessian-vector programs have no Python step on their account and
batches run in one C loop. Checked against the unfused replay (the eager ops), numpy and
torch.func, with zeros (one and several a line), ties, -0.0, inf and NaN, float32."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import grad, jvp

import easyad as ad
from easyad.compiler.program import table_c
from easyad.compiler.program.fused_c import FusedProgram
from easyad.ops._loops import axis_lines
from easyad.ops._prod_ops import recurrence

RNG = np.random.default_rng(26)
SHAPE = (3, 4, 5)
W = [RNG.normal(size=s) for s in [(3, 5), (1, 4, 1), (3, 4, 5), (3, 4, 5), (4, 5)]]


def _torch_recurrence(a, b):
    out = [b[0]]
    for k in range(1, a.shape[0]):
        out.append(a[k] * out[-1] + b[k])
    return torch.stack(out)


def loss(x):
    """Every line loop: prod along one axis, two apart (kept), all (1-d); cumprod along
    the last and the first axis; the recurrence along the first."""
    return (ad.sum(ad.sin(ad.prod(x, axis=1)) * W[0])
            + ad.sum(ad.prod(x, axis=(0, 2), keepdims=True) * W[1])
            + ad.sin(ad.prod(x[0, 0]))
            + ad.sum(ad.sin(ad.cumprod(x, axis=2)) * W[2])
            + ad.sum(ad.cumprod(x, axis=0) * W[3])
            + ad.sum(ad.sin(recurrence(x[0], x[1], axis=0)) * W[4]))


def torch_loss(t):
    w = [torch.tensor(a) for a in W]
    return ((torch.sin(torch.prod(t, 1)) * w[0]).sum()
            + (torch.prod(torch.prod(t, 2, keepdim=True), 0, keepdim=True) * w[1]).sum()
            + torch.sin(torch.prod(t[0, 0]))
            + (torch.sin(torch.cumprod(t, 2)) * w[2]).sum()
            + (torch.cumprod(t, 0) * w[3]).sum()
            + (torch.sin(_torch_recurrence(t[0], t[1])) * w[4]).sum())


def _point(seed):
    """A point with one zero in some lines, two in others, and ties."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.4, 1.4, size=SHAPE)
    x[0, 1, 2] = 0.0                        # one zero (a line of axis 1, of axis 2...)
    x[1, 2, 0] = x[1, 2, 3] = 0.0           # two in one line of axis 2
    x[2, :, 4] = 0.0                        # a whole line of axis 1
    x[1, 0, :] = x[1, 0, 0]                 # ties
    return x


def _lowered_only(bound):
    """The fused program runs every prod/cumprod/recurrence step as C: no Python step."""
    assert isinstance(bound, FusedProgram)
    ops = [item for kind, item in bound.plan.schedule if kind == "py"]
    assert ops and all(item.op == "op" and id(item) in bound.lowered for item in ops), \
        [(item.op, getattr(item.params, "op", None)) for item in ops]
    return len(ops)


def test_fused_matches_unfused_numpy_and_torch():
    x, v = _point(1), RNG.normal(size=SHAPE)
    T = ad.record(loss, _point(0), tensor=True)
    U = ad.record(loss, _point(0), tensor=True, fuse=False)
    value, g = T.value_and_gradient(x)
    hv = np.asarray(T.hvp(x, v))
    for what in ("gradient", "hvp"):
        assert _lowered_only(T._bound[what]) >= 4
    u_value, u_g = U.value_and_gradient(x)
    assert abs(value - u_value) <= 1e-13 * abs(u_value)
    np.testing.assert_allclose(g, u_g, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(hv, np.asarray(U.hvp(x, v)), rtol=1e-12, atol=1e-13)
    # numpy's value, torch.func's gradient and Hessian-vector product
    assert abs(float(T(x)) - value) == 0.0
    tx, tv = torch.tensor(x), torch.tensor(v)
    assert abs(value - float(torch_loss(tx))) <= 1e-12 * abs(value)
    np.testing.assert_allclose(g, grad(torch_loss)(tx).numpy(), rtol=1e-11, atol=1e-12)
    t_hv = jvp(grad(torch_loss), (tx,), (tv,))[1].numpy()
    np.testing.assert_allclose(hv, t_hv, rtol=1e-10, atol=1e-11)


SPECIAL = np.array([[2.0, 0.0, 5.0, -0.0, 1.5, 3.0],
                    [1.1, -0.0, 1.3, 1.4, 0.5, 2.0],
                    [0.5, -2.0, np.inf, 0.7, 0.0, 1.0],
                    [np.nan, 1.0, 3.0, 0.5, 2.0, 1.0],
                    [0.0, 0.0, 4.0, -1.0, 1e300, 1e300]])
OPS = {"cumprod axis 1": lambda x: ad.cumprod(x, axis=1),
       "cumprod axis 0": lambda x: ad.cumprod(x, axis=0),
       "prod axis 1": lambda x: ad.prod(x, axis=1),
       "prod axis 0 kept": lambda x: ad.prod(x, axis=0, keepdims=True),
       "recurrence": lambda x: recurrence(x, x[::-1] * 0.5, axis=1),
       "cumsum axis 1": lambda x: ad.cumsum(x, axis=1)}


def _same_bits(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, what
    assert np.array_equal(np.isnan(a), np.isnan(b)), what
    ok = ~np.isnan(a)
    np.testing.assert_array_equal(a[ok], b[ok], err_msg=what)
    np.testing.assert_array_equal(np.signbit(a[ok]), np.signbit(b[ok]), err_msg=what)


@pytest.mark.parametrize("name", list(OPS))
def test_special_values_as_the_unfused_op(name):
    # -0.0, inf, NaN, overflow, zeros: the op's values bit for bit (the recurrence: the
    # eager op's loop, which it takes where a value is not finite; here at a finite row
    # too, so that one is compared to the loop), its gradient as the unfused replay's
    f = OPS[name]
    x = SPECIAL
    T = ad.record(f, np.ones_like(x), tensor=True)
    U = ad.record(f, np.ones_like(x), tensor=True, fuse=False)
    got = T(x)
    _lowered_only(T._bound["value"])
    if name == "recurrence":
        b = x[::-1] * 0.5
        loop = np.empty_like(x)
        loop[:, 0] = b[:, 0]
        for k in range(1, x.shape[1]):
            loop[:, k] = x[:, k] * loop[:, k - 1] + b[:, k]
        _same_bits(got, loop, name)
        _same_bits(got[2:4], U(x)[2:4], name)     # rows with inf, NaN: the loop's too
    else:
        _same_bits(got, U(x), name)
        numpy_op = {"cumprod axis 1": lambda a: np.cumprod(a, 1),
                    "cumprod axis 0": lambda a: np.cumprod(a, 0),
                    "prod axis 1": lambda a: np.prod(a, 1),
                    "prod axis 0 kept": lambda a: np.prod(a, 0, keepdims=True),
                    "cumsum axis 1": lambda a: np.cumsum(a, 1)}[name]
        with np.errstate(invalid="ignore", over="ignore"):
            _same_bits(got, numpy_op(x), name)
    w = np.random.default_rng(7).normal(size=np.shape(got))
    G = ad.record(lambda z: ad.sum(f(z) * w), np.ones_like(x), tensor=True)
    H = ad.record(lambda z: ad.sum(f(z) * w), np.ones_like(x), tensor=True, fuse=False)
    ours, theirs = G.gradient(x), H.gradient(x)
    _lowered_only(G._bound["gradient"])
    assert np.array_equal(np.isnan(ours), np.isnan(theirs)), name
    assert np.array_equal(np.isinf(ours), np.isinf(theirs)), name
    finite = np.isfinite(theirs)
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-13, atol=0, err_msg=name)


def test_prod_gradient_with_zeros_against_torch():
    # one zero: only its place gets the others' product; two: all zero (no division)
    x = np.array([[2.0, 0.0, 5.0, 1.5], [0.0, 1.2, 0.0, 1.4], [0.5, -2.0, 3.0, 0.7]])
    T = ad.record(lambda z: ad.sum(ad.prod(z, axis=1) * np.array([1.0, 2.0, 3.0])),
                  np.ones_like(x), tensor=True)
    g = T.gradient(x)
    _lowered_only(T._bound["gradient"])
    np.testing.assert_array_equal(g[0], [0.0, 15.0, 0.0, 0.0])
    np.testing.assert_array_equal(g[1], [0.0, 0.0, 0.0, 0.0])
    t = torch.tensor(x)
    ref = grad(lambda z: (torch.prod(z, 1) * torch.tensor([1.0, 2.0, 3.0])).sum())(t)
    np.testing.assert_allclose(g, ref.numpy(), rtol=1e-15)


def test_batch_is_one_c_loop(monkeypatch):
    T = ad.record(loss, _point(0), tensor=True)
    X = np.stack([_point(s) for s in range(2, 9)])
    V = RNG.normal(size=X.shape)
    singles = [(T.value_and_gradient(x), T.hvp(x, v)) for x, v in zip(X, V)]
    for what in ("value", "gradient", "hvp"):
        if what == "value":
            T(X[0])
        assert T._bound[what].batchable(), what
    # no replay per point: the batch may not call the single-point path
    monkeypatch.setattr(type(T), "_run", lambda *a, **k: pytest.fail("a replay per point"))
    values, grads = T.value_and_gradient(X)
    hvps = np.asarray(T.hvp(X, V))
    np.testing.assert_array_equal(T(X), values)
    for b, ((value, g), hv) in enumerate(singles):        # the same C: the same bits
        assert values[b] == value
        np.testing.assert_array_equal(grads[b], g)
        np.testing.assert_array_equal(hvps[b], hv)
    # over threads, each on its own copy of the workspace the C functions write
    from easyad.compiler.program import fused_c
    monkeypatch.setattr(fused_c, "_PARALLEL_BATCH", 1)
    monkeypatch.setattr(fused_c, "_BATCH_THREADS", 3)
    threaded = T.value_and_gradient(X)
    np.testing.assert_array_equal(threaded[0], values)
    np.testing.assert_array_equal(threaded[1], grads)


def test_float32_rounds_as_the_eager_op():
    x = RNG.uniform(0.2, 1.8, size=(4, 50)).astype(np.float32)
    x[1, 7] = 0.0
    for f, ref in ((lambda z: ad.cumprod(z, axis=1), lambda a: np.cumprod(a, 1)),
                   (lambda z: ad.prod(z, axis=1), lambda a: np.prod(a, 1))):
        T = ad.record(f, np.ones_like(x), tensor=True)
        got = T(x)
        _lowered_only(T._bound["value"])
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, ref(x))      # float32 products, in order
    T = ad.record(lambda z: ad.sum(ad.cumprod(z, axis=1)), np.ones_like(x), tensor=True)
    g = T.gradient(x)
    assert g.dtype == np.float32
    tx = torch.tensor(x, dtype=torch.float64)
    ref = grad(lambda z: torch.cumprod(z, 1).sum())(tx).numpy()
    np.testing.assert_allclose(g, ref, rtol=2e-5, atol=1e-6)


def test_line_offsets():
    # the generated offsets (adjacent axes merged, others by division) against numpy's
    # lines, on a 4-d operand: prod over axes apart, adjacent, all; cumprod mid-axis
    x = np.random.default_rng(4).uniform(0.5, 1.5, size=(2, 3, 4, 5))
    calls = {"prod (0, 2)": (lambda z: ad.prod(z, axis=(0, 2)), lambda a: np.prod(a, (0, 2))),
             "prod (1, 2)": (lambda z: ad.prod(z, axis=(1, 2), keepdims=True),
                             lambda a: np.prod(a, (1, 2), keepdims=True)),
             "prod (0, 3)": (lambda z: ad.prod(z, axis=(0, 3)), lambda a: np.prod(a, (0, 3))),
             "cumprod 2": (lambda z: ad.cumprod(z, axis=2), lambda a: np.cumprod(a, 2))}
    T = ad.record(lambda z: [f(z) for f, _ in calls.values()], x, tensor=True)
    x1 = x[::-1].copy()
    for got, (name, (_, ref)) in zip(T(x1), calls.items()):
        np.testing.assert_allclose(got, ref(x1), rtol=1e-15, atol=0, err_msg=name)
    _lowered_only(T._bound["value"])
    assert axis_lines((2, 0, 3), (1,), "double", "prod").body == "y[line] = (double)1;\n"
    assert axis_lines((2, 0, 3), (1,), "double", "cumprod").lines == 0
    with pytest.raises(ValueError, match="no line loop 'sum'"):
        axis_lines((3,), (0,), "double", "sum")


def test_table_c_refuses_what_it_cannot_render():
    from easyad.tensor._program import Instruction

    class P:
        dtypes = [np.dtype(np.float64), np.dtype(np.int64)]
        shapes = [(3,), (3,)]
    from easyad.compiler.ir import TableOp
    from easyad import ops
    op = TableOp(ops.get("cumprod"), ops.get("cumprod").bind({"axis": 0}), (3,),
                 np.dtype(np.float64))
    assert table_c.lowerable(Instruction("op", op, (0,), (0,)), P)
    assert not table_c.lowerable(Instruction("op", op, (1,), (0,)), P)     # an int operand
    assert not table_c.lowerable(Instruction("op", op, (2.0,), (0,)), P)   # a number


def test_opencl_batch_is_one_program(monkeypatch):
    # on OpenCL the ops run their kernels once over every point's lines (the batching
    # rule), the shifts' assembles once for the chunk: no replay per point
    from conftest import OPENCL
    from easyad.compiler.program import batch_cl
    if not OPENCL:
        pytest.skip("no working OpenCL device")

    def f(h):
        s = ad.cumprod(1.0 - h, axis=1)
        return ad.sum(ad.sin(s) * W[4]) + ad.sum(ad.prod(h, axis=0)) + \
            ad.sum(ad.concatenate([h[:1], s[1:]]) * W[4])
    x = _point(0)[0]
    T = ad.record(f, x, tensor=True, device=OPENCL[0])
    U = ad.record(f, x, tensor=True)
    X = np.stack([_point(s)[0] for s in range(1, 6)])
    V = RNG.normal(size=X.shape)
    T.value_and_gradient(x)
    T.hvp(x, x)
    for what in ("gradient", "hvp"):
        assert batch_cl.batched(T._bound[what]) is not None, what
    monkeypatch.setattr(type(T), "_run", lambda *a, **k: pytest.fail("a replay per point"))
    values, grads = T.value_and_gradient(X)
    hvps = np.asarray(T.hvp(X, V))
    monkeypatch.undo()
    u_values, u_grads = U.value_and_gradient(X)
    np.testing.assert_allclose(values, u_values, rtol=1e-13)
    np.testing.assert_allclose(grads, u_grads, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(hvps, np.asarray(U.hvp(X, V)), rtol=1e-12, atol=1e-13)
