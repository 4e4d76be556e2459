"""Convolution and pooling (``ops/_conv.py``, ``ops/_pool.py``, ``nn``'s conv layers):
each op through every engine (``check_everywhere``: reverse, forward, create_graph,
record/replay, eval_shape, batching), and ``nn.functional``/the layers against
torch 2.13.0's with the same weights, forward and backward, float64 and float32."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import easyad as ad
from easyad import nn, ops
from easyad.errors import ShapeError

from _op_engines import Case, check_everywhere


def _split(shapes):
    """One flat operand cut into arrays (check_everywhere differentiates one operand)."""
    sizes = [int(np.prod(s)) for s in shapes]
    ends = np.cumsum([0] + sizes)

    def cut(x):
        return [x[ends[k]:ends[k + 1]].reshape(s) for k, s in enumerate(shapes)]
    return cut, int(ends[-1])


def _case(op, shapes, ours, theirs, batch_axis=None):
    """A case of op with operands of ``shapes`` cut from one flat x; the values' reference
    is the numpy lowering (ours on arrays), torch's function the derivatives'."""
    cut, n = _split(shapes)
    return Case(ops.get(op), lambda x: ours(*cut(x)), lambda x: ours(*cut(x)),
                lambda t: theirs(*cut(t)), (n,), {}, batch_axis=batch_axis)


CASES = {
    "conv1d": _case("conv", [(1, 2, 5), (2, 2, 2)], ops.conv, TF.conv1d),
    "conv2d stride pad groups": _case(
        "conv", [(1, 2, 4, 4), (2, 1, 2, 2)],
        lambda x, w: ops.conv(x, w, stride=2, padding=1, groups=2),
        lambda x, w: TF.conv2d(x, w, stride=2, padding=1, groups=2)),
    "conv2d dilation asymmetric padding": _case(
        "conv", [(2, 3, 4), (2, 2, 2, 2)],
        lambda x, w: ops.conv(x, w, padding=(1, 0, 0, 1), dilation=(1, 2)),
        lambda x, w: TF.conv2d(TF.pad(x, (0, 1, 1, 0)), w, dilation=(1, 2))),
    "conv_transpose": _case(
        "conv_transpose", [(1, 2, 2, 2), (2, 1, 2, 2)],
        lambda g, w: ops.conv_transpose(g, w, size=(3, 3), stride=2, padding=1, groups=2),
        lambda g, w: TF.conv_transpose2d(g, w, stride=2, padding=1, output_padding=1,
                                         groups=2)),
    "conv_weight": _case(
        "conv_weight", [(1, 2, 4), (1, 3, 3)],
        lambda x, g: ops.call(ops.get("conv_weight"), (x, g), {"size": (2,)}),
        # the conv's vjp in its weight (linear in w: any point)
        lambda x, g: torch.func.vjp(lambda w: TF.conv1d(x, w),
                                    torch.zeros(3, 2, 2, dtype=x.dtype))[1](g)[0]),
    "max_pool": Case(ops.get("max_pool"), lambda x: ops.max_pool(x, (2, 2), 1, 1),
                     lambda x: ops.max_pool(x, (2, 2), 1, 1),
                     lambda t: TF.max_pool2d(t, 2, 1, 1), (2, 3, 3), {"kernel": (2, 2),
                     "stride": (1,), "padding": (1,)}, batch_axis=0, scalar_engines=False),
    "avg_pool": Case(ops.get("avg_pool"), lambda x: ops.avg_pool(x, (3,), 2, 1, False),
                     lambda x: ops.avg_pool(x, (3,), 2, 1, False),
                     lambda t: TF.avg_pool1d(t, 3, 2, 1, count_include_pad=False), (2, 5),
                     {"kernel": (3,), "stride": (2,), "padding": (1,),
                      "count_include_pad": False}, batch_axis=0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_in_every_engine(name):
    check_everywhere(CASES[name])


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
