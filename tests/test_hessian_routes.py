"""Every Hessian route gives the same numbers, on the first call and every later one.

A recorded Function has several ways to a Hessian: forward-over-reverse sweeps in the VM
(one point, sparse recovery in C; batches; dense blocks), the second-order program
(``_compile.second_order_program``, replayed by the VM or compiled, also behind
``sparse=True``, ``out=`` and ``bind_hessian``), the compiled sweeps
(``compile(hessian=True)``), ``hvp``, and the functional ``ad.hessian`` / ``ad.hvp``.
Random scalar programs over every rule of the table (and selects, abs, maximum, minimum,
pow with constants of both signs) are run through all of them at ordinary points and at
extreme ones (1e150, 1e-150, +-0, near overflow): the routes must agree exactly (NaN and
infinities in the same places, the same finite numbers: they do the same operations in
the same order), and at ordinary points match finite differences of the gradient.
"""
import math
import warnings

import numpy as np
import pytest

import easyad as ad
from easyad import _rules
from easyad.errors import BranchChangedError

# ---- random programs: a list of steps, run by one interpreter for every route ----

# arguments each rule is given so that it is defined at ordinary points (the program
# still reaches the rule's edges at the extreme points)
_UNIT = ("asin", "acos", "atanh")
_POSITIVE = ("log", "log2", "log10", "sqrt", "acosh", "log1p", "cbrt")
_BOUNDED = ("exp", "expm1", "sinh", "cosh")
_EXTRA = ("select", "pow_const_base", "pow_const_exponent")
RULE_NAMES = [r.name for r in _rules.RULES] + list(_EXTRA)


def _prepare(name, u):
    """u moved into the rule's domain with table operations (more rules on the way)."""
    if name in _UNIT:
        return ad.tanh(u) * 0.75
    if name == "acosh":
        return u * u + 1.25
    if name in _POSITIVE:
        return u * u + 0.5
    if name in _BOUNDED:
        return ad.sin(u) * 2.0
    if name == "tan":
        return ad.sin(u)            # away from pi/2
    return u


def _apply(name, u, w, c):
    """One step: the rule ``name`` of values u, w (c: a constant of either sign)."""
    if name == "select":
        return ad.where(u > w, u * w, w - c)
    if name == "pow_const_base":      # a negative base: an exponent that stays 3.0
        return c ** (ad.sin(u) * 2.0 if c > 0 else u * 0.0 + 3.0)
    if name == "pow_const_exponent":
        exponent = c if c == round(c) else abs(c)
        return (u * u + 0.5) ** exponent
    if name == "pow":
        return (u * u + 0.5) ** ad.sin(w)
    rule = _rules.RULES_BY_NAME[name]
    function = getattr(ad, name, None)
    if name == "abs":
        return abs(u - c)
    if rule.arity == 2:
        if name in ("add", "sub", "mul", "div"):
            operator = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b,
                        "mul": lambda a, b: a * b, "div": lambda a, b: a / (b * b + 0.5)}
            return operator[name](u, w)
        return function(u, w)
    if name == "neg":
        return -u
    return function(_prepare(name, u))


def random_program(rng, focus, n):
    """Steps (rule, operand, operand, constant) that use ``focus`` at least twice, one
    with a constant operand where the rule takes two (constants of both signs)."""
    names = RULE_NAMES
    steps = []
    count = n
    for k in range(7):
        name = focus if k in (1, 4) else names[rng.integers(len(names))]
        a, b = (int(i) for i in rng.integers(count, size=2))
        c = float(rng.choice([2.0, -2.0, 0.5, -0.5, 3.0, -1.5]))
        steps.append((name, a, b, c))
        count += 1
    return steps


def run_program(steps, x, n):
    values = [x[i] for i in range(n)]
    for name, a, b, c in steps:
        u, w = values[a], values[b]
        if name in ("add", "mul", "atan2", "hypot", "maximum", "minimum") and a == b:
            w = c                   # a constant operand, of either sign
        values.append(_apply(name, u, w, c))
    # every value reaches the output (so each rule's second derivative shows)
    total = values[-1]
    for v in values[n:-1]:
        total = total + v * 0.25
    return total


# ---- comparing routes ----

