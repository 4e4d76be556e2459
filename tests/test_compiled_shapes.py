"""The shapes ``compile()`` renders specially, against the replay VM bit for bit.

The renderer keeps adjoints it knows when rendering (the output's 1, sums' and
differences' copies of it, products with constants) as literals instead of stored
slots, cuts affine reverse loops into pieces of one known adjoint, renders long runs that
are not affine (running sums) as loops over index tables, and skips the sums only the
output's value reads when a gradient is asked for without its value. None of that may
change a bit: each test compares values, gradients (allocating, ``out=``, bound with and
without the value) and the VM's errors at ordinary points and at 0, -0, +-inf, NaN, huge
and subnormal coordinates, and checks one case against a hand-derived gradient.
"""
import warnings

import numpy as np
import pytest

import easyad as ad
from easyad.compiler import tape as tape_compiler
from test_compiled import agree, outcome, same

pytestmark = pytest.mark.skipif(tape_compiler.compiler() is None, reason="no C compiler")

SPECIALS = (0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, -1e300, 1e-320, -2.5)


@pytest.fixture(scope="module", autouse=True)
def cache(module_cache):
    return module_cache


def compiled(f, x0):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ad.CompilerWarning)
        C = ad.record(f, x0).compile()
    assert C.compiled
    return C


def points(n, rng):
    """Ordinary points, then each special value at one coordinate and everywhere."""
    X = [rng.uniform(-2, 2, n) for _ in range(3)]
    for value in SPECIALS:
        x = rng.uniform(-2, 2, n)
        x[rng.integers(n)] = value
        X += [x, np.full(n, value)]
    return X


def check(f, n, seed=0):
    """f recorded at an ordinary point; VM and compiled code agree bit for bit (or raise
    alike) at every point, by every call; returns (VM, compiled)."""
    rng = np.random.default_rng(seed)
    x0 = rng.uniform(0.5, 1.5, n)
    F, C = ad.record(f, x0), compiled(f, x0)
    ran = 0
    for x in points(n, rng):
        assert agree(outcome(lambda: F(x)), outcome(lambda: C(x))), x
        reference = outcome(lambda: F.gradient(x))
        assert agree(reference, outcome(lambda: C.gradient(x))), x
        assert agree(outcome(lambda: F.value_and_gradient(x)),
                     outcome(lambda: C.value_and_gradient(x))), x
        assert agree(reference, outcome(lambda: C.gradient(x, out=np.empty(n)))), x
        # bound once, without its value (the sums only the value reads are skipped) and
        # with it
        for value in (None, np.empty(1)):
            xb, gb = x.copy(), np.full(n, 7.0)
            call = C.bind_gradient(xb, gb, value)
            got = outcome(lambda: (call(), gb.copy())[1])
            assert agree(reference, got), x
            if value is not None and got[0] == "ok":
                assert same(value, [F(x)])
        ran += C._native.point(x, True) is not None
    assert ran >= 3          # the ordinary points ran compiled
    # batches: rows in C (gradients alone skip the values and the sums only they read)
    X = np.array(points(n, rng))
    for method in ("gradient", "value_and_gradient"):
        assert agree(outcome(lambda: getattr(F, method)(X)),
                     outcome(lambda: getattr(C, method)(X))), method
    Y = rng.uniform(0.5, 2, (64, n))       # in every domain: no row flagged
    G, flags = np.full((64, n), 7.0), np.empty(64, dtype=np.uint8)
    assert C._native.rows(True, Y, None, G, flags, 0, 64) == 0
    assert same(G, F.gradient(Y))
    with pytest.raises(ValueError, match="values need out"):
        C._native.rows(False, Y, None, None, flags, 0, 64)
    return F, C


@pytest.mark.parametrize("n", [5, 40])    # straight-line entries; affine loops
@pytest.mark.parametrize("exponent", [2.0, 3.0, 0.5, 1.0, 0.0, -1.0, -2.0, 2])
def test_constant_exponents(exponent, n):
    def f(x):
        s = x[0] * 0.0
        for i in range(len(x)):
            s = s + x[i] ** exponent
        return s
    F, C = check(f, n, seed=int(abs(exponent) * 10) + n)
    if exponent == 2.0:     # d/dx x**2 = 2x, exact in doubles (the table's 0 at 0)
        x = np.random.default_rng(1).uniform(-3, 3, n)
        x[0] = -0.0
        assert same(C.gradient(x), np.where(x == 0, 0.0, 2 * x))


@pytest.mark.parametrize("n", [6, 80])    # long runs become loops over index tables
def test_sums_differences_and_negations(n):
    def f(x):
        s = -x[0]
        for i in range(1, len(x)):
            s = (s + x[i]) - x[i - 1] if i % 3 else -(s - x[i])
        return s - x[-1] * 2.0
    F, C = check(f, n, seed=n)

    def linear(x):
        s = x[0] * 0.5
        for i in range(1, len(x)):
            s = s + x[i] * (i + 0.25)
        return s
    F, C = check(linear, n, seed=n + 1)
    x = np.random.default_rng(2).uniform(-1, 1, n)
    assert same(C.gradient(x), [0.5] + [i + 0.25 for i in range(1, n)])   # by hand


def test_products_with_constants_and_their_strong_zeros():
    weights = [0.0, -0.0, 1.0, -1.0, 3.0, 1e300, -1e-320, np.inf, np.nan, 0.5]

    def f(x):
        s = x[0] * 0.0
        for i, c in enumerate(weights):
            s = s + c * (x[i] * 100.0) ** 2 + (c * x[i]) * x[(i + 1) % len(x)]
        return s
    check(f, len(weights), seed=3)


@pytest.mark.parametrize("n", [12, 60])
def test_many_known_adjoints_in_one_loop(n):
    """Distinct weights on squares: the squares' loop reads as many known adjoints as
    entries (more pieces than are cut: the adjoints are stored and the loop reads them)."""
    c = np.arange(1, n + 1) * 0.75

    def f(x):
        s = x[0] * 0.0
        for i in range(len(x)):
            s = s + c[i] * x[i] ** 2
        return s
    F, C = check(f, n, seed=n)
    x = np.random.default_rng(4).uniform(-2, 2, n)
    assert same(C.gradient(x), (2 * x) * c)     # mul0(2x, c): exact here


def test_rosenbrock_gradient_without_its_value_and_with_it():
    def rosenbrock(x):
        s = 0.0
        for i in range(len(x) - 1):
            s = s + 100 * (x[i + 1] - x[i] ** 2) ** 2 + (1 - x[i]) ** 2
        return s
    F, C = check(rosenbrock, 50, seed=9)
    x = np.random.default_rng(6).uniform(-2, 2, 50)
    by_hand = np.zeros(50)
    by_hand[:-1] = -400 * x[:-1] * (x[1:] - x[:-1] ** 2) - 2 * (1 - x[:-1])
    by_hand[1:] += 200 * (x[1:] - x[:-1] ** 2)
    np.testing.assert_allclose(C.gradient(x), by_hand, rtol=1e-12, atol=1e-12)
