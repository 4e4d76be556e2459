"""``d.tensor(t)``: a tensor's derivative as a constant tensor on its own device, without
the copy to the host that ``d[t]`` makes (a GPU's gradients stay there, as torch's
``.grad``): the same numbers as ``d[t]``, zeros where nothing flowed, the same errors."""
import numpy as np
import pytest

import easyad as ad
from easyad import nn

RNG = np.random.default_rng(3)


def _loss(x, w):
    return ad.sum(ad.tanh(x @ w) * x[:, :1])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_equals_the_host_derivative_and_stays_on_the_device(device, dtype):
    lst = ad.WengertList()
    x = ad.Tensor.variable(RNG.normal(size=(5, 3)), lst, device=device, dtype=dtype)
    w = ad.Tensor.variable(RNG.normal(size=(3, 4)), lst, device=device, dtype=dtype)
    unused = ad.Tensor.variable(RNG.normal(size=2), lst, device=device, dtype=dtype)
    d = _loss(x, w).derivatives()
    for t in (x, w, unused):
        got = d.tensor(t)
        assert isinstance(got, ad.Tensor) and got.device == t.device
        assert got.shape == t.shape and got.dtype == t.dtype
        np.testing.assert_array_equal(got.value, d[t])
    np.testing.assert_array_equal(d.tensor(unused).value, np.zeros(2))
    # by hand: d/dw sum(tanh(x w) * x[:, :1]) = x^T ((1 - tanh^2) * x[:, :1])
    xv, wv = x.value.astype(np.float64), w.value.astype(np.float64)
    expected = xv.T @ ((1 - np.tanh(xv @ wv) ** 2) * xv[:, :1])
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(d.tensor(w).value, expected, rtol=tol, atol=tol)


def test_the_result_is_a_constant_usable_in_further_work(device):
    lst = ad.WengertList()
    w = ad.Tensor.variable(RNG.normal(size=(3, 3)), lst, device=device)
    g = ad.sum(w * w).derivatives().tensor(w)     # 2 w
    np.testing.assert_allclose((w.value - 0.5 * g).value, 0.0, atol=1e-15)
    assert isinstance(ad.sum(g), float)       # a constant: its sum is a plain number


def test_parameters_and_errors(device):
    layer = nn.Linear(3, 2).to(device)
    lst = ad.WengertList()
    x = ad.Tensor.constant(RNG.normal(size=(4, 3)), device=device)
    d = ad.sum(layer(x, tape=lst)).derivatives()
    np.testing.assert_array_equal(d.tensor(layer.weight).value, d[layer.weight])
    np.testing.assert_allclose(d.tensor(layer.bias).value, np.full(2, 4.0))
    with pytest.raises(TypeError, match=r"d.tensor\(x\) takes a Tensor"):
        d.tensor(3.0)
    lst2 = ad.WengertList()
    a = ad.Tensor.variable(np.ones(3), lst2, device=device)
    hidden = a * 2.0
    d2 = ad.sum(hidden * hidden).derivatives()
    with pytest.raises(ValueError, match="not kept"):
        d2.tensor(hidden)
