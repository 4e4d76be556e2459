"""``ad.stop_gradient(x)`` (``ad.detach``, ``x.detach()``): x's value as a constant, no
derivative flowing through it, in every mode, at every order, and in recorded programs
replayed at new points (``ad.record`` scalar and tensor, ``compile()``), against torch's
``.detach()`` on the same functions.
"""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad

torch = pytest.importorskip("torch")
tf = pytest.importorskip("torch.func")

TOL = 1e-12


def ours(x):
    """Scalar code on the elements, the stopped parts feeding back into live ones."""
    s = ad.stop_gradient(x[0] * x[1])
    return ad.sin(x[0]) * s + ad.exp(ad.detach(x[1]) * 0.5) * x[1] ** 2 + x[0].detach() * x[1]


def theirs(x):
    s = (x[0] * x[1]).detach()
    return torch.sin(x[0]) * s + torch.exp(x[1].detach() * 0.5) * x[1] ** 2 \
        + x[0].detach() * x[1]


def ours_tensor(x):
    return ad.sum(ad.tanh(x) * ad.stop_gradient(x * x)) + ad.sum(ad.detach(x) * x) ** 2


def theirs_tensor(x):
    return torch.sum(torch.tanh(x) * (x * x).detach()) + torch.sum(x.detach() * x) ** 2


def torch_grad(f, x):
    return tf.grad(f)(torch.tensor(x, dtype=torch.float64)).numpy()


def torch_hessian(f, x):
    return tf.hessian(f)(torch.tensor(x, dtype=torch.float64)).numpy()


X0, X1 = np.array([0.7, -1.2]), np.array([1.9, 0.4])


def test_numbers_and_methods():
    assert ad.stop_gradient(2.5) == 2.5 and type(ad.stop_gradient(2.5)) is float
    assert ad.detach is ad.stop_gradient
    lst = ad.WengertList()
    r = lst.variable(3.0)
    for stopped in (ad.stop_gradient(r), r.detach(), r.stop_gradient()):
        assert stopped.number == 3.0
        assert (r * stopped).derivatives()[r] == 3.0         # d/dr r * c = c
    t = ad.Trace(3.0, 1.0)
    assert ad.stop_gradient(t).derivative == 0.0 and t.detach().number == 3.0
    assert ad.derivative(lambda x: x * x.detach())(3.0) == 3.0


def test_scalar_code_matches_torch_in_every_mode():
    want = torch_grad(theirs, X0)
    np.testing.assert_allclose(ad.grad(ours)(X0), want, rtol=TOL)
    np.testing.assert_allclose(ad.jacobian(ours, mode="forward")(X0), want, rtol=TOL)
    np.testing.assert_allclose(ad.hessian(ours)(X0), torch_hessian(theirs, X0), rtol=TOL,
                               atol=TOL)
    # second order by nested Traces (NestedTrace) and by create_graph
    H = torch_hessian(theirs, X0)
    np.testing.assert_allclose(ad.jacobian(ad.grad(ours))(X0), H, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(
        ad.jacobian(ad.jacobian(ours, mode="forward"), mode="forward")(X0), H,
        rtol=TOL, atol=TOL)


def test_nested_levels_all_stop():
    # d/dx of d/dy [stop(x y) y] at y = 3: the inner value x*y is stopped for the outer
    # level too (JAX and torch: 0), in every order of modes
    def inner_forward(x):
        return ad.derivative(lambda y: ad.stop_gradient(x * y) * y)(3.0)

    def inner_reverse(x):
        return ad.grad(lambda y: ad.stop_gradient(x * y) * y)(3.0)
    for outer in (ad.derivative, ad.grad):
        for inner in (inner_forward, inner_reverse):
            assert outer(inner)(2.0) == 0.0, (outer.__name__, inner.__name__)
    assert inner_forward(2.0) == 6.0       # the stopped value itself is still x * y


def test_tensors_and_trace_tensors_match_torch():
    x = np.array([0.3, -0.8, 1.1])
    np.testing.assert_allclose(ad.grad(ours_tensor)(x), torch_grad(theirs_tensor, x),
                               rtol=TOL)
    np.testing.assert_allclose(ad.jacobian(ours_tensor, mode="forward")(x),
                               torch_grad(theirs_tensor, x), rtol=TOL)
    np.testing.assert_allclose(ad.hessian(ours_tensor)(x), torch_hessian(theirs_tensor, x),
                               rtol=TOL, atol=TOL)
    # Tensor.detach() and TraceTensor.detach(): torch's spelling on tensors
    np.testing.assert_array_equal(ad.grad(lambda t: ad.sum(t * t.detach()))(x), x)
    np.testing.assert_array_equal(ad.jvp(lambda t: t * t.detach(), x, np.ones(3))[1], x)
    tt = ad.TraceTensor(x, np.ones(3))
    stopped = ad.stop_gradient(tt)
    np.testing.assert_array_equal(stopped.value, x)
    np.testing.assert_array_equal(stopped.tangent, np.zeros(3))


def test_object_arrays():
    lst = ad.WengertList()
    xs = np.array([lst.variable(v) for v in (2.0, 5.0)], dtype=object)
    stopped = ad.stop_gradient(xs)
    assert [s.number for s in stopped] == [2.0, 5.0]
    d = (xs[0] * stopped[1] + stopped[0] * xs[1]).derivatives()
    assert (d[xs[0]], d[xs[1]]) == (5.0, 2.0)


def test_recorded_programs_replay_the_new_point():
    """The stopped value is the replayed point's, not the recorded one's."""
    F = ad.record(ours, X0)
    x1 = torch.tensor(X1, dtype=torch.float64)
    assert F(X1) == pytest.approx(float(theirs(x1)), rel=TOL)
    np.testing.assert_allclose(F.gradient(X1), torch_grad(theirs, X1), rtol=TOL)
    np.testing.assert_allclose(F.hessian(X1), torch_hessian(theirs, X1), rtol=TOL, atol=TOL)
    C = F.compile()
    np.testing.assert_allclose(C.gradient(X1), torch_grad(theirs, X1), rtol=TOL)
    assert C(X1) == pytest.approx(float(theirs(x1)), rel=TOL)


def test_tensor_programs_replay_the_new_point():
    x0, x1 = np.array([0.3, -0.8, 1.1]), np.array([-0.5, 0.2, 0.9])
    G = ad.record(ours_tensor, x0, tensor=True)
    want = float(theirs_tensor(torch.tensor(x1, dtype=torch.float64)))
    assert float(G(x1)) == pytest.approx(want, rel=TOL)
    np.testing.assert_allclose(G.gradient(x1), torch_grad(theirs_tensor, x1), rtol=TOL)


def test_every_tensor_device_and_taylor_mode(device):
    x0, x1 = np.array([0.3, -0.8, 1.1]), np.array([-0.5, 0.2, 0.9])
    previous = ad.get_device()
    ad.set_device(device)
    try:
        np.testing.assert_allclose(ad.grad(ours_tensor)(x0), torch_grad(theirs_tensor, x0),
                                   rtol=TOL)
        G = ad.record(ours_tensor, x0, tensor=True)       # fused on OpenCL
        np.testing.assert_allclose(G.gradient(x1), torch_grad(theirs_tensor, x1), rtol=TOL)
    finally:
        ad.set_device(previous)
    # Taylor mode: t * stop(t) at 2 is 4 + 2 h (the stopped factor has no series)
    np.testing.assert_array_equal(ad.taylor(lambda t: t * ad.stop_gradient(t), 2.0, 3),
                                  [4.0, 2.0, 0.0, 0.0])
