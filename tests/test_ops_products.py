"""prod, cumprod and the linear recurrence their derivatives use (``ops/_prod_ops.py``):
every engine (``check_everywhere``), and gradients and Hessians exact where elements are
zero (one, two), infinite or NaN, against torch.func."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import grad, hessian

import easyad as ad
from easyad.errors import ShapeError
from easyad import ops
from easyad.ops._prod_ops import RECURRENCE, AxisParams, recurrence

from _op_engines import Case, check_everywhere
from conftest import OPENCL


def _torch_recurrence(a, b, axis):
    a, b = a.movedim(axis, 0), b.movedim(axis, 0)
    out = [b[0]]
    for k in range(1, a.shape[0]):
        out.append(a[k] * out[-1] + b[k])
    return torch.stack(out).movedim(0, axis)


def _numpy_recurrence(a, b, axis):
    a, b = np.moveaxis(a, axis, 0), np.moveaxis(b, axis, 0)
    out = [b[0]]
    for k in range(1, a.shape[0]):
        out.append(a[k] * out[-1] + b[k])
    return np.moveaxis(np.stack(out), 0, axis)


CASES = {
    "prod every axis kept": Case(ops.get("prod"), lambda x: ad.prod(x, keepdims=True),
                                 lambda x: np.prod(x, keepdims=True),
                                 lambda t: torch.prod(t).reshape(1, 1), (2, 3),
                                 {"axes": None, "keepdims": True}, batch_axis=1),
    "prod axis 1": Case(ops.get("prod"), lambda x: ad.prod(x, axis=1),
                        lambda x: np.prod(x, axis=1), lambda t: torch.prod(t, 1), (3, 4),
                        {"axes": (1,)}, batch_axis=0),
    "prod axes kept": Case(ops.get("prod"), lambda x: ad.prod(x, axis=(0, 2), keepdims=True),
                           lambda x: np.prod(x, axis=(0, 2), keepdims=True),
                           lambda t: torch.prod(torch.prod(t, 2, keepdim=True), 0,
                                                keepdim=True),
                           (2, 3, 2), {"axes": (0, 2), "keepdims": True}, batch_axis=1),
    "cumprod axis 0": Case(ops.get("cumprod"), lambda x: ad.cumprod(x, axis=0),
                           lambda x: np.cumprod(x, axis=0), lambda t: torch.cumprod(t, 0),
                           (3, 2), {"axis": 0}, batch_axis=1),
    "cumprod flattened": Case(ops.get("cumprod"), lambda x: ad.cumprod(x),
                              lambda x: np.cumprod(x), lambda t: torch.cumprod(t.reshape(-1), 0),
                              (2, 3), {"axis": 0}, batch_axis=None),
    "recurrence": Case(ops.get("recurrence"), lambda x: recurrence(x[0], x[1], axis=1),
                       # (the lowering's own rounding: its doubling rounds add in another
                       # order than the loop; the loop is checked below, torch here)
                       lambda x: RECURRENCE.numpy(AxisParams(1), x[0], x[1]),
                       lambda t: _torch_recurrence(t[0], t[1], 1), (2, 2, 4), {},
                       batch_axis=None),   # (two operands: ops.batched takes one)
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_in_every_engine(name):
    check_everywhere(CASES[name])


SPECIAL = {
    "one zero": np.array([[2.0, 0.0, 5.0, 1.5], [1.1, 1.2, 1.3, 1.4], [0.5, -2.0, 3.0, 0.7]]),
    "two zeros": np.array([[2.0, 0.0, 5.0, 0.0], [0.0, 1.2, 1.3, 1.4], [0.5, -2.0, 0.0, 0.7]]),
    "inf": np.array([[2.0, np.inf, 5.0, 1.5], [1.1, 1.2, 1.3, 1.4], [0.5, -2.0, 3.0, 0.7]]),
    "nan": np.array([[2.0, np.nan, 5.0, 1.5], [1.1, 1.2, 1.3, 1.4], [0.5, -2.0, 3.0, 0.7]]),
}
W = np.random.default_rng(3).normal(size=(3, 4))
LOSSES = {
    "prod": (lambda z: ad.prod(z), lambda z: torch.prod(z)),
    "prod axis 1": (lambda z: ad.sum(ad.prod(z, axis=1) * W[:, 0]),
                    lambda z: (torch.prod(z, 1) * torch.tensor(W[:, 0])).sum()),
    "prod axis 0": (lambda z: ad.sum(ad.prod(z, axis=0) * W[0]),
                    lambda z: (torch.prod(z, 0) * torch.tensor(W[0])).sum()),
    "cumprod axis 1": (lambda z: ad.sum(ad.cumprod(z, axis=1) * W),
                       lambda z: (torch.cumprod(z, 1) * torch.tensor(W)).sum()),
    "cumprod flattened": (lambda z: ad.sum(ad.cumprod(z) * W.reshape(-1)),
                          lambda z: (torch.cumprod(z.reshape(-1), 0) *
                                     torch.tensor(W.reshape(-1))).sum()),
}


def _same(ours, theirs, what):
    # equal where torch's is a number or an infinity. Where torch's is NaN ours may be
    # an infinity: cumprod's adjoint x_(k+1) R_(k+1) with x_(k+1) = inf and R finite is
    # +-inf (the limit), where torch's sum of products adds inf and -inf; never finite
    nan = np.isnan(theirs)
    assert not np.isfinite(ours[nan]).any(), what
    np.testing.assert_allclose(ours[~nan], theirs[~nan], rtol=1e-12, atol=1e-12, err_msg=what)


@pytest.mark.parametrize("special", list(SPECIAL))
@pytest.mark.parametrize("loss", list(LOSSES))
def test_gradient_and_hessian_with_zeros_inf_nan(loss, special):
    x = SPECIAL[special]
    ours, theirs = LOSSES[loss]
    tx = torch.tensor(x, dtype=torch.float64)
    g_ref, h_ref = grad(theirs)(tx).numpy(), hessian(theirs)(tx).numpy().reshape(x.size, -1)
    for device in ["numpy", *OPENCL[:1]]:
        lst = ad.WengertList()
        t = ad.Tensor.variable(x, lst, device=device)
        # the sweep's step (on the numpy device: the vjp in numpy) and create_graph's vjp
        _same(np.asarray(ours(t).derivatives()[t]), g_ref, f"{device} sweep's gradient")
        d = ours(t).derivatives(create_graph=True)[t]
        _same(d.value, g_ref, f"{device} gradient")
        if special in ("one zero", "two zeros"):        # the Hessian: create_graph, by rows
            rows = [d.reshape(-1)[k].derivatives()[t].reshape(-1) for k in range(x.size)]
            _same(np.array(rows), h_ref, f"{device} Hessian")
    if special in ("one zero", "two zeros"):
        # forward mode and the scalar tape: the same exact values
        v = np.random.default_rng(1).normal(size=x.shape)
        tt = ad.TraceTensor.variable(x, v)
        assert abs(ours(tt).derivative - float(np.sum(g_ref * v))) <= 1e-12
        _same(np.asarray(ad.hessian(ours)(x)).reshape(x.size, -1), h_ref, "scalar Hessian")


@pytest.mark.parametrize("shape, axis", [((3, 4, 5), (0, 2)), ((2, 300), 1), ((2, 5000), 1),
                                         ((7,), None)])
def test_sweep_steps_on_larger_operands(shape, axis):
    # the numpy sweep's blocked recurrence and transposed lines, against torch
    x = np.random.default_rng(2).uniform(-1.5, 1.5, size=shape)
    x.reshape(-1)[[1, 5]] = 0.0
    tx = torch.tensor(x, requires_grad=True)
    for name in ("prod", "cumprod"):
        if name == "cumprod" and isinstance(axis, tuple):
            continue
        lst = ad.WengertList()
        t = ad.Tensor.variable(x, lst)
        y = getattr(ad, name)(t, axis=axis)
        w = np.random.default_rng(4).normal(size=np.shape(y.value if hasattr(y, "value")
                                                          else y))
        ours = ad.sum(y * w).derivatives()[t]
        if name == "prod" and isinstance(axis, tuple):      # (torch.prod takes one axis)
            ty = torch.prod(torch.prod(tx, axis[1]), axis[0])
        elif name == "prod":
            ty = torch.prod(tx) if axis is None else torch.prod(tx, axis)
        else:
            ty = torch.cumprod(tx.reshape(-1) if axis is None else tx, 0 if axis is None
                               else axis)
        (theirs,) = torch.autograd.grad((ty * torch.tensor(w)).sum(), tx)
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-11, atol=1e-12,
                                   err_msg=name)


def test_recurrence_rounds_match_the_loop():
    rng = np.random.default_rng(5)
    for n in (1000, 3000):               # doubling rounds; blocks (3 x 3000, padded)
        a, b = rng.uniform(-1.1, 1.1, size=(3, n)), rng.normal(size=(3, n))
        np.testing.assert_allclose(recurrence(a, b, axis=1), _numpy_recurrence(a, b, 1),
                                   rtol=1e-12, atol=1e-12)


def test_recurrence_falls_back_to_the_loop_when_the_rounds_overflow():
    # the coefficient products overflow (1e200 * 1e200) though b = 0 there keeps the
    # loop finite: o_k = 0 up to 49, then k - 49 (doubling rounds: 200; blocks: 10000)
    for n in (200, 10000):
        a, b = np.ones(n), np.zeros(n)
        a[1:40], b[50:] = 1e200, 1.0
        np.testing.assert_array_equal(recurrence(a, b), np.maximum(np.arange(n) - 49.0, 0))


def test_numpy_functions_dispatch_and_bad_input():
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    t = ad.Tensor.constant(x)
    assert np.prod(t) == 24.0
    np.testing.assert_array_equal(np.cumprod(t, axis=1).value, np.cumprod(x, axis=1))
    with pytest.raises(np.exceptions.AxisError, match="cumprod: axis 2 is out of bounds"):
        ad.cumprod(t, axis=2)
    with pytest.raises(ShapeError, match="prod: axis -3 is out of range"):   # (as sum's)
        ad.prod(t, axis=-3)
    with pytest.raises(ValueError, match="prod.*repeated"):
        ad.prod(t, axis=(1, -1))
    with pytest.raises(TypeError, match="parameter 'axis' must be int"):
        ad.cumprod(t, axis=1.5)
    # the empty product is 1 and its gradient empty, as numpy's and torch's
    e = ad.Tensor.variable(np.zeros((2, 0)), ad.WengertList())
    y = ad.prod(e, axis=1)
    np.testing.assert_array_equal(y.value, [1.0, 1.0])
    assert ad.sum(y).derivatives()[e].shape == (2, 0)
    with pytest.raises(ValueError, match="differs from the terms' shape"):
        recurrence(t, t[:, :1], axis=1)
    with pytest.raises(TypeError, match="not supported on easyad tensors"):
        np.prod(t, dtype=np.float32)


def test_float32_keeps_its_dtype_on_every_device():
    x = np.array([[1.5, 0.0, -2.0], [0.5, 3.0, 1.25]], dtype=np.float32)
    tx = torch.tensor(x, requires_grad=True)
    (g_prod,) = torch.autograd.grad(torch.prod(tx, 1).sum(), tx)
    (g_cum,) = torch.autograd.grad(torch.cumprod(tx, 1).sum(), tx)
    for device in ["numpy", *OPENCL]:
        t = ad.Tensor.variable(x, ad.WengertList(), device=device)
        for y, ref, g in ((ad.prod(t, axis=1), np.prod(x, 1), g_prod),
                          (ad.cumprod(t, axis=1), np.cumprod(x, 1), g_cum)):
            assert y.dtype is np.dtype(np.float32), device
            np.testing.assert_allclose(y.value, ref, rtol=1e-6, err_msg=device)
            d = ad.sum(y).derivatives()[t]
            assert np.asarray(d).dtype == np.float32, device
            np.testing.assert_allclose(d, g.numpy(), rtol=1e-6, err_msg=device)
