"""Forward mode meets numpy's way of building vectors: ``np.array([f1, f2])`` of traced
numbers joins a TraceTensor (in concatenate, stack and arithmetic) as one TraceTensor,
and np.ravel/np.hstack/np.vstack answer on tensors. References: the same function written
with tensor operations only, and central finite differences."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad


def _by_elements(z):
    y = z[:2]
    rhs = np.array([2.0 * y[0] - y[0] * y[1], y[0] * y[1] - 0.5 * y[1]])   # objects
    return np.concatenate([rhs, z[2:] * rhs[0]]) + 0.5 * np.array([y[1], y[0], y[0] ** 2])


def _by_tensors(z):
    y = z[:2]
    rhs = y * (np.array([2.0, -0.5]) + np.array([-1.0, 1.0]) * y[::-1])
    return np.concatenate([rhs, z[2:] * rhs[0]]) + 0.5 * np.stack([y[1], y[0], y[0] ** 2])


def _fd(f, x, h=1e-6):
    return np.array([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(x.size)]).T


def test_object_array_of_traces_joins_a_trace_tensor():
    x = np.array([0.7, -1.3, 2.1])
    J = ad.jacobian(_by_elements, mode="forward")(x)
    ref = ad.jacobian(_by_tensors, mode="forward")(x)
    np.testing.assert_allclose(J, ref, rtol=0, atol=1e-14)
    np.testing.assert_allclose(J, _fd(lambda z: np.asarray(_by_elements(z), float), x),
                               atol=1e-8)


def test_second_order_through_object_arrays():
    # forward over forward: the elements are Traces of Traces
    x = np.array([0.4, 0.9, -0.2])
    H = ad.jacobian(ad.jacobian(lambda z: _by_elements(z)[1], mode="forward"),
                    mode="forward")(x)
    ref = ad.jacobian(ad.jacobian(lambda z: _by_tensors(z)[1], mode="forward"),
                      mode="forward")(x)
    np.testing.assert_allclose(H, ref, atol=1e-13)


def test_ravel_hstack_vstack_on_trace_tensors():
    x = np.array([[0.3, -0.8], [1.1, 0.5]])

    def f(z):
        return np.hstack([np.ravel(z), z[0]]) * np.vstack([z, z[1]]).sum()
    J = ad.jacobian(f, mode="forward")(x)
    np.testing.assert_allclose(
        J.reshape(6, 4), _fd(lambda v: f(v.reshape(2, 2)), x.ravel()), atol=1e-8)
    with pytest.raises(TypeError, match="order"):
        ad.jacobian(lambda z: np.ravel(z, order="F"), mode="forward")(x)
