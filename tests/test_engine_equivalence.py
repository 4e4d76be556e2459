"""One program, every engine: eager execution, the recorded program replayed kernel by
kernel (``fuse=False``), the fused C (``compiler/program/fused_c.py``) and the fused OpenCL kernels
(``compiler/program/fused_cl.py``) must give the same values (to a few units in the last place:
their math libraries differ) and the same gradients. Above all, every selection (max and min
along axes and over everything, comparisons, where, maximum/minimum, abs and relu at 0, a
clip) must pick the same elements in every engine, so the gradients agree to rounding.

Every elementwise rule of the table and the structural operations are composed with
transcendental producers (exp, log, atan, a sigmoid, tanh, sin...), so the selections
compare values of libm's functions, which the engines compute with different code (numpy's
SIMD loops, glibc's scalar and vector functions, the OpenCL driver's builtins). Points:
random, with ties (repeated values, whole constant rows) and extremes (huge, tiny,
subnormal, infinite). The fused C once lost the gradient of max along an axis of exp for a
quarter of the rows: the backward loop recomputed exp(x) with glibc's vector exp, which does
not always round as the scalar exp the max was taken over.

Each program is recorded (and compiled) once and replayed at all the points.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import easyad as ad
from easyad import _rules
from easyad.nn.functional import relu, sigmoid

ROWS, COLS = 16, 8          # rows of 8: the fused C's backward loops vectorise

PRODUCERS = {
    "exp": lambda x: ad.exp(x * 0.3),
    "log": lambda x: ad.log(x * x + 0.5),
    "atan": lambda x: ad.atan(x * 2.0),
    "sigmoid": lambda x: sigmoid(x * 1.5),
    "tanh": lambda x: ad.tanh(x * 0.7),
    "sin": lambda x: ad.sin(x * 1.3),
    "expm1": lambda x: ad.expm1(x * 0.4),
    "cbrt": lambda x: ad.cbrt(x * 3.0),
}


def _in_domain(u, interval):
    """A producer's value (any real) mapped into an open interval of a rule's domain."""
    lo, hi = interval
    if math.isinf(lo) and math.isinf(hi):
        return u
    if math.isinf(hi):
        return lo + ad.exp(u)
    return lo + (hi - lo) * sigmoid(u)


def _apply(rule, *operands):
    if rule.generic:
        return getattr(ad, rule.name)(*operands)
    a, *b = operands
    return {"neg": lambda: -a, "add": lambda: a + b[0], "sub": lambda: a - b[0],
            "mul": lambda: a * b[0], "div": lambda: a / b[0]}[rule.name]()


def selections(y):
    """Every selection on y (ROWS x COLS), as one number: max/min along each axis and over
    everything, comparisons of y with itself reversed (the middle column ties itself),
    where, maximum, abs and relu at 0 (the first and second columns) and a clip between
    two of y's columns (ties at those columns)."""
    return (ad.sum(y.max(axis=1) ** 2) + ad.sum(y.min(axis=0) * 0.7)
            + y.max() - y.min() * 0.3
            + ad.sum(ad.where(y >= y[:, ::-1], y, 0.5 * y))
            + ad.sum(ad.where(y < y[::-1], 0.25 * y, -y))
            + ad.sum(ad.maximum(y, y[::-1]) * 0.9) + ad.sum(ad.minimum(y, y[:, ::-1]))
            + ad.sum(ad.abs(y - y[:, :1])) + ad.sum(relu(y - y[:, 1:2]) * 1.1)
            + ad.sum(ad.minimum(ad.maximum(y, y[:, 2:3]), y[:, 3:4]) * 0.6))


# one more selection for each rule's values, in turn (``selections`` has them all)
_ONE_MORE = (lambda y: ad.sum(ad.where(y >= y[:, ::-1], y, 0.5 * y)),
             lambda y: ad.sum(ad.maximum(y, y[::-1]) * 0.9),
             lambda y: ad.sum(ad.abs(y - y[:, :1])),
             lambda y: ad.sum(relu(y - y[:, 1:2]) * 1.1),
             lambda y: ad.sum(ad.minimum(ad.maximum(y, y[:, 2:3]), y[:, 3:4]) * 0.6))


def _rule_program(rules):
    """Σ over the rules of max along rows, min along columns and one more selection of
    rule(producers(x)), each operand in its domain and made by another producer."""
    names = sorted(PRODUCERS)

    def f(x):
        total = 0.0
        for k, rule in enumerate(rules):
            operands = [_in_domain(PRODUCERS[names[(k + a) % len(names)]](x), interval)
                        for a, interval in enumerate(rule.domain)]
            y = _apply(rule, *operands)
            # the same values again, read by the reductions only: cheap ones the fused C
            # recomputes where the backward sweep reads them
            again = _apply(rule, *operands)
            total = total + ad.sum(again.max(axis=1) ** 2) + ad.sum(again.min(axis=0) * 0.7) \
                + _ONE_MORE[(k + len(rule.name)) % len(_ONE_MORE)](y)
        return total
    return f


