"""A tensor made from a tensor (``Tensor.variable(t, lst)``, ``Tensor.constant(t)``) on the
same backend and dtype shares its buffer (tensors are values: the tensor layer never writes
into a buffer), so an eager step that makes its input a variable of a tensor made once
copies nothing. Another dtype or a bool tensor still converts (a new buffer)."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_variable_of_a_constant_shares_and_differentiates(dtype):
    rng = np.random.default_rng(3)
    a = rng.normal(size=(4, 5)).astype(dtype)
    w = rng.normal(size=(4, 5)).astype(dtype)
    c = ad.Tensor.constant(a)
    lst = ad.WengertList()
    x = ad.Tensor.variable(c, lst)
    assert x._data is c._data                  # shared: no copy
    assert x.dtype == dtype and x.shape == (4, 5)
    # sum(sin(x) * w): d/dx = cos(x) w, by hand
    z = ad.sum(ad.sin(x) * w)
    d = z.derivatives()[x]
    tol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(d, np.cos(a.astype(np.float64)) * w, rtol=tol, atol=tol)
    np.testing.assert_array_equal(c.value, a)     # the shared buffer left as it was


def test_variable_of_a_variable_is_an_independent_input():
    a = np.array([1.0, 2.0, 3.0])
    lst1, lst2 = ad.WengertList(), ad.WengertList()
    x1 = ad.Tensor.variable(a, lst1)
    x2 = ad.Tensor.variable(x1, lst2)       # values only: a new input on its own list
    assert x2._data is x1._data
    z1, z2 = ad.sum(x1 * x1), ad.sum(x2 * x2 * x2)
    np.testing.assert_array_equal(z1.derivatives()[x1], 2 * a)
    np.testing.assert_array_equal(z2.derivatives()[x2], 3 * a * a)


def test_another_dtype_or_bool_converts():
    c = ad.Tensor.constant(np.array([1.5, -2.25], dtype=np.float32))
    x = ad.Tensor.variable(c, ad.WengertList(), dtype=np.float64)
    assert x.dtype == np.float64 and x._data is not c._data
    np.testing.assert_array_equal(x.value, [1.5, -2.25])
    b = ad.Tensor.constant(np.array([1.0, 2.0])) > 1.5       # a bool tensor
    y = ad.Tensor.variable(b, ad.WengertList())
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y.value, [0.0, 1.0])


def test_shared_variable_matches_a_copied_one_bitwise():
    # the eager conv step both ways: the same value and gradients, bit for bit
    rng = np.random.default_rng(0)
    conv = ad.nn.Conv2d(3, 4, 3, padding=1, dtype=np.float32)
    xa = rng.normal(size=(2, 3, 6, 6)).astype(np.float32)
    g = rng.normal(size=(2, 4, 6, 6)).astype(np.float32)

    def step(x0, g0):
        lst = ad.WengertList()
        x = ad.Tensor.variable(x0, lst)
        z = ad.sum(conv(x) * g0)
        return float(z.number), z.derivatives()[x]

    v1, d1 = step(xa, g)
    v2, d2 = step(ad.Tensor.constant(xa), ad.Tensor.constant(g))
    assert v1 == v2
    np.testing.assert_array_equal(d1, d2)
