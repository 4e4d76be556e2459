"""The rule rows of scipy.special and numpy's float ufuncs (erfc, expit, logit, gammaln,
digamma, polygamma, xlogy, xlog1py, logaddexp, logaddexp2, copysign, fmax, fmin): their C
and OpenCL helpers (easyad/_helpers.h) against scipy and numpy on wide ranges, poles,
infinities and NaN; derivatives to third order against scipy's own derivatives
(polygamma), mpmath and finite differences; the conventions at ties, NaN and x == 0;
numpy's and scipy's ufuncs dispatching to the rows. The table-driven suites
(tests/test_conformance.py, test_rules.py) also run every row through every engine."""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import scipy.special as sp

import easyad as ad
from easyad import _core, _rules

RNG = np.random.default_rng(2611)


def c_values(name, *args):
    """The row's value as the compiled core computes it (the replay sweeps' C)."""
    return _core._rule_values(_rules.OPCODES[name], *args)


def close(got, want, rtol, atol=0.0):
    got, want = np.asarray(got, float), np.asarray(want, float)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    ok = same | (np.abs(got - want) <= atol + rtol * np.abs(want))
    assert ok.all(), list(zip(got[~ok][:5], want[~ok][:5], np.flatnonzero(~ok)[:5]))


# wide ranges: tiny, ordinary, huge, negative non-integers, poles, infinities, NaN
WIDE = np.concatenate([RNG.uniform(-30, 30, 400), 10.0 ** RNG.uniform(-300, 300, 200),
                       -10.0 ** RNG.uniform(-10, 12, 200), np.arange(-6.0, 4.0),
                       np.arange(-6.0, 4.0) + 0.5, [0.0, -0.0, np.inf, -np.inf, np.nan,
                                                    1.4616321449683622, 1e-310, 1e308]])


@pytest.mark.parametrize("name, ref, rtol, where", [
    ("erfc", sp.erfc, 1e-12, None),          # glibc's against cephes, far in the tail
    ("expit", sp.expit, 1e-15, None),
    ("logit", sp.logit, 2e-15, None),
    # near the roots 1, 2 absolute; at -inf C99's inf (scipy: -inf), cephes is inf at
    # subnormal x (glibc: -log x)
    ("gammaln", sp.gammaln, 5e-14, lambda x: (np.abs(x) < 1e15) & (np.abs(x) > 1e-300)),
    # absolute near digamma's zero 1.4616... and (reflection) its negative zeros
    ("digamma", sp.psi, 1e-13, lambda x: np.abs(x) < 1e9),
])
def test_unary_helpers_match_scipy_on_wide_ranges(name, ref, rtol, where):
    x = WIDE if name != "logit" else np.concatenate([RNG.uniform(0, 1, 500),
                                                     [0.0, 1.0, -0.5, 2.0, 0.5, np.nan]])
    if where is not None:
        x = x[where(x) | np.isnan(x) | (x == np.inf)]
    with np.errstate(all="ignore"):
        want = ref(x)
    got = c_values(name, x)
    # absolute: near digamma's and gammaln's zeros; erfc's tail, where cephes underflows
    close(got, want, rtol, atol=1e-15 if name in ("digamma", "gammaln") else
          1e-300 if name == "erfc" else 0.0)
    # the same values through the generic function on floats (poles: inf or NaN, no error)
    for v in x[::37]:
        close(getattr(ad, name)(float(v)), ref(v), rtol, atol=1e-15)