def same(a, b):
    """Equal to the bit, but for the sign of a zero: NaN where NaN, the same infinities,
    the same finite numbers."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


def outcome(call):
    """The result of call(), or the type of what it raised (routes raise alike)."""
    try:
        return call()
    except (ValueError, ArithmeticError, BranchChangedError) as e:
        return type(e)


def agree(results):
    first = results[0][1]
    for name, r in results[1:]:
        if isinstance(first, type) or isinstance(r, type):
            assert r is first, (name, r, first)
        else:
            assert same(r, first), (name, r, first)


def dense(F, sparse_values):
    rows, cols = F.hessian_pattern()
    H = np.zeros((F.n_inputs, F.n_inputs))
    H[rows, cols] = sparse_values
    return H


def routes(F, f, x):
    """(name, Hessian or exception type) by every one-point route of F (which has been
    called nowhere before) and ad.hessian."""
    n = F.n_inputs
    out = []
    out.append(("first call", outcome(lambda: F.hessian(x))))
    out.append(("second call", outcome(lambda: F.hessian(x))))
    out.append(("third call", outcome(lambda: F.hessian(x))))
    out.append(("sparse", outcome(lambda: dense(F, F.hessian(x, sparse=True)))))
    h = np.empty((n, n))
    out.append(("out=", outcome(lambda: F.hessian(x, out=h).copy())))
    out.append(("batch", outcome(lambda: F.hessian(np.stack([x, x]))[1])))
    nnz = len(F.hessian_pattern()[0])
    point, into = x.copy(), np.empty(nnz)

    def bound():
        call = F.bind_hessian(point, into)
        call()
        return dense(F, into)
    out.append(("bind_hessian", outcome(bound)))
    out.append(("ad.hessian", outcome(lambda: ad.hessian(f)(x))))
    return out


N = 3
ORDINARY = [np.array([0.3, -0.7, 1.1]), np.array([-1.3, 0.4, 0.9])]
TINY, HUGE, TOP = 1e-150, 1e150, 1.7e308
EXTREME = [np.array([HUGE, -HUGE, 2.0]), np.array([TINY, -TINY, 0.5]),
           np.array([0.0, -0.0, 1.0]), np.array([TOP, 1.0, -TOP]),
           np.array([-0.0, HUGE, TINY]), np.array([1e300, 1e-300, 3.0])]


def _recorded(steps, x0):
    f = lambda x: run_program(steps, x, N)      # noqa: E731
    with np.errstate(all="ignore"):
        return ad.record(f, x0), f


def _finite_differences(F, x, step=1e-5):
    H = np.empty((len(x), len(x)))
    for j in range(len(x)):
        e = np.zeros(len(x))
        e[j] = step
        H[:, j] = (F.gradient(x + e) - F.gradient(x - e)) / (2 * step)
    return H


@pytest.mark.parametrize("focus", RULE_NAMES)
def test_routes_agree_on_random_programs(focus):
    rng = np.random.default_rng(20261127 + RULE_NAMES.index(focus))
    for trial in range(3):
        steps = random_program(rng, focus, N)
        F, f = _recorded(steps, ORDINARY[0])
        for number, x in enumerate(ORDINARY + EXTREME):
            G, _ = _recorded(steps, ORDINARY[0])      # a Function not called before
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                results = routes(G, f, x)
                agree(results)
                # the Function called at other points first gives the same numbers
                results = [("after others", outcome(lambda: F.hessian(x)))] + results
                agree(results)
                H = results[0][1]
                if number < len(ORDINARY) and not isinstance(H, type) and np.isfinite(H).all():
                    reference = _finite_differences(G, x)
                    scale = 1.0 + np.abs(reference).max()
                    assert np.allclose(H, reference, rtol=1e-5, atol=1e-5 * scale), \
                        (focus, steps, H, reference)
                    assert np.array_equal(H, H.T)
                    # hvp: one sweep per direction, so to rounding of H's columns
                    for j in range(N):
                        v = np.eye(N)[j]
                        product = G.hvp(x, v)
                        assert np.allclose(product, H[:, j], rtol=1e-12,
                                           atol=1e-12 * (1.0 + np.abs(H).max()))
                        assert same(ad.hvp(f, x, v), product)
