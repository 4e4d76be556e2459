"""Issue 15 in the VM (no compiler): the one-point paths that skip work, and their results.

- ``x ** 2.0`` runs in a loop of the VM's own (the exponent known): its numbers must be the
  table's pow, bit for bit, on special values too (0, -0, inf, NaN, overflow);
- a gradient alone skips sums no partial reads (``run_dead``): the gradient, later values,
  and the errors of live entries are unchanged;
- ``F.gradient(x, out=g)`` and ``F.bind_gradient`` run the VM straight from C: the same
  numbers as ``F.gradient(x)``, and a flagged point goes through the general path.

References: a fresh recording at each point (reverse mode on Records, an independent
code path), and the batch path of the VM (``_run``), which none of these shortcuts use.
"""
import math

import numpy as np
import pytest

import easyad as ad

from test_replay import random_program, rosenbrock


def fresh_gradient(f, x):
    lst = ad.WengertList()
    xs = np.array([lst.variable(v) for v in x], dtype=object)
    z = f(xs)
    d = z.derivatives()
    return z.number, np.array([d[v] for v in xs])


def bits(a):
    return np.asarray(a, dtype=np.float64).tobytes()


def squares(x):
    return sum((x[i] - 0.5 * x[i + 1]) ** 2 + 3.0 * x[i] ** 2 for i in range(len(x) - 1))


def test_squares_replay_the_tables_pow_bit_for_bit():
    n = 12
    F = ad.record(squares, np.ones(n))
    rng = np.random.default_rng(0)
    specials = [0.0, -0.0, 1e-170, -1e-170, 1.5, -2.5, 1e150, np.inf, -np.inf, np.nan]
    for trial in range(40):
        x = rng.uniform(-3, 3, n)
        if trial >= 20:
            x[rng.integers(n, size=3)] = rng.choice(specials, 3)
        try:
            value, expected = fresh_gradient(squares, x)
        except (OverflowError, ValueError) as error:      # the recording raises: so must replay
            with pytest.raises(type(error)):
                F.gradient(x)
            continue
        g = F.gradient(x)
        assert bits(g) == bits(expected)
        assert bits(F(x)) == bits(value)
        # the batch path (generic loops) gives the same numbers
        assert bits(F.gradient(x[None, :])[0]) == bits(g)


def test_square_overflow_raises_as_floats_do():
    F = ad.record(lambda x: x[0] ** 2 + x[1] ** 2 + x[2] ** 2 + x[3] ** 2 + x[4] ** 2
                  + x[5] ** 2 + x[6] ** 2 + x[7] ** 2 + x[8] ** 2, np.ones(9))
    x = np.ones(9)
    x[4] = 1e200
    with pytest.raises(OverflowError):
        F.gradient(x)
    with pytest.raises(OverflowError):
        F(x)
    with pytest.raises(OverflowError):
        1e200 ** 2      # noqa: B018 - what Python does


def test_a_gradient_alone_skips_dead_sums_and_changes_nothing():
    n = 30
    F = ad.record(rosenbrock, np.ones(n))
    rng = np.random.default_rng(1)
    for _ in range(5):
        x = rng.uniform(-2, 2, n)
        value, fresh = fresh_gradient(rosenbrock, x)
        expected = F.gradient(x[None, :])[0]     # the batch path computes every value
        np.testing.assert_allclose(expected, fresh, rtol=1e-13)
        g = F.gradient(x)              # skips the sum's values
        assert bits(g) == bits(expected)
        assert F(x) == value           # then the value: computed afresh
        v2, g2 = F.value_and_gradient(x)
        assert v2 == value and bits(g2) == bits(expected)