def test_polygamma_matches_scipy_and_mpmath():
    x = np.concatenate([RNG.uniform(0.01, 40, 300), -RNG.uniform(0.01, 30, 300),
                        [1e-8, 1e6, 0.5, -2.5]])
    x = x[np.abs(x - np.round(x)) > 1e-3]
    negative = x < 0
    for n in (1, 2, 3, 6, 12):
        got = c_values("polygamma", float(n), x)
        want = sp.polygamma(n, x)
        # for x < 0, mpmath: scipy's own error there reaches 1e-5 (n = 8 at -7.5)
        with mpmath.workdps(30):      # (at 15 digits its reflection loses 4 of them)
            want[negative] = [float(mpmath.polygamma(n, v)) for v in x[negative]]
        assert np.all(np.abs(got - want) <= 2e-13 * np.abs(want)), n
    # at half-integers cot(pi x) = 0 and its even derivatives vanish: for even n the
    # reflection gives psi^(n)(-k - 1/2) = psi^(n)(k + 3/2), by hand (mpmath's own
    # reflection needs far more than 30 digits there at n = 50)
    close(ad.polygamma(50.0, -1.5), ad.polygamma(50.0, 2.5), 1e-15)
    close(ad.polygamma(50.0, 2.5), float(mpmath.polygamma(50, 2.5)), 1e-13)
    for n, v in ((1, -3.7), (4, -0.3), (2, 1e-3), (7, 2.5), (30, -1.5), (45, 3.25)):
        with mpmath.workdps(30):
            close(ad.polygamma(float(n), v), float(mpmath.polygamma(n, v)), 1e-12)
    # poles and edges as scipy: (-1)^(n+1) inf at the non-positive integers, 0 at inf
    with np.errstate(all="ignore"):
        for n in (1, 2, 3):
            close(c_values("polygamma", float(n), np.array([0.0, -1.0, -4.0, np.inf])),
                  sp.polygamma(n, np.array([0.0, -1.0, -4.0, np.inf])), 0)
    assert ad.polygamma(0.0, 2.5) == ad.digamma(2.5)
    assert ad.polygamma(1.2, 2.5) == ad.polygamma(1.0, 2.5)        # the order is rounded
    assert math.isnan(ad.polygamma(-1.0, 2.5))


def test_binary_helpers_match_numpy_and_scipy():
    a = np.concatenate([RNG.uniform(-50, 50, 300), [0.0, -0.0, np.inf, -np.inf, np.nan, 3.0]])
    b = np.concatenate([RNG.uniform(-50, 50, 300), [-0.0, 0.0, np.inf, -np.inf, 1.0, 3.0]])
    pairs = [(a, b), (b, a), (a, a), (a, np.full_like(a, np.nan)), (a, np.full_like(a, np.inf))]
    with np.errstate(all="ignore"):
        for x, y in pairs:
            for name, ref, rtol in (("logaddexp", np.logaddexp, 4e-16),
                                    ("logaddexp2", np.logaddexp2, 4e-16),
                                    ("copysign", np.copysign, 0), ("fmax", np.fmax, 0),
                                    ("fmin", np.fmin, 0), ("xlogy", sp.xlogy, 4e-16),
                                    ("xlog1py", sp.xlog1py, 4e-16)):
                got, want = c_values(name, x, y), ref(x, y)
                close(got, want, rtol)
                if rtol == 0:     # exactly numpy's, the sign of zero included (but at
                    # fmax(0.0, -0.0): numpy's loops differ, its vector loop gives the
                    # second, its scalar one the first operand, as easyad does)
                    number = ~np.isnan(want) & ~((x == 0) & (y == 0))
                    assert np.array_equal(np.signbit(got[number]), np.signbit(want[number])), \
                        name
    # scipy's conventions at x == 0: 0 unless y is NaN, also at y = 0 and y < 0
    with np.errstate(all="ignore"):
        y = np.array([0.0, -1.0, np.inf, np.nan, 2.0])
        close(c_values("xlogy", np.zeros(5), y), sp.xlogy(0.0, y), 0)
        close(c_values("xlog1py", np.zeros(5), y - 1), sp.xlog1py(0.0, y - 1), 0)


def _fd(f, x, h=1e-6):
    return (f(x + h) - f(x - h)) / (2 * h)


@pytest.mark.parametrize("x", [0.37, 2.9, -1.3, -4.61, 17.5])
def test_gammaln_digamma_polygamma_derivatives_to_third_order(x):
    # Traces of Traces of Traces: the third derivative of gammaln is polygamma(2, x)
    t = ad.Trace(ad.Trace(ad.Trace(x, 1.0), 1.0), ad.Trace(1.0, 0.0))
    g = ad.gammaln(t)
    close(g.derivative.number.number, sp.psi(x), 1e-13, 1e-15)
    close(g.derivative.derivative.number, sp.polygamma(1, x), 1e-13)
    close(g.derivative.derivative.derivative, sp.polygamma(2, x), 1e-12)
    # reverse over reverse and the replayed Hessian of digamma
    F = ad.record(lambda v: ad.digamma(v[0]) * v[1], [x, 2.0])
    H = F.hessian([x, 2.0])
    close(H[0, 0], 2.0 * sp.polygamma(2, x), 1e-12)
    close(H[0, 1], sp.polygamma(1, x), 1e-13)
    close(ad.grad(lambda v: ad.polygamma(3.0, v))(x), sp.polygamma(4, x), 1e-12)
    close(ad.derivative(ad.digamma)(x), _fd(sp.psi, x), 1e-7)
    # Taylor mode: digamma's derivatives are polygamma's, order by order
    derivatives = ad.taylor(ad.digamma, x, order=4)
    for k in range(1, 5):
        close(derivatives[k], sp.polygamma(k, x), 1e-11)


