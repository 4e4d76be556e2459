"""The numpy device's faster nn kernels (issue 28 item 4) against independent references:
max-pool's scatter and gather (torch's max_pool's vjp and its chosen indices, a float64
loop of additions), the one-exponential sigmoid (float64 and torch), the causal mask
cache."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
from easyad import ops

torch = pytest.importorskip("torch")
TF = torch.nn.functional

# (input shape, kernel, stride, padding, dilation): tiles, overlapping windows, padding,
# dilation, 1-d and 3-d
GEOMETRIES = [((3, 4, 8, 6), (2, 2), (2, 2), (0, 0), (1, 1)),
              ((2, 3, 7, 9), (3, 3), (1, 2), (1, 1), (1, 1)),
              ((2, 3, 9, 8), (2, 3), (3, 2), (1, 0), (2, 1)),
              ((2, 5, 11), (3,), (1,), (1,), (2,)),
              ((1, 2, 5, 6, 4), (2, 3, 2), (1, 2, 2), (1, 1, 0), (1, 1, 1))]

_TORCH_POOL = {1: TF.max_pool1d, 2: TF.max_pool2d, 3: TF.max_pool3d}


def _sample(rng, shape, dtype):
    x = rng.normal(size=shape).astype(dtype)
    x[..., :3] = np.round(x[..., :3])      # ties: the first maximum takes the derivative
    return x


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(map(str, g[0])))
def test_max_pool_scatter_and_gather_match_torch(geometry, dtype):
    shape, kernel, stride, padding, dilation = geometry
    rng = np.random.default_rng(len(shape) * 7 + kernel[0])
    x = _sample(rng, shape, dtype)
    params = {"kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation}
    pool = _TORCH_POOL[len(kernel)]
    tx = torch.tensor(x.astype(np.float64))
    y, chosen = pool(tx, kernel, stride, padding, dilation, return_indices=True)
    g = rng.normal(size=y.shape).astype(dtype)
    # the scatter is max_pool's vjp: torch's in float64, our float32 within its rounding
    want = torch.func.vjp(lambda z: pool(z, kernel, stride, padding, dilation), tx)[1](
        torch.tensor(g.astype(np.float64)))[0].numpy()
    got = ops.call(ops.get("max_pool_scatter"), (g, x), params)
    assert got.dtype == np.dtype(dtype) and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "float32" else 1e-14,
                               atol=1e-6 if dtype == "float32" else 1e-15)
    if dtype == "float32":   # an element's shares summed in float64, rounded once
        wide = ops.call(ops.get("max_pool_scatter"), (g.astype(np.float64), x), params)
        np.testing.assert_array_equal(got, wide.astype(np.float32))
    # the gather picks h at torch's chosen indices
    h = rng.normal(size=shape).astype(dtype)
    picked = np.take_along_axis(h.reshape(shape[:2] + (-1,)),
                                chosen.numpy().reshape(shape[:2] + (-1,)), axis=2)
    gathered = ops.call(ops.get("max_pool_gather"), (h, x), params)
    np.testing.assert_array_equal(gathered, picked.reshape(y.shape))


def test_max_pool_scatter_sums_overlapping_windows_in_float64_order():
    # every window of a 3-wide, stride-1 pool over a constant row chooses its first
    # element; an element chosen by several windows gets the sum of their shares, added
    # in the order a loop over the window's offsets would add them
    x = np.zeros((1, 1, 6))
    x[0, 0, 2] = 1.0                 # windows 0, 1, 2 choose element 2
    g = np.array([[[0.1, 0.2, 0.7, 0.3]]])
    got = ops.call(ops.get("max_pool_scatter"), (g, x),
                   {"kernel": (3,), "stride": (1,)})
    expect = np.zeros((1, 1, 6))
    expect[0, 0, 2] = (0.0 + 0.7) + 0.2 + 0.1     # offsets 0, 1, 2: windows 2, 1, 0
    expect[0, 0, 3] = 0.3                         # window 3: all zero, the first (3)
    np.testing.assert_array_equal(got, expect)


def test_max_pool_scatter_nan_and_all_minus_inf_windows():
    x = np.array([[[1.0, np.nan, 2.0, np.nan, -np.inf, -np.inf]]])
    g = np.array([[[1.0, 2.0, 3.0]]])
    got = ops.call(ops.get("max_pool_scatter"), (g, x), {"kernel": (2,)})
    # torch: a NaN is the maximum (the last NaN of a window); -inf ties: the first
    np.testing.assert_array_equal(got, [[[0.0, 1.0, 0.0, 2.0, 3.0, 0.0]]])


def test_max_pool_gradient_through_the_tape_matches_finite_differences():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 3, 6, 6))
    w = rng.normal(size=(2, 3, 6, 6))

    def f(v):
        return ad.sum(ops.max_pool(v, (3, 3), 1, 1) * w) if isinstance(v, ad.Tensor) \
            else float(np.sum(ops.max_pool(v, (3, 3), 1, 1) * w))

    lst = ad.WengertList()
    xv = ad.Tensor.variable(x, lst)
    grad = f(xv).derivatives()[xv]
    d = rng.normal(size=x.shape)
    step = 1e-6          # the windows' choices are stable: the values are far apart
    fd = (f(x + step * d) - f(x - step * d)) / (2 * step)
    assert np.isclose(np.sum(np.asarray(grad) * d), fd, rtol=1e-7, atol=1e-9)