def test_errors_of_live_entries_still_raise_when_sums_are_skipped():
    # log's value only feeds a sum: skipped sums must not hide its error
    def f(x):
        return ad.log(x[0]) + x[1] + x[2] * x[1] + ad.sqrt(x[2])
    F = ad.record(f, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(F.gradient(np.array([1.0, 2.0, 4.0])),
                                  fresh_gradient(f, [1.0, 2.0, 4.0])[1])
    with pytest.raises(ValueError, match="math domain error"):
        F.gradient(np.array([-1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="math domain error"):
        F.gradient(np.array([1.0, 2.0, -3.0]), out=np.empty(3))
    # a failure on the side a select does not take is no error, as before
    G = ad.record(lambda x: ad.where(x[0] > 0, ad.log(x[0]), x[0]) + x[1], [1.0, 1.0])
    np.testing.assert_array_equal(G.gradient(np.array([-1.0, 5.0])), [1.0, 1.0])


@pytest.mark.parametrize("seed", range(6))
def test_vm_point_paths_equal_the_batch_path_on_random_programs(seed):
    n = 7
    f = random_program(seed, n)
    rng = np.random.default_rng(seed)
    F = ad.record(f, rng.uniform(-1, 1, n))
    x, g, value = np.empty(n), np.empty(n), np.empty(1)
    bound = F.bind_gradient(x, g, value)
    bound_alone = F.bind_gradient(x, g2 := np.empty(n))
    for point in rng.uniform(-1, 1, (4, n)):
        reference = F.gradient(point[None, :])[0]          # the batch path
        z, fresh = fresh_gradient(f, point)
        np.testing.assert_allclose(reference, fresh, rtol=1e-12, atol=1e-12)
        assert bits(F.gradient(point)) == bits(reference)
        out = np.empty(n)
        assert F.gradient(point, out=out) is out and bits(out) == bits(reference)
        x[:] = point
        bound()
        assert bits(g) == bits(reference) and value[0] == F(point) == z
        bound_alone()
        assert bits(g2) == bits(reference)


def test_bound_vm_gradient_falls_back_where_the_point_is_flagged():
    def f(x):
        return x[0] * x[1] if x[0] > x[1] else x[1] - x[0]
    F = ad.record(f, [2.0, 1.0])
    assert not F.compiled
    x, g, value = np.array([3.0, 1.0]), np.empty(2), np.empty(1)
    call = F.bind_gradient(x, g, value)
    call()
    assert g.tolist() == [1.0, 3.0] and value[0] == 3.0
    x[:] = [1.0, 3.0]
    with pytest.raises(ad.BranchChangedError):
        call()
    R = ad.record(f, [2.0, 1.0], on_branch_change="retape")
    call = R.bind_gradient(x, g)
    call()
    assert g.tolist() == [-1.0, 1.0]
    M = ad.record(f, [2.0, 1.0], on_branch_change="mask")
    call = M.bind_gradient(x, g)
    call()
    assert np.isnan(g).all()
    L = ad.record(lambda v: ad.log(v[0]) * v[1], [1.0, 1.0])
    x, g = np.array([-1.0, 1.0]), np.empty(2)
    with pytest.raises(ValueError, match="math domain error"):
        L.bind_gradient(x, g)()
    with pytest.raises(ValueError, match="share memory"):
        L.bind_gradient(x, x)
    with pytest.raises(ValueError, match="C-contiguous float64"):
        L.bind_gradient(x, np.empty(3))


def test_bound_vm_gradient_with_anomaly_mode_and_user_primitives():
    F = ad.record(lambda v: ad.log(v[0]) * v[1], [1.0, 1.0])
    x, g = np.array([2.0, 3.0]), np.empty(2)
    call = F.bind_gradient(x, g)
    with ad.detect_anomaly():
        call()
    np.testing.assert_allclose(g, [1.5, math.log(2.0)])
    cube = ad.define("cube_vm", lambda t: t ** 3, lambda t: 3 * t ** 2)
    P = ad.record(lambda v: cube(v[0]) * v[1], [1.0, 1.0])
    call = P.bind_gradient(x, g)
    call()
    np.testing.assert_allclose(g, [3 * 4.0 * 3.0, 8.0])