def _structural(x, w):
    """Structural operations on transcendental values: sums and means along axes, a
    gather with repeats, slices, transposes, a matmul, each under selections."""
    e, t = ad.exp(x * 0.3), ad.tanh(x)
    gathered = sigmoid(x)[np.array([0, 2, 2, 5, 0, 8, 1, 3, 4, 15, 15, 9])]
    product = ad.atan(x) @ w
    return (selections(e) + selections(gathered)
            + ad.sum(ad.sin(x).sum(axis=0).max() * t.mean(axis=1).min())
            + ad.sum(ad.maximum(e.mean(axis=0), t.max(axis=0)))
            + ad.sum(product.max(axis=0)) + ad.sum(relu(product) * product.min(axis=1)[:, None])
            + ad.sum(ad.where(e.T > t.T, e.T, t.T).min(axis=1))
            + ad.sum(ad.abs(ad.log(e) - x * 0.3))        # abs at 0 up to rounding
            + selections(ad.exp(-x * 0.2)[:, ::-1]))


def _points(rng):
    """(name, x): random; ties (repeated values, a constant row, a column pair, a value
    mirrored so y and its reverse tie); extremes (huge, tiny, subnormal, infinite, 0)."""
    random = rng.normal(size=(ROWS, COLS))
    ties = random.copy()
    ties[:, 4] = ties[:, 1]
    ties[:, 6] = ties[:, 1]
    ties[3] = ties[0]
    ties[5] = 0.75
    ties[:, -1] = ties[:, 0]
    ties[7, :] = ties[7, ::-1]
    extremes = random.copy()
    extremes.flat[::7] = [1e3, -1e3, 40.0, -40.0, 1e-300, -1e-300, 5e-324, 0.0, -0.0, 700.0,
                          -745.0, 1e-8, 1e8, 3.0, -1e300, 1e300, 0.5][:len(extremes.flat[::7])]
    infinite = random.copy()
    infinite[2, 5] = np.inf
    infinite[6, 1] = -np.inf
    infinite[4, :] = infinite[4, 0]
    return [("random", random), ("ties", ties), ("extremes", extremes),
            ("infinite", infinite)]


