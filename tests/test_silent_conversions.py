"""A recorded Tensor leaving easyad while a transform runs f: refused, never a silent zero.

SciPy functions that are not ufuncs (``scipy.special.polygamma``) call ``np.asarray`` on
their input. On a recorded Tensor that gave the values as a plain array, so the derivative
through them was dropped with no error (``ad.grad`` returned zeros) and a replay of
``ad.record`` reused the recorded values. Both now raise a TypeError naming the fix;
``t.value`` is the explicit way to take values as a constant.
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.special as sp

import easyad as ad

X = np.array([1.5, 2.5])


@pytest.mark.parametrize("convert", [
    lambda x: sp.polygamma(1, x),                  # a SciPy function that is not a ufunc
    lambda x: np.asarray(x) * 2.0,
], ids=["scipy polygamma", "np.asarray"])
def test_a_conversion_inside_a_transform_raises(convert):
    def f(x):
        return ad.sum(convert(x))
    with pytest.raises(TypeError, match="recorded Tensor would drop its derivative"):
        ad.grad(f)(X)
    with pytest.raises(TypeError, match="recorded Tensor would drop its derivative"):
        ad.record(f, X, tensor=True)


def test_float_is_a_branch_inside_a_transform():
    def f(x):
        first = x[:1].reshape(())             # a 0-d recorded Tensor
        return ad.sum(x * x) if float(first) > 0 else ad.sum(-x)
    np.testing.assert_array_equal(ad.grad(f)(X), 2 * X)
    np.testing.assert_array_equal(ad.grad(f)(-X), -np.ones(2))


def test_value_is_the_explicit_constant():
    # d/dx sum(x * c) with c = x's values taken as a constant: c, not 2x
    got = ad.grad(lambda x: ad.sum(x * x.value))(X)
    np.testing.assert_array_equal(got, X)
    # ad.polygamma is the row that differentiates: d/dx polygamma(1, x) = polygamma(2, x)
    got = ad.grad(lambda x: ad.sum(ad.polygamma(1, x)))(X)
    np.testing.assert_allclose(got, sp.polygamma(2, X), rtol=1e-12)


def test_a_tape_made_by_hand_converts_explicitly():
    lst = ad.WengertList()
    x = ad.Tensor.variable(X, lst)
    y = x * 3.0
    np.testing.assert_array_equal(np.asarray(y), X * 3.0)   # outside every transform
    assert float(y[:1].reshape(())) == 4.5