def test_expit_logit_erfc_xlogy_derivatives():
    for x in (-40.0, -3.0, 0.2, 5.0, 40.0):
        d = ad.derivative(ad.expit)(x)
        close(d, sp.expit(x) * sp.expit(-x), 1e-15)      # e^-40, not 0: no cancellation
        close(ad.derivative(ad.derivative(ad.expit))(x),
              sp.expit(x) * sp.expit(-x) * (1 - 2 * sp.expit(x)), 1e-12, 1e-300)
    for x in (1e-9, 0.3, 0.5, 0.97):
        close(ad.derivative(ad.logit)(x), 1 / (x * (1 - x)), 1e-15)
        close(ad.derivative(ad.derivative(ad.logit))(x), (2 * x - 1) / (x * (1 - x)) ** 2,
              1e-12)
    close(ad.derivative(ad.erfc)(1.5), -2 / math.sqrt(math.pi) * math.exp(-2.25), 1e-15)
    # xlogy at x == 0: d/dx = log(y), d/dy = 0 (flat along x = 0), also at y = 0
    gx, gy = ad.grad(lambda v: ad.xlogy(v[0], v[1]))(np.array([0.0, 2.0]))
    assert (gx, gy) == (math.log(2.0), 0.0)
    gx, gy = ad.grad(lambda v: ad.xlog1py(v[0], v[1]))(np.array([0.0, -1.0]))
    assert gx == -math.inf and gy == 0.0
    g = ad.grad(lambda v: ad.xlogy(v[0], v[1]))(np.array([1.5, 2.0]))
    close(g, [math.log(2.0), 0.75], 1e-15)


def test_fmax_fmin_copysign_logaddexp_derivative_conventions():
    nan, inf = math.nan, math.inf

    def grads(f, x, y):
        return tuple(ad.grad(lambda v: f(v[0], v[1]))(np.array([x, y])))
    assert grads(ad.fmax, 2.0, 1.0) == (1.0, 0.0)
    assert grads(ad.fmax, 1.0, 1.0) == (0.5, 0.5)            # a tie splits, as maximum
    assert grads(ad.fmax, nan, 1.0) == (0.0, 1.0)            # the NaN is ignored
    assert grads(ad.fmax, 1.0, nan) == (1.0, 0.0)
    assert grads(ad.fmin, 2.0, 1.0) == (0.0, 1.0)
    assert grads(ad.fmin, nan, -inf) == (0.0, 1.0)
    assert all(math.isnan(g) for g in grads(ad.fmax, nan, nan))
    assert grads(ad.copysign, 2.0, -1.0) == (-1.0, 0.0)
    assert grads(ad.copysign, -2.0, -0.0) == (1.0, 0.0)       # y's sign bit
    assert grads(ad.copysign, 0.0, 3.0) == (0.0, 0.0)         # abs's kink: 0, as abs'(0)
    assert grads(ad.logaddexp, 1.0, 1.0) == (0.5, 0.5)
    assert grads(ad.logaddexp, 800.0, 0.0) == (1.0, 0.0)      # no overflow
    close(grads(ad.logaddexp2, 1.0, 3.0), [0.2, 0.8], 1e-15)
    # second derivatives: logaddexp's Hessian is w(1 - w) [[1, -1], [-1, 1]]
    H = ad.hessian(lambda v: ad.logaddexp(v[0], v[1]))(np.array([0.3, -0.4]))
    w = sp.expit(0.7)
    close(H, w * (1 - w) * np.array([[1, -1], [-1, 1]]), 1e-14)


