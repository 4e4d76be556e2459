"""The replayed batched Jacobian's loops (issue 27 item 1): a loop where an operand is
the same along the last axes splits so nothing is gathered (that operand loaded once
per outer step); sums, maxima and minima over a loop's last axes keep a running value
in a register over the inner loop; constants that repeat along an axis (a basis
broadcast over the batch) are stored without it, equal ones once; ``ad.vmap(ad.jacobian
(f))`` in mode "auto" does not compute f's values again to choose forward mode. Every
rewrite is checked bit for bit against the program without it, and against numpy,
torch.func or finite differences.
"""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
from easyad.compiler import optimiser
from easyad.compiler.program import cstyle, fused_c

rng = np.random.default_rng(2727)
N = 8           # a vector's width: the tangent loop's inner loop
A = rng.normal(size=(N, N)) / 3.0
C = rng.normal(size=N)
X = rng.normal(size=(9, N))


def f(v):
    return ad.tanh(A @ v + C) * v[0]


def _plain(monkeypatch):
    """Record again with the loops and constants as before these rewrites."""
    monkeypatch.setattr(cstyle.Renderer, "_outer_split", lambda self, groups: None)
    monkeypatch.setattr(fused_c, "narrow_constants", lambda program, outputs: program)


def _jacobian_by_differences(x, h=1e-6):
    out = np.empty((x.shape[0], N, N))
    for b in range(x.shape[0]):
        for j in range(N):
            e = np.zeros(N)
            e[j] = h
            up = np.tanh(A @ (x[b] + e) + C) * (x[b] + e)[0]
            down = np.tanh(A @ (x[b] - e) + C) * (x[b] - e)[0]
            out[b, :, j] = (up - down) / (2 * h)
    return out


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_replayed_batched_jacobian_keeps_every_bit(mode, monkeypatch):
    F = ad.record(ad.vmap(ad.jacobian(f, mode=mode)), X, tensor=True)
    y = rng.normal(size=X.shape)
    y[1, 0] = 0.0           # a zero x[0]: the strong zeros decide
    y[2, 3] = np.inf        # an infinite input: NaN and inf where they belong
    y[3, 0] = -0.0
    got = F(y)
    source = F._bound["value"].source
    _plain(monkeypatch)
    G = ad.record(ad.vmap(ad.jacobian(f, mode=mode)), X, tensor=True)
    want = G(y)
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()
    if mode == "forward":    # the tangent loop: (basis, batch) outer, elements inner,
        # x[0] loaded once per outer step, nothing gathered at a divided index
        assert "for (long o = 0; o < 72L; o++) {\n        const double" in source
        assert "(ii / " not in source
    else:                    # the sum over the elements: a register per outer step
        assert "acc" in source and "[o] = (double)(acc" in source
    np.testing.assert_allclose(F(X), _jacobian_by_differences(X), rtol=1e-6, atol=1e-7)


def _last(x):
    return ad.sum(x * x, axis=2) + ad.amax(ad.sin(x), axis=2) * ad.amin(x, axis=2)


def _mixed(x):      # sums over the last two axes and the last one: one flat loop
    return _last(x), ad.sum(x * 2.0, axis=(1, 2))


@pytest.mark.parametrize("g", [_last, _mixed])
def test_reductions_over_the_last_axes_in_a_register(g, monkeypatch):
    x = rng.normal(size=(3, 4, 5))
    F = ad.record(g, x, tensor=True)
    y = rng.normal(size=x.shape)
    y[0, 1, 2] = np.nan     # max and min take a NaN as the eager ones do
    y[1, 2, 3] = -0.0
    got = F(y)
    assert ("[o] = (double)(acc" in F._bound["value"].source) == (g is _last)
    _plain(monkeypatch)
    G = ad.record(g, x, tensor=True)
    got, plain, want = (ad._trees.flatten(v)[0] for v in (got, G(y), g(y)))
    for a, b, c in zip(got, plain, want):
        assert a.tobytes() == b.tobytes()
        np.testing.assert_allclose(a, np.asarray(c), rtol=1e-14, atol=0)
    assert np.isnan(got[0][0, 1]) and not np.isnan(got[0][0, 0])


def test_a_sum_over_the_first_axis_keeps_its_loop():
    def g(x):
        return ad.sum(ad.amax(x, axis=0) ** 2) + ad.sum(ad.amin(x, axis=1))
    x = rng.normal(size=(4, 6))
    F = ad.record(g, x, tensor=True)
    y = rng.normal(size=x.shape)
    np.testing.assert_allclose(F(y), float(np.sum(y.max(0) ** 2) + np.sum(y.min(1))),
                               rtol=1e-13)


def test_constants_narrow_only_along_axes_they_repeat_along():
    a = np.broadcast_to(rng.normal(size=(3, 1, 4)), (3, 5, 4)).copy()
    assert optimiser._without_repeats(a).shape == (3, 1, 4)
    signed = a.copy()
    signed[:, 2, 0] = -0.0          # -0.0 beside 0.0: apart, bit for bit
    signed[:, [0, 1, 3, 4], 0] = 0.0
    assert optimiser._without_repeats(signed).shape == (3, 5, 4)
    nan = np.full((2, 3), np.nan)
    assert optimiser._without_repeats(nan).shape == (1, 1)
    assert optimiser._without_repeats(np.arange(6.0).reshape(2, 3)).shape == (2, 3)


def test_the_basis_is_read_once_and_narrowed():
    F = ad.record(ad.vmap(ad.jacobian(f, mode="reverse")), X, tensor=True)
    F(X)
    p = F._bound["value"].plan.program
    big = [s for s, a in p.constants.items() if a.size >= N * 9 * N]
    assert not big, [p.constants[s].shape for s in big]


def test_auto_jacobian_probes_f_once_per_shape():
    calls = []

    def h(v):
        calls.append(1)
        return ad.tanh(A @ v + C) * v[0]
    g = ad.vmap(ad.jacobian(h))
    first = g(X)
    n_first = len(calls)
    second = g(X)
    assert n_first == 2 and len(calls) == 3     # the probe for m is not run again
    assert first.tobytes() == second.tobytes()
    assert second.tobytes() == ad.vmap(ad.jacobian(h, mode="forward"))(X).tobytes()
    np.testing.assert_allclose(second, _jacobian_by_differences(X), rtol=1e-6, atol=1e-7)
    before = len(calls)
    g(X[:4])                              # another batch shape: probed again
    assert len(calls) == before + n_first

    def wide(v):                          # m < n: reverse mode, f's values always needed
        return ad.sum(ad.tanh(A @ v + C)).reshape(1) * v[0]
    r = ad.vmap(ad.jacobian(wide))
    np.testing.assert_allclose(r(X), r(X))
    np.testing.assert_allclose(r(X), ad.vmap(ad.jacobian(wide, mode="forward"))(X),
                               rtol=1e-13, atol=1e-14)
