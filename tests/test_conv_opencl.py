"""The convolution ops on OpenCL by both routes (``ops/_conv_gemm_cl.py``: im2col, col2im
and the GEMM; ``ops/_conv_cl.py``: a kernel per op), forced by ``EASYAD_OPENCL_CONV``:
values and both gradients against torch 2.13.0 (autograd) and the numpy lowering, float64
and float32; the columns chunked over the batch; the route's choice and its errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import easyad as ad
from easyad import ops
from easyad.ops import _conv_gemm_cl

from conftest import OPENCL

# a kernel that failed its proof runs on the host: an error here, never a silent pass
pytestmark = [pytest.mark.skipif(not OPENCL, reason="no OpenCL device"),
              pytest.mark.filterwarnings("error::easyad.KernelFallbackWarning")]

# name: (input shape, weight shape, keyword arguments); odd sizes, batch 1, unbatched
SHAPES = {
    "2d pad 1": ((3, 4, 7, 5), (6, 4, 3, 3), {"padding": 1}),
    "2d stride 2 pad 2": ((2, 3, 9, 8), (5, 3, 3, 2), {"stride": 2, "padding": 2}),
    "2d dilation 2 groups 2": ((2, 6, 8, 7), (8, 3, 3, 3),
                               {"dilation": 2, "groups": 2, "padding": 1}),
    "2d batch 1 mixed": ((1, 4, 6, 9), (6, 2, 2, 3),
                         {"stride": (2, 1), "padding": (0, 2), "dilation": (1, 2),
                          "groups": 2}),
    "2d unbatched pad 0": ((5, 6, 6), (4, 5, 3, 3), {}),
    "1d stride 2 dilation 2": ((3, 4, 11), (6, 4, 3), {"stride": 2, "dilation": 2,
                                                        "padding": 1}),
}
TOLERANCE = {np.float64: 1e-10, np.float32: 1e-5}
TORCH = {1: TF.conv1d, 2: TF.conv2d}


def _close(ours, want, dtype, what):
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(np.asarray(ours), np.asarray(want), rtol=tol,
                               atol=tol * max(1.0, float(np.abs(want).max())), err_msg=what)


def _ours(x, w, g, kw):
    """conv on the OpenCL device, and its gradients in x and w for the cotangent g."""
    lst = ad.WengertList()
    X = ad.Tensor.variable(x, lst, device=OPENCL[0])
    W = ad.Tensor.variable(w, lst, device=OPENCL[0])
    y = ops.conv(X, W, **kw)
    d = ad.sum(y * ad.Tensor.constant(g, device=OPENCL[0])).derivatives()
    return np.asarray(y.value), np.asarray(d[X]), np.asarray(d[W])


def _torch(x, w, g, kw):
    tx, tw = (torch.tensor(a, requires_grad=True) for a in (x, w))
    y = TORCH[w.ndim - 2](tx, tw, **kw)
    y.backward(torch.tensor(g))
    return y.detach().numpy(), tx.grad.numpy(), tw.grad.numpy()


def _case(name, dtype):
    xs, ws, kw = SHAPES[name]
    rng = np.random.default_rng(len(name))
    x, w = rng.normal(size=xs).astype(dtype), rng.normal(size=ws).astype(dtype)
    g = rng.normal(size=ops.conv(x, w, **kw).shape).astype(dtype)
    return x, w, g, kw


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("route", ["gemm", "direct"])
def test_both_routes_agree_with_torch_and_the_numpy_lowering(route, dtype, monkeypatch):
    monkeypatch.setenv("EASYAD_OPENCL_CONV", route)
    _against_torch(route, dtype, SHAPES)


def test_the_route_through_the_gpus_gemm_kernel(monkeypatch):
    # the GEMM kernel GPUs run (here on the CPU), reading W^T and cols^T in place; two
    # shapes, float64 only: each shape builds its tile configurations (~8 s each)
    monkeypatch.setenv("EASYAD_OPENCL_CONV", "gemm")
    monkeypatch.setenv("EASYAD_OPENCL_GEMM", "new")
    _against_torch("gemm new", np.float64, ["2d dilation 2 groups 2", "2d unbatched pad 0"])


def _against_torch(route, dtype, names):
    for name in names:
        x, w, g, kw = _case(name, dtype)
        ours = _ours(x, w, g, kw)
        for what, a, b in zip(("value", "d x", "d w"), ours, _torch(x, w, g, kw)):
            _close(a, b, dtype, f"{route} {name}: {what} against torch")
        _close(ours[0], ops.conv(x, w, **kw), dtype, f"{route} {name}: numpy lowering")
        d = w.ndim - 2
        lowered = ops.conv_transpose(g, w, size=x.shape[-d:], **kw)
        _close(ours[1], lowered, dtype, f"{route} {name}: numpy conv_transpose")


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_long_indices_give_the_same(dtype, monkeypatch):
    # (operands past 2^31 elements index in long: the same kernels, forced here)
    monkeypatch.setenv("EASYAD_OPENCL_CONV", "gemm")
    x, w, g, kw = _case("2d dilation 2 groups 2", dtype)
    narrow = _ours(x, w, g, kw)
    monkeypatch.setattr(_conv_gemm_cl, "INT_LIMIT", 0)
    for what, a, b in zip(("value", "d x", "d w"), _ours(x, w, g, kw), narrow):
        np.testing.assert_array_equal(a, b, err_msg=f"{what} with long indices")


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_columns_chunked_over_the_batch_give_the_same(dtype, monkeypatch):
    monkeypatch.setenv("EASYAD_OPENCL_CONV", "gemm")
    for name in ("2d pad 1", "2d dilation 2 groups 2", "1d stride 2 dilation 2"):
        x, w, g, kw = _case(name, dtype)
        whole = _ours(x, w, g, kw)
        # one sample's columns fill the budget: a chunk a sample (3 or 2 chunks)
        d = w.ndim - 2
        per_sample = (x.shape[-d - 1] * int(np.prod(w.shape[2:])) *
                      int(np.prod(g.shape[-d:])) * x.dtype.itemsize)
        monkeypatch.setattr(_conv_gemm_cl, "COLS_BUDGET", per_sample + 1)
        assert _conv_gemm_cl._chunks(x.shape[0], per_sample) == [
            (0, 1), (1, 1), (2, 1)][:x.shape[0]]
        chunked = _ours(x, w, g, kw)
        monkeypatch.undo()
        monkeypatch.setenv("EASYAD_OPENCL_CONV", "gemm")
        for what, a, b in zip(("value", "d x", "d w"), chunked, whole):
            _close(a, b, dtype, f"{name}: {what} chunked")
    assert _conv_gemm_cl._chunks(10, 3 << 20) == [(0, 10)]          # all under budget
    assert _conv_gemm_cl._chunks(5, 100 << 20) == [(0, 2), (2, 2), (4, 1)]
    assert _conv_gemm_cl._chunks(3, 1 << 30) == [(0, 1), (1, 1), (2, 1)]   # over: 1 each


def test_the_route_follows_the_shape_unless_forced(monkeypatch):
    used = []
    run = _conv_gemm_cl.run

    def spy(be, which, *args):
        out = run(be, which, *args)
        used.append((which, out is not None))
        return out
    monkeypatch.setattr(_conv_gemm_cl, "run", spy)
    monkeypatch.delenv("EASYAD_OPENCL_CONV", raising=False)
    x, w, g, kw = _case("2d pad 1", np.float64)
    _ours(x, w, g, kw)
    assert used == [("conv", True), ("transpose", True), ("weight", True)]
    depthwise = np.ones((4, 1, 3, 3))            # 1 row, depth 9: the direct kernels
    used.clear()
    ops.conv(ad.Tensor.constant(x, device=OPENCL[0]), depthwise, padding=1, groups=4)
    assert used == [("conv", False)]
    monkeypatch.setenv("EASYAD_OPENCL_CONV", "gemm")
    used.clear()
    y = ops.conv(ad.Tensor.constant(x, device=OPENCL[0]), depthwise, padding=1, groups=4)
    assert used == [("conv", True)]
    _close(y.value, TF.conv2d(torch.tensor(x), torch.tensor(depthwise), padding=1,
                              groups=4).numpy(), np.float64, "depthwise by the GEMM")
    monkeypatch.setenv("EASYAD_OPENCL_CONV", "fast")
    with pytest.raises(ValueError, match="EASYAD_OPENCL_CONV is 'fast': expected 'gemm'"):
        ops.conv(ad.Tensor.constant(x, device=OPENCL[0]), w, padding=1)


def test_a_replayed_program_runs_the_gemm_route_and_matches_torch(monkeypatch):
    used = []
    run = _conv_gemm_cl.run

    def spy(be, which, *args):
        out = run(be, which, *args)
        used.append((which, out is not None))
        return out
    monkeypatch.setattr(_conv_gemm_cl, "run", spy)
    monkeypatch.delenv("EASYAD_OPENCL_CONV", raising=False)
    rng = np.random.default_rng(3)
    x, w = rng.normal(size=(3, 4, 7, 6)), rng.normal(size=(8, 4, 3, 3))
    F = ad.record(lambda p: ad.sum(ops.conv(p["x"], p["w"], padding=1, stride=2) ** 2),
                  {"x": x, "w": w}, device=OPENCL[0])
    used.clear()
    x2, w2 = rng.normal(size=x.shape), rng.normal(size=w.shape)
    value, grad = F.value_and_gradient({"x": x2, "w": w2})
    assert used == [("conv", True), ("transpose", True), ("weight", True)]
    tx, tw = torch.tensor(x2, requires_grad=True), torch.tensor(w2, requires_grad=True)
    want = (TF.conv2d(tx, tw, padding=1, stride=2) ** 2).sum()
    want.backward()
    _close(float(np.asarray(value)), want.item(), np.float64, "replayed value")
    _close(np.asarray(grad["x"]), tx.grad.numpy(), np.float64, "replayed d x")
    _close(np.asarray(grad["w"]), tw.grad.numpy(), np.float64, "replayed d w")
