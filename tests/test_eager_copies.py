"""Copies an eager step does not make (issue 28 item 4).

A tensor made from a tensor (``Tensor.variable(t, lst)``, ``Tensor.constant(t)``) on the
same backend and dtype shares its buffer (tensors are values: the tensor layer never writes
into a buffer), so an eager step that makes its input a variable of a tensor made once
copies nothing. Another dtype or a bool tensor still converts (a new buffer).

nn's convolutions add their bias into the convolution's fresh output
(``tensor._fused.add_channel_bias``): the same bits as the broadcasting add, in value,
gradients and create_graph's second derivatives; anything else holding the output keeps
the plain add."""
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


F = ad.nn.functional


def _conv_parts(seed=1, dtype=np.float32):
    rng = np.random.default_rng(seed)
    shapes = ((2, 3, 7, 7), (4, 3, 3, 3), (4,), (2, 4, 7, 7))     # x, w, b, g
    return tuple(rng.normal(size=s).astype(dtype) for s in shapes)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_bias_in_place_is_the_plain_add_bitwise(dtype, monkeypatch):
    from easyad.tensor import _fused
    taken = []
    record = _fused.record
    monkeypatch.setattr(_fused, "record", lambda *a, **k: taken.append(a[1]) or record(*a, **k))
    xa, wa, ba, g = _conv_parts(dtype=dtype)

    def step(fused):
        lst = ad.WengertList()
        x, w, b = (ad.Tensor.variable(v, lst) for v in (xa, wa, ba))
        y = F.conv2d(x, w, b, padding=1) if fused else \
            F.conv2d(x, w, padding=1) + b.reshape((-1, 1, 1))
        z = ad.sum(y * g)
        d = z.derivatives()
        return y.value, float(z.number), [d[v] for v in (x, w, b)]

    y1, v1, d1 = step(True)
    assert taken == ["add"]                    # the bias went into the conv's output
    y2, v2, d2 = step(False)
    np.testing.assert_array_equal(y1, y2)
    assert v1 == v2
    for a, b in zip(d1, d2):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(d1[2], g.sum(axis=(0, 2, 3)), rtol=1e-5)   # db = sum of g


def test_conv_bias_in_place_second_derivatives(monkeypatch):
    # create_graph through the fused add (its step's graph): the Hessian of
    # sum(tanh(conv(x, w, b))) in b row by row, against the plain add's and a hand formula:
    # d2/db_c db_c' = -2 [c = c'] sum over channel c of t (1 - t^2)
    from easyad.tensor import _fused
    taken = []
    record = _fused.record
    monkeypatch.setattr(_fused, "record", lambda *a, **k: taken.append(a[1]) or record(*a, **k))
    xa, wa, ba, _ = _conv_parts(dtype=np.float64)

    def hessian(fused):
        rows = []
        for k in range(4):
            lst = ad.WengertList()
            x, w, b = (ad.Tensor.variable(v, lst) for v in (xa, wa, ba))
            y = F.conv2d(x, w, b, padding=1) if fused else \
                F.conv2d(x, w, padding=1) + b.reshape((-1, 1, 1))
            db = ad.sum(ad.tanh(y)).derivatives(create_graph=True)[b]
            rows.append(db[k].derivatives()[b])
        return np.array(rows)

    h1 = hessian(True)
    assert taken == ["add"] * 4
    np.testing.assert_array_equal(h1, hessian(False))
    t = np.tanh(F.conv2d(xa, wa, padding=1) + ba.reshape((-1, 1, 1)))
    np.testing.assert_allclose(h1, np.diag((-2 * t * (1 - t * t)).sum(axis=(0, 2, 3))),
                               rtol=1e-12, atol=1e-12)


def test_bias_not_added_in_place_into_a_tensor_held_elsewhere():
    from easyad.tensor._fused import add_channel_bias
    lst = ad.WengertList()
    x = ad.Tensor.variable(np.arange(8.0).reshape(1, 2, 2, 2), lst)
    y = x * 2.0                                   # a fresh result ...
    kept = y                                      # ... that something else holds too
    out = add_channel_bias(y, ad.Tensor.variable(np.array([1.0, -1.0]), lst), 2, fresh=1)
    np.testing.assert_array_equal(kept.value, np.arange(8.0).reshape(1, 2, 2, 2) * 2.0)
    np.testing.assert_array_equal(out.value, kept.value + np.array([1.0, -1.0])[:, None, None])
