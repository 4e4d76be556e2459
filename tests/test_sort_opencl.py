"""sort and order_by on OpenCL (issue 26): the kernel of easyad/ops/_sorting.py against
numpy's stable sort exactly, at ties, signed zeros and NaN, along every axis, forward and
inverse, float32 and float64; lines longer than the kernel takes run on the host."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
from easyad import ops
from easyad.ops import _sorting

from conftest import OPENCL

pytestmark = pytest.mark.skipif(not OPENCL, reason="no working OpenCL device")
RNG = np.random.default_rng(11)


def _keys(shape, dtype):
    x = RNG.integers(-4, 5, size=shape).astype(dtype)      # many ties
    flat = x.reshape(-1)
    flat[::7] = -0.0
    flat[::13] = np.nan
    flat[::17] = np.inf
    return x


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_sort_and_order_by_kernels_equal_numpy(axis, dtype):
    be = ad.Tensor.constant(np.zeros(1), device=OPENCL[0])._backend
    key = _keys((4, 9, 6), dtype)
    values = RNG.normal(size=key.shape).astype(dtype)
    order = np.argsort(key, axis=axis, kind="stable")
    got = _sorting._sort_opencl(be, _sorting.SortParams(axis), be.asarray(key, dtype))
    np.testing.assert_array_equal(be.to_numpy(got), np.sort(key, axis=axis, kind="stable"))
    # the signed zeros stay where the stable order puts them (-0.0 equals 0.0)
    np.testing.assert_array_equal(np.signbit(be.to_numpy(got)),
                                  np.signbit(np.take_along_axis(key, order, axis=axis)))
    for inverse in (False, True):
        params = _sorting.OrderParams(axis, inverse)
        got = _sorting._order_opencl(be, params, be.asarray(values, dtype),
                                     be.asarray(key, dtype))
        np.testing.assert_array_equal(be.to_numpy(got),
                                      _sorting._order_numpy(params, values, key))


def test_the_op_runs_its_kernel_and_differentiates(monkeypatch):
    calls = []
    kernel = _sorting._order_opencl
    monkeypatch.setattr(_sorting, "_order_opencl",
                        lambda *a: calls.append(1) or kernel(*a))
    x = RNG.normal(size=(3, 8))
    x[:, 3] = x[:, 5]                                  # a tie in every row
    t = ad.Tensor.variable(x, ad.WengertList(), device=OPENCL[0])
    w = RNG.normal(size=(3, 8))
    y = ad.sum(ad.sort(t, axis=1) * w)
    g = y.derivatives()[t]
    order = np.argsort(x, axis=1, kind="stable")
    expected = np.empty_like(w)
    np.put_along_axis(expected, order, w, axis=1)      # each element gets its place's w
    np.testing.assert_array_equal(g, expected)
    assert abs(y.number - float(np.sum(np.sort(x, axis=1) * w))) < 1e-12
    assert calls                                       # the device kernel ran (forward, vjp)
    assert ops.get("sort").opencl is _sorting._sort_opencl


def test_long_lines_run_on_the_host():
    be = ad.Tensor.constant(np.zeros(1), device=OPENCL[0])._backend
    x = RNG.normal(size=_sorting._LONGEST + 5)
    got = _sorting._sort_opencl(be, _sorting.SortParams(0), be.asarray(x, np.float64))
    np.testing.assert_array_equal(be.to_numpy(got), np.sort(x))
