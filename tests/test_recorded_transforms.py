"""Derivative transforms recorded into tensor programs: ``ad.record(ad.grad(f), x,
tensor=True)`` (and jacobian, hessian, jvp, vjp, hvp, value_and_grad, vmap of jacobian)
replayed at new points against torch.func (float64, 1e-10) and the eager transform; guards
inside f; nested transforms; OpenCL; what stays refused. Before issue 27's recorded
transforms the replay gave zeros (the first test), then a NotImplementedError."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad

torch = pytest.importorskip("torch")
func = torch.func
TOL = 1e-10
rng = np.random.default_rng(2027)

A = rng.normal(size=(4, 4)) / 2.0
C = rng.normal(size=4)
X0 = rng.normal(size=4)
POINTS = [rng.normal(size=4) for _ in range(2)]


def T(a):
    return torch.tensor(np.asarray(a), dtype=torch.float64)


def close(ours, theirs):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    ours = np.asarray(ours)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    np.testing.assert_allclose(ours, theirs, rtol=TOL, atol=TOL)


# one function per backend, the same formula: a scalar loss and a vector map
def loss(x):
    return ad.sum(ad.sin(x) * x * x) + ad.logsumexp(A @ x)


def tloss(x):
    return (torch.sin(x) * x * x).sum() + torch.logsumexp(T(A) @ x, 0)


def vec(x):
    return ad.tanh(A @ x + C) * x[0]


def tvec(x):
    return torch.tanh(T(A) @ x + T(C)) * x[0]


def test_the_gradient_replays_at_new_points_not_zeros():
    # the case that replayed zeros (then raised): the transform at the recorded point
    F = ad.record(lambda w: ad.grad(lambda v: ad.sum(v * v * v))(w), X0, tensor=True)
    for y in POINTS:
        np.testing.assert_allclose(F(y), 3.0 * y * y, rtol=TOL, atol=TOL)
        assert np.abs(F(y)).min() > 0.0


CASES = {
    "grad": (lambda x: ad.grad(loss)(x), lambda x: func.grad(tloss)(x)),
    "value_and_grad": (lambda x: ad.value_and_grad(loss)(x),
                       lambda x: func.grad_and_value(tloss)(x)[::-1]),
    "jacobian_reverse": (ad.jacobian(vec, mode="reverse"), func.jacrev(tvec)),
    "jacobian_forward": (ad.jacobian(vec, mode="forward"), func.jacfwd(tvec)),
    "hessian": (ad.hessian(loss), func.hessian(tloss)),
    "jvp": (lambda x: ad.jvp(vec, x, ad.cos(x)), lambda x: func.jvp(tvec, (x,),
                                                                     (torch.cos(x),))),
    "vjp": (lambda x: ad.vjp(vec, x, x * x)[1],
            lambda x: func.vjp(tvec, x)[1](x * x)[0]),
    "hvp": (lambda x: ad.hvp(loss, x, x[::-1]),
            lambda x: func.jvp(func.grad(tloss), (x,), (x.flip(0),))[1]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_recorded_transform_replays_as_torch_func_and_eager(name):
    ours, theirs = CASES[name]
    F = ad.record(ours, X0, tensor=True)
    for y in POINTS:
        got, want, eager = F(y), theirs(T(y)), ours(y)
        if isinstance(want, tuple):
            for g, w, e in zip(got, want, eager):
                close(g, w)
                np.testing.assert_allclose(g, e, rtol=TOL, atol=TOL)
        else:
            close(got, want)
            np.testing.assert_allclose(got, eager, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("mode", ["reverse", "forward", "auto"])
def test_vmap_of_jacobian_is_one_recorded_program(mode):
    g = ad.vmap(ad.jacobian(vec, mode=mode))
    X = rng.normal(size=(5, 4))
    F = ad.record(g, X, tensor=True)
    for _ in range(2):
        Y = rng.normal(size=(5, 4))
        close(F(Y), func.vmap(func.jacrev(tvec))(T(Y)))
        np.testing.assert_allclose(F(Y), g(Y), rtol=TOL, atol=TOL)
    # one program for the batch: no per-example or per-row replay left in Python
    (rec,) = F._recordings.values()
    assert not any(i.op == "guard" for i in rec.program.instructions)


@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_a_recorded_vmap_jacobian_computes_f_once(mode):
    # the basis is a batched seed of one recorded sweep (a batched tangent of one forward
    # pass): f's tanh runs on B x m elements, not once per basis element (B x m x m)
    X = rng.normal(size=(6, 4))
    F = ad.record(ad.vmap(ad.jacobian(vec, mode=mode)), X, tensor=True)
    (rec,) = F._recordings.values()
    sizes = [int(np.prod(i.params.shape)) for i in rec.program.instructions
             if i.op == "map" and any("tanh(" in e for e in i.params.exprs)]
    assert sizes and max(sizes) == 6 * 4


def test_vmap_of_grad_and_hessian_recorded(monkeypatch):
    from easyad.transforms import vmap_lift
    monkeypatch.setattr(vmap_lift, "_batched_pass", lambda run: run())   # (no fallback)
    X = rng.normal(size=(3, 4))
    for ours, theirs in ((ad.vmap(ad.grad(loss)), func.vmap(func.grad(tloss))),
                         (ad.vmap(ad.hessian(loss)), func.vmap(func.hessian(tloss)))):
        F = ad.record(ours, X, tensor=True)
        Y = rng.normal(size=(3, 4))
        close(F(Y), theirs(T(Y)))
        # the Hessian too computes f once per example (the gradient recorded once, its
        # rows by one sweep with a batched seed), not once per basis element
        (rec,) = F._recordings.values()
        assert max(int(np.prod(i.params.shape)) for i in rec.program.instructions
                   if i.op == "map" and any("sin(" in e for e in i.params.exprs)) == 3 * 4


def test_guards_inside_f_are_checked_at_replay():
    def f(x):
        return ad.sin(x) * x if bool(ad.sum(x) > 0) else ad.cos(x) * x

    def tf(x):
        return torch.sin(x) * x if bool(x.sum() > 0) else torch.cos(x) * x

    x = np.abs(X0) + 0.1
    F = ad.record(ad.jacobian(f), x, tensor=True)
    y = np.abs(POINTS[0]) + 0.2                  # the same branch: replayed
    close(F(y), func.jacrev(tf)(T(y)))
    with pytest.raises(ad.BranchChangedError):   # the other branch: never silently wrong
        F(-y)
    G = ad.record(ad.jacobian(f), x, tensor=True, on_branch_change="retape")
    close(G(-y), func.jacrev(tf)(T(-y)))


def test_nested_transforms_recorded():
    # grad of grad (a Hessian-vector product made by hand: w, closed over, is a constant
    # of the inner transforms), and the gradient of a recorded gradient's norm by
    # F.gradient (the recording's own sweep over it)
    x = X0
    F = ad.record(lambda w: ad.grad(lambda v: ad.sum(ad.grad(loss)(v) * w))(w), x,
                  tensor=True)
    for y in POINTS:
        close(F(y), func.hessian(tloss)(T(y)) @ T(y))
    G = ad.record(lambda w: ad.sum(ad.grad(loss)(w) ** 2), x, tensor=True)
    for y in POINTS:
        H, g = func.hessian(tloss)(T(y)), func.grad(tloss)(T(y))
        close(G.gradient(y), 2.0 * H @ g)


def test_a_transform_of_a_recorded_argument_after_x():
    # the point is an argument of the recording (a tensor on no list), not x; and f
    # closes over x inside the transform (its gradient by F.gradient goes through it)
    F = ad.record(lambda x, w: x * ad.grad(loss)(w), X0, POINTS[0], tensor=True)
    y, w = POINTS[1], X0[::-1].copy()
    close(F(y, w), T(y) * func.grad(tloss)(T(w)))
    G = ad.record(lambda x, w: ad.sum(ad.grad(lambda v: ad.sum(ad.sin(v * x)))(w)), X0,
                  POINTS[0], tensor=True)

    def tg(x, w):
        return func.grad(lambda v: torch.sin(v * x).sum())(w).sum()
    close(G(y, w), tg(T(y), T(w)))
    close(G.gradient(y, w), func.grad(tg)(T(y), T(w)))


def test_recorded_transforms_on_opencl(opencl_device):
    F = ad.record(ad.vmap(ad.jacobian(vec, mode="reverse")), rng.normal(size=(3, 4)),
                  tensor=True, device=opencl_device)
    Y = rng.normal(size=(3, 4))
    close(F(Y), func.vmap(func.jacrev(tvec))(T(Y)))
    G = ad.record(ad.grad(loss), X0, tensor=True, device=opencl_device)
    close(G(POINTS[0]), func.grad(tloss)(T(POINTS[0])))


def test_a_scalar_recording_of_an_array_transform_is_refused_by_name():
    with pytest.raises(TypeError, match="tensor=True"):
        ad.record(ad.grad(lambda v: ad.sum(v * v)), X0)
    # a transform at one number stays scalar code: recorded and replayed
    F = ad.record(lambda v: [ad.grad(lambda t: t * t * ad.sin(t))(v[0])], X0)
    y = POINTS[0][0]
    np.testing.assert_allclose(F(POINTS[0]), [2 * y * np.sin(y) + y * y * np.cos(y)],
                               rtol=TOL)


BATCHED = {   # ops whose vjps and jvps take the batched basis (reductions, products...)
    "softmax": (lambda x: ad.softmax(A @ x), lambda x: torch.softmax(T(A) @ x, 0)),
    "logsumexp": (lambda x: ad.logsumexp(x) * x, lambda x: torch.logsumexp(x, 0) * x),
    "amax": (lambda x: ad.amax(x) * ad.sin(x), lambda x: torch.amax(x) * torch.sin(x)),
    "where": (lambda x: ad.where(x > 0, ad.sqrt(ad.abs(x) + 1.0), x * x),
              lambda x: torch.where(x > 0, torch.sqrt(x.abs() + 1.0), x * x)),
    "products": (lambda x: (x.reshape(2, 2) @ x.reshape(2, 2)).reshape(-1),
                 lambda x: (x.reshape(2, 2) @ x.reshape(2, 2)).reshape(-1)),
}


@pytest.mark.parametrize("mode", ["reverse", "forward"])
@pytest.mark.parametrize("name", list(BATCHED))
def test_recorded_vmap_jacobians_through_reductions_and_products(name, mode, monkeypatch):
    # the one-pass route itself (its fallback, the basis element by element, switched
    # off: a vjp or jvp that cannot take the batched basis fails here)
    from easyad.transforms import vmap_lift
    monkeypatch.setattr(vmap_lift, "_batched_pass", lambda run: run())
    ours, theirs = BATCHED[name]
    F = ad.record(ad.vmap(ad.jacobian(ours, mode=mode)), rng.normal(size=(3, 4)),
                  tensor=True)
    Y = rng.normal(size=(3, 4))
    close(F(Y), func.vmap(func.jacrev(theirs))(T(Y)))


def test_a_transform_that_reads_its_point_as_numbers_is_refused_by_name():
    # sparse Jacobians and Hessians read the point's values (a guard would bake them in)
    for g in (ad.jacobian(ad.sin, sparse=True),
              ad.hessian(lambda v: ad.sum(ad.sin(v)), sparse=True)):
        with pytest.raises(NotImplementedError, match="sparse=True"):
            ad.record(g, X0, tensor=True)
