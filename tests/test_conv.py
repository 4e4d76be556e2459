"""Convolution and pooling in ``nn`` (``nn.functional``'s conv1d... and the layers) against
torch 2.13.0's with the same weights, forward and backward, float64 and float32; torch's
initialisation, max pooling's ties, errors, batching rules. (Each op of
``ops/_conv.py``/``_pool.py`` through every engine: tests/test_ops_conv.py.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import easyad as ad
from easyad import nn, ops
from easyad.errors import ShapeError

from conftest import OPENCL


# ---- nn.functional against torch, same weights, forward and backward ----

def _t(a, dtype):
    return torch.tensor(a, dtype=dtype, requires_grad=True)


CONVS = {   # name: (ours, torch's, input shape, weight shape, keyword arguments)
    "conv1d": (nn.functional.conv1d, TF.conv1d, (2, 4, 9), (6, 2, 3),
               {"stride": 2, "padding": 1, "dilation": 2, "groups": 2}),
    "conv1d same": (nn.functional.conv1d, TF.conv1d, (2, 3, 8), (4, 3, 4),
                    {"padding": "same", "dilation": 1}),
    "conv2d": (nn.functional.conv2d, TF.conv2d, (2, 3, 7, 6), (4, 3, 3, 2), {}),
    "conv2d stride padding": (nn.functional.conv2d, TF.conv2d, (2, 4, 8, 7), (6, 2, 3, 3),
                              {"stride": (2, 1), "padding": (1, 2), "groups": 2}),
    "conv2d dilation same": (nn.functional.conv2d, TF.conv2d, (1, 2, 7, 7), (3, 2, 2, 3),
                             {"padding": "same", "dilation": (2, 1)}),
    "conv2d valid unbatched": (nn.functional.conv2d, TF.conv2d, (3, 5, 5), (2, 3, 2, 2),
                               {"padding": "valid"}),
    "conv2d depthwise": (nn.functional.conv2d, TF.conv2d, (2, 4, 6, 6), (8, 1, 3, 3),
                         {"groups": 4, "padding": 1, "stride": 2}),
    "conv_transpose2d": (nn.functional.conv_transpose2d, TF.conv_transpose2d, (2, 4, 4, 3),
                         (4, 3, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
    "conv_transpose2d groups dilation": (
        nn.functional.conv_transpose2d, TF.conv_transpose2d, (1, 4, 3, 3), (4, 1, 2, 2),
        {"groups": 2, "dilation": 2, "stride": (1, 2)}),
}
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


def _compare(ours, theirs, dtype, what):
    np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=TOLERANCE[dtype],
                               atol=TOLERANCE[dtype], err_msg=what)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name", list(CONVS))
def test_convolutions_against_torch(name, dtype):
    ours, theirs, xs, ws, kw = CONVS[name]
    rng = np.random.default_rng(len(name))
    npd = np.float64 if dtype == torch.float64 else np.float32
    x, w = rng.normal(size=xs).astype(npd), rng.normal(size=ws).astype(npd)
    out_channels = ws[1] * kw.get("groups", 1) if "transpose" in name else ws[0]
    b = rng.normal(size=out_channels).astype(npd)
    tx, tw, tb = _t(x, dtype), _t(w, dtype), _t(b, dtype)
    ty = theirs(tx, tw, tb, **kw)
    g = rng.normal(size=tuple(ty.shape)).astype(npd)
    ty.backward(torch.tensor(g))
    lst = ad.WengertList()
    X, W, B = (ad.Tensor.variable(a, lst) for a in (x, w, b))
    y = ours(X, W, B, **kw)
    assert y.dtype == npd
    _compare(y.value, ty, dtype, "value")
    d = ad.sum(y * g).derivatives()
    for mine, t, label in ((X, tx, "input"), (W, tw, "weight"), (B, tb, "bias")):
        _compare(d[mine], t.grad, dtype, label)


POOLS = {   # name: (ours, torch's, input shape, keyword arguments)
    "max_pool2d": (nn.functional.max_pool2d, TF.max_pool2d, (2, 3, 6, 6), {"kernel_size": 2}),
    "max_pool2d stride padding dilation": (
        nn.functional.max_pool2d, TF.max_pool2d, (2, 2, 9, 8),
        {"kernel_size": (3, 2), "stride": (2, 1), "padding": (1, 1), "dilation": (1, 2)}),
    "avg_pool2d": (nn.functional.avg_pool2d, TF.avg_pool2d, (2, 3, 6, 7),
                   {"kernel_size": 3, "stride": 2, "padding": 1}),
    "avg_pool2d pad not counted": (
        nn.functional.avg_pool2d, TF.avg_pool2d, (1, 2, 5, 6),
        {"kernel_size": (3, 2), "stride": 1, "padding": (1, 1), "count_include_pad": False}),
    "adaptive_avg_pool2d": (nn.functional.adaptive_avg_pool2d, TF.adaptive_avg_pool2d,
                            (2, 3, 7, 10), {"output_size": (3, 4)}),
    "adaptive_avg_pool2d one": (nn.functional.adaptive_avg_pool2d, TF.adaptive_avg_pool2d,
                                (3, 5, 4), {"output_size": 1}),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name", list(POOLS))
def test_pooling_against_torch(name, dtype):
    ours, theirs, xs, kw = POOLS[name]
    rng = np.random.default_rng(len(name))
    npd = np.float64 if dtype == torch.float64 else np.float32
    x = rng.normal(size=xs).astype(npd)
    tx = _t(x, dtype)
    ty = theirs(tx, **kw)
    g = rng.normal(size=tuple(ty.shape)).astype(npd)
    ty.backward(torch.tensor(g))
    lst = ad.WengertList()
    X = ad.Tensor.variable(x, lst)
    y = ours(X, **kw)
    assert y.dtype == npd
    _compare(y.value, ty, dtype, "value")
    _compare(ad.sum(y * g).derivatives()[X], tx.grad, dtype, "input")


# ---- the layers: torch's state_dict, forward and backward; torch's initialisation ----

def _models(dtype):
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.ConvTranspose2d(4, 3, 2, stride=2), torch.nn.AvgPool2d(2, padding=1),
        torch.nn.AdaptiveAvgPool2d((2, 3)), torch.nn.Flatten(), torch.nn.Linear(18, 2)
    ).to(dtype)
    ours = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1, dtype=_np(dtype)), nn.ReLU(), nn.MaxPool2d(2),
        nn.ConvTranspose2d(4, 3, 2, stride=2, dtype=_np(dtype)), nn.AvgPool2d(2, padding=1),
        nn.AdaptiveAvgPool2d((2, 3)), nn.Flatten(), nn.Linear(18, 2, dtype=_np(dtype)))
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return ours, theirs


def _np(dtype):
    return np.float64 if dtype == torch.float64 else np.float32


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_layers_load_torchs_state_dict_and_agree(dtype):
    ours, theirs = _models(dtype)
    x = np.random.default_rng(0).normal(size=(3, 2, 6, 6)).astype(_np(dtype))
    ty = theirs(torch.tensor(x))
    (ty ** 2).sum().backward()
    lst = ad.WengertList()
    y = ours(x, tape=lst)
    _compare(y.value, ty, dtype, "value")
    d = ad.sum(y * y).derivatives()
    grads = {name: p.grad for name, p in theirs.named_parameters()}
    for name, p in ours.named_parameters():
        _compare(d[p], grads[name], dtype, name)


def test_layers_initialise_as_torch():
    # U(-b, b), b = 1/sqrt(fan_in), fan_in = weight.shape[1] * prod(kernel), bias alike
    for layer, fan_in in ((nn.Conv2d(6, 12, (3, 5), groups=3, generator=1), 2 * 15),
                          (nn.Conv1d(4, 8, 3, generator=2), 12),
                          (nn.ConvTranspose2d(4, 6, 3, groups=2, generator=3), 3 * 9)):
        bound = 1.0 / np.sqrt(fan_in)
        for p in (layer.weight.data, layer.bias.data):
            assert np.abs(p).max() <= bound and np.abs(p).max() > 0.8 * bound
    assert nn.Conv2d(6, 12, (3, 5), groups=3).weight.shape == (12, 2, 3, 5)
    assert nn.ConvTranspose2d(4, 6, 3, groups=2).weight.shape == (4, 3, 3, 3)


# ---- ties, errors, batching ----

def test_max_pool_ties_give_the_first_maximum_the_derivative():
    x = np.array([[[[1.0, 1.0, 0.0, 2.0], [1.0, 0.5, 2.0, 2.0],
                    [3.0, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 3.0]]]])
    g = np.array([[[[1.0, 2.0], [3.0, 4.0]]]])
    tx = torch.tensor(x, requires_grad=True)
    TF.max_pool2d(tx, 2).backward(torch.tensor(g))
    want = np.zeros_like(x)
    want[0, 0, 0, 0], want[0, 0, 0, 3], want[0, 0, 2, 0], want[0, 0, 2, 2] = 1, 2, 3, 4
    np.testing.assert_array_equal(tx.grad.numpy(), want)        # torch's choice ...
    for device in ["numpy", *OPENCL]:
        lst = ad.WengertList()
        X = ad.Tensor.variable(x, lst, device=device)
        d = ad.sum(nn.functional.max_pool2d(X, 2) * g).derivatives()
        np.testing.assert_array_equal(d[X], want)               # ... is ours
        dt = nn.functional.max_pool2d(ad.TraceTensor.variable(x, np.ones_like(x)), 2)
        np.testing.assert_array_equal(dt.tangent, np.ones((1, 1, 2, 2)))
    # overlapping windows add: the centre is every window's first maximum
    y = np.zeros((1, 1, 3, 3))
    y[0, 0, 1, 1] = 1.0
    lst = ad.WengertList()
    Y = ad.Tensor.variable(y, lst)
    assert ad.sum(nn.functional.max_pool2d(Y, 2, 1)).derivatives()[Y][0, 0, 1, 1] == 4.0


@pytest.mark.parametrize("device", ["numpy", *OPENCL[:1]])
def test_max_pool_nan_takes_the_derivative_as_torchs(device):
    x = np.random.default_rng(2).normal(size=(1, 2, 4, 5))
    x[0, 0, 0, 1] = x[0, 0, 1, 0] = x[0, 1, 2, 2] = np.nan     # two NaNs in one window
    g = np.random.default_rng(3).normal(size=(1, 2, 3, 4))
    tx = torch.tensor(x, requires_grad=True)
    TF.max_pool2d(tx, 2, 1).backward(torch.tensor(g))
    lst = ad.WengertList()
    X = ad.Tensor.variable(x, lst, device=device)
    y = nn.functional.max_pool2d(X, 2, 1)
    np.testing.assert_array_equal(np.isnan(y.value), np.isnan(
        TF.max_pool2d(torch.tensor(x), 2, 1).numpy()))
    np.testing.assert_allclose(ad.sum(y * g).derivatives()[X], tx.grad.numpy(), rtol=1e-15)


@pytest.mark.parametrize("call, message", [
    (lambda: nn.functional.conv2d(np.ones((1, 3, 5, 5)), np.ones((2, 2, 3, 3))),
     "3 channels"),
    (lambda: nn.functional.conv2d(np.ones((1, 2, 2, 2)), np.ones((2, 2, 3, 3))),
     "does not fit"),
    (lambda: nn.functional.conv2d(np.ones((5, 5)), np.ones((2, 1, 3, 3))), "must have 4 axes"),
    (lambda: nn.functional.conv2d(np.ones((1, 4, 5, 5)), np.ones((3, 2, 3, 3)), groups=2),
     "do not split"),
    (lambda: nn.functional.conv2d(np.ones((1, 1, 5, 5)), np.ones((2, 1, 3, 3)),
                                  np.ones(3)), "one per output channel"),
    (lambda: nn.functional.max_pool2d(np.ones((1, 1, 1, 1)), 2), "does not fit"),
    (lambda: ops.conv_transpose(np.ones((1, 2, 3)), np.ones((2, 1, 2)), size=(9,)),
     "convolves to"),
])
def test_bad_shapes_raise_shape_errors_naming_the_fix(call, message):
    with pytest.raises(ShapeError, match=message):
        call()


@pytest.mark.parametrize("call, message", [
    (lambda: nn.functional.conv2d(np.ones((1, 1, 5, 5)), np.ones((1, 1, 3, 3)), stride=2,
                                  padding="same"), "needs stride 1"),
    (lambda: nn.functional.max_pool2d(np.ones((1, 1, 5, 5)), 2, padding=2), "at most half"),
    (lambda: nn.functional.avg_pool2d(np.ones((1, 1, 5, 5)), 2, ceil_mode=True),
     "ceil_mode"),
    (lambda: ops.conv(np.ones((1, 5)), np.ones((1, 1, 2)), stride=(1, 2)), "2 entries"),
])
def test_bad_parameters_raise(call, message):
    with pytest.raises((ValueError, NotImplementedError), match=message):
        call()


def test_batching_rules_match_a_loop():
    rng = np.random.default_rng(5)
    stack, w = rng.normal(size=(2, 3, 4, 6, 6)), rng.normal(size=(5, 4, 3, 3))
    conv = ops.get("conv")
    for axis in (0, 1):
        _, p = conv.rule(conv.bind({"padding": (1,), "stride": (2,)}),
                         np.take(stack, 0, axis).shape, w.shape)
        p, out_axis = conv.batch(p, axis)
        by_rule = ops.apply(conv, p, (stack, w))
        loop = np.stack([ops.conv(np.take(stack, k, axis), w, padding=1, stride=2)
                         for k in range(stack.shape[axis])], axis=out_axis)
        np.testing.assert_allclose(by_rule, loop, rtol=1e-13, atol=1e-13)
    for name, kw in (("max_pool", {"kernel": (2, 2)}), ("avg_pool", {"kernel": (3, 3),
                                                                     "padding": (1,)})):
        by_rule = ops.batched(ops.get(name), stack, 1, **kw)
        loop = [ops.call(ops.get(name), (stack[:, k],), kw) for k in range(3)]
        np.testing.assert_array_equal(by_rule, np.stack(loop, axis=1))
    # a batch axis among the channels or the pooled axes is refused, never misread
    with pytest.raises(NotImplementedError, match="before the channels"):
        conv.batch(p, 2)
    with pytest.raises(NotImplementedError, match="before the 2 pooled axes"):
        ops.batched(ops.get("max_pool"), stack, 3, kernel=(2, 2))


@pytest.mark.skipif(not OPENCL, reason="no OpenCL device")
def test_a_cnn_on_opencl_runs_the_kernels_and_matches_numpy():
    import warnings
    ad.random.seed(0)
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.ConvTranspose2d(4, 3, 2, stride=2), nn.AvgPool2d(2, padding=1),
        nn.AdaptiveAvgPool2d((2, 3)), nn.Flatten(), nn.Linear(18, 2))
    x = np.random.default_rng(0).normal(size=(3, 2, 6, 6))
    y = model(x, tape=ad.WengertList())
    d = ad.sum(y * y).derivatives()
    want = {name: np.asarray(d[p]) for name, p in model.named_parameters()}
    model.to(OPENCL[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ad.KernelFallbackWarning)   # every kernel proven
        y2 = model(x, tape=ad.WengertList())
        d2 = ad.sum(y2 * y2).derivatives()
    np.testing.assert_allclose(np.asarray(y2.value), y.value, rtol=1e-12, atol=1e-14)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(np.asarray(d2[p]), want[name], rtol=1e-12, atol=1e-14,
                                   err_msg=name)


def test_conv1d_layer_and_flatten_against_torch():
    torch.manual_seed(1)
    theirs = torch.nn.Sequential(torch.nn.Conv1d(3, 4, 3, padding="same", dilation=2),
                                 torch.nn.Flatten(0, 1)).double()
    ours = nn.Sequential(nn.Conv1d(3, 4, 3, padding="same", dilation=2), nn.Flatten(0, 1))
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x = np.random.default_rng(4).normal(size=(2, 3, 7))
    ty = theirs(torch.tensor(x))
    (ty ** 3).sum().backward()
    y = ours(x, tape=ad.WengertList())
    assert y.shape == tuple(ty.shape) == (8, 7)
    _compare(y.value, ty, torch.float64, "value")
    d = ad.sum(y * y * y).derivatives()
    for name, p in theirs.named_parameters():
        _compare(d[dict(ours.named_parameters())[name]], p.grad, torch.float64, name)