def test_numpy_and_scipy_ufuncs_dispatch_to_the_rows():
    t, u = ad.Trace.variable(0.3), ad.Trace.constant(1.2)
    lst = ad.WengertList()
    r = lst.variable(0.3)
    for ufunc, fn, args in ((np.logaddexp, ad.logaddexp, (t, u)),
                            (np.logaddexp2, ad.logaddexp2, (u, t)),
                            (np.fmax, ad.fmax, (t, 0.1)), (np.fmin, ad.fmin, (0.1, t)),
                            (np.copysign, ad.copysign, (t, -1.0)),
                            (sp.expit, ad.expit, (t,)), (sp.logit, ad.logit, (t,)),
                            (sp.gammaln, ad.gammaln, (t,)), (sp.psi, ad.digamma, (t,)),
                            (sp.erfc, ad.erfc, (t,)), (sp.erf, ad.erf, (t,)),
                            (sp.xlogy, ad.xlogy, (t, u)), (sp.xlog1py, ad.xlog1py, (u, t))):
        got, want = ufunc(*args), fn(*args)
        assert (got.number, got.derivative) == (want.number, want.derivative), ufunc
    z = sp.expit(r) * np.logaddexp(r, np.float64(2.0))
    want = ad.expit(0.3) * ad.logaddexp(0.3, 2.0)
    assert z.number == want
    close(z.derivatives()[r], _fd(lambda v: sp.expit(v) * np.logaddexp(v, 2.0), 0.3), 1e-8)
    # an ndarray among the operands: elementwise, an object array of Traces
    out = np.logaddexp(np.array([0.0, 1.0]), t)
    assert out.dtype == object and out[1].number == np.logaddexp(1.0, 0.3)
    # np.positive computes stop_gradient's value, but is +x: its derivative passes
    assert np.positive(t).derivative == 1.0
    # other ufuncs still run numpy's loops over objects, as before
    assert np.sin(t).number == math.sin(0.3) and bool(np.less(t, 1.0))
    assert (np.float64(2.0) * t).derivative == 2.0
    # tensors: numpy's and scipy's ufuncs call the rows' methods
    T = ad.Tensor.variable(np.array([0.2, 1.5]), lst)
    loss = ad.sum(sp.gammaln(T) + np.fmax(T, 1.0) + sp.expit(T))
    g = loss.derivatives()[T]
    close(g, sp.psi([0.2, 1.5]) + [0.0, 1.0] + sp.expit([0.2, 1.5]) * sp.expit([-0.2, -1.5]),
          1e-14)


def test_opencl_helpers_match_scipy(opencl_device):
    x = np.concatenate([RNG.uniform(-20, 20, 200), RNG.uniform(0.01, 5, 100)])
    x = x[np.abs(x - np.round(x)) > 1e-3]
    y = RNG.uniform(0.1, 10, x.size)
    dev = next(d for d in ad.devices() if d.name == opencl_device)
    for dtype, rtol, tiny in ((np.float64, 1e-12, 1e-300), (np.float32, 1e-4, 1e-35)):
        if dtype == np.float64 and not dev.fp64:
            continue
        x, y = x.astype(dtype).astype(np.float64), y.astype(dtype).astype(np.float64)
        lst = ad.WengertList()
        X = ad.Tensor.variable(x.astype(dtype), lst, device=opencl_device)
        Y = ad.Tensor.constant(y.astype(dtype), device=opencl_device)
        cases = [(ad.digamma(X), sp.psi(x), 1e-15), (ad.gammaln(X), sp.gammaln(x), 1e-14),
                 (ad.expit(X), sp.expit(x), 0), (ad.erfc(X), sp.erfc(x), 0),
                 (ad.polygamma(2.0, X), sp.polygamma(2, x), 0),
                 (ad.xlogy(X, Y), sp.xlogy(x, y), 0), (ad.logaddexp(X, Y), np.logaddexp(x, y), 0),
                 (ad.fmax(X, Y), np.fmax(x, y), 0)]
        for k, (got, want, atol) in enumerate(cases):
            scale = np.abs(sp.polygamma(2, 1 - x)) if k == 4 else 0.0
            close(got.value, want, rtol, tiny + atol + rtol * scale * (x < 0))
        # the gradient's kernel: digamma' = polygamma(1, x)
        g = ad.sum(ad.digamma(X)).derivatives()[X]
        close(g, sp.polygamma(1, x), rtol * 10)


def test_the_scientific_page_lists_every_new_row():
    import pathlib
    text = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "scientific.md"
            ).read_text()
    for rule in _rules.SPECIAL_UNARY_RULES + _rules.SPECIAL_BINARY_RULES:
        assert f"`{rule.name}" in text, rule.name
        for alias in rule.aliases:
            assert f"alias `{alias}`" in text, alias