def _agree(got, want, what, tol):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    finite = want[np.isfinite(want)]
    scale = max(1.0, float(np.max(np.abs(finite), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, equal_nan=True,
                               err_msg=what)


def _check_engines(f, args, points, devices=("numpy",), fuses=(True, False), tol=1e-10):
    """Eager value and gradient at each point against each recorded engine's."""
    eager = ad.value_and_grad(f)
    recorded = {(device, fuse): ad.record(f, *args, tensor=True, fuse=fuse, device=device)
                for device in devices for fuse in fuses}
    for name, x in points:
        new = (x,) + tuple(args[1:])
        with np.errstate(all="ignore"):
            want_value, want_g = eager(*new)
        for (device, fuse), F in recorded.items():
            value, g = F.value_and_gradient(*new)
            what = f"{name} point, device {device}, fuse={fuse}"
            _agree(value, want_value, what + ": value", tol)
            _agree(g, want_g, what + ": gradient", tol)


RULE_GROUPS = [_rules.RULES[k::4] for k in range(4)]


@pytest.mark.parametrize("group", range(len(RULE_GROUPS)),
                         ids=[",".join(r.name for r in g) for g in RULE_GROUPS])
def test_every_rule_under_selections(group, rng):
    f = _rule_program(RULE_GROUPS[group])
    points = _points(rng)
    _check_engines(f, (points[0][1],), points)


def test_structural_operations_under_selections(rng):
    points = _points(rng)
    w = rng.normal(size=(COLS, 5))
    _check_engines(_structural, (points[0][1], w), points)


def test_max_along_an_axis_of_transcendentals_keeps_its_gradient(rng):
    """The issue's example and its kin: the gradient of Σ max(f(x), axis=1)² goes to one
    element of each row, its largest, where it is the central difference's, in every
    engine."""
    x = rng.normal(size=(16, 8))
    for name in ("exp", "log", "atan", "sigmoid", "tanh", "sin"):
        produce = PRODUCERS[name]

        def f(x):
            return ad.sum(produce(x).max(axis=1) ** 2)
        eager = ad.value_and_grad(f)
        for fuse in (True, False):
            F = ad.record(f, x, tensor=True, fuse=fuse)
            g = F.gradient(x)
            assert np.count_nonzero(g, axis=1).tolist() == [1] * 16, (name, fuse)
            np.testing.assert_array_equal(g != 0, eager(x)[1] != 0)
            h = 1e-6
            for r in range(16):
                c = int(np.flatnonzero(g[r])[0])
                step = np.zeros_like(x)
                step[r, c] = h
                numeric = (float(F(x + step)) - float(F(x - step))) / (2 * h)
                assert abs(g[r, c] - numeric) <= 1e-6 * max(1.0, abs(numeric)), (name, r)


def test_ties_across_a_vector_loop_and_its_remainder(rng):
    """Equal inputs tie in every engine wherever they are in the array: the fused C's
    vectorised loop computes exp with glibc's vector exp and its last elements (past the
    last whole vector) with the scalar one, which round some inputs differently; the
    max's operand must be the same function of its input everywhere."""
    # values whose exp a vectorised loop rounds other than libm's exp (which math.exp
    # calls); where there are none (no vector math), any value shows no harm
    candidates = rng.uniform(-3.0, 3.0, 4096)
    vector_exp = ad.record(lambda x: ad.exp(x), candidates, tensor=True)(candidates)
    differ = candidates[vector_exp != np.array([math.exp(v) for v in candidates])]
    x = rng.uniform(-9.0, -5.0, size=(5, 7))
    # 35 elements: those of row 4 from column 4 on are past the last vector of 8 or 4
    x[0, 6] = x[4, 6] = differ[0] if differ.size else 0.5
    x[1, 5] = x[4, 5] = differ[1] if differ.size > 1 else 0.25

    def f(x):
        e = ad.exp(x)
        return ad.sum(e.T.max(axis=1) ** 2) + ad.sum(e * 0.5)
    eager = ad.value_and_grad(f)(x)[1]
    assert eager[0, 6] == eager[4, 6] != 0 and eager[1, 5] == eager[4, 5] != 0
    for fuse in (True, False):
        g = ad.record(f, x, tensor=True, fuse=fuse).gradient(x)
        _agree(g, eager, f"fuse={fuse}", 1e-12)


def test_scalar_tapes_agree_at_selections(rng):
    """Scalar tapes: the VM's replay, the compiled replay (one point and a batch of rows)
    and eager Records pick the same branches of maximum, minimum, where and abs over
    transcendental values, ties included (each entry is computed once there)."""
    def f(x):
        e = [ad.exp(v * 0.3) for v in x]
        s = [ad.sin(v * 1.3) for v in x]
        m = e[0]
        for v in e[1:]:
            m = ad.maximum(m, v)
        t = ad.where(s[0] > s[1], s[0], s[1] * 0.5)
        return m * m + t + ad.abs(s[2] - s[3]) + ad.minimum(e[4], ad.atan(x[5] * 2.0))
    F = ad.record(f, rng.normal(size=6))
    C = ad.record(f, rng.normal(size=6)).compile()
    points = np.array([rng.normal(size=6), [0.5, 0.5, 0.2, 0.2, 0.1, 0.5],
                       [1.0, 1.0, 1.0, 1.0, 0.0, 1.0], [3.0, -1.0, 2.0, 2.0, 0.4, 3.0]])
    want = np.array([ad.grad(f)(x) for x in points])
    np.testing.assert_allclose(C.gradient(points), want, rtol=1e-14, atol=0)
    for x, w in zip(points, want):
        np.testing.assert_allclose(F.gradient(x), w, rtol=1e-14, atol=0)
        np.testing.assert_allclose(C.gradient(x), w, rtol=1e-14, atol=0)
    # by hand at the five-way tie exp(0.3) (x4's exp is smaller): maximum splits each tie
    # in halves, so x0 gets 1/16 of d(m^2)/dm, x5 a half (where's s0 > s1 is false there)
    e = math.exp(0.3)
    assert want[2][0] == pytest.approx(2 * e * 0.3 * e / 16, rel=1e-14)
    assert want[2][5] == pytest.approx(2 * e * 0.3 * e / 2, rel=1e-14)


def test_opencl_agrees_with_every_engine(opencl_device, rng):
    """The fused OpenCL kernels (and their kernel-by-kernel replay) at the same points:
    every selection of the values of the issue's producers, one program (PoCL builds
    kernels slowly)."""
    def f(x):
        return sum(selections(PRODUCERS[name](x)) for name in ("exp", "log", "atan",
                                                                 "sigmoid"))
    points = _points(rng)
    _check_engines(f, (points[0][1],), points, devices=(opencl_device,))
