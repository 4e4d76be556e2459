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


# ---- Hessians: the second-order program (built once, simplified, nonzeros only) ----

def smooth_program(seed, n):
    """A random f of n inputs over every rule the second-order program expresses (all but
    abs, maximum, minimum), constants in both operand places, a guard (an if on a
    comparison of Records) and a loop: no selects."""
    import operator

    from easyad import _rules as rules
    from test_replay import _bounded
    # (stop_gradient left out: differences of the gradient would see the stopped values)
    # (and the piecewise rows, whose partials are sign/pick helpers: the program declines)
    table = [r for r in rules.DIFFERENTIATED_RULES if r.name not in (
        "abs", "maximum", "minimum", "copysign", "fmax", "fmin")]
    plan = np.random.default_rng(seed)
    steps = []
    for _ in range(40):
        rule = table[plan.integers(len(table))]
        steps.append((rule, plan.integers(0, 10**6, size=2),
                      [plan.random() < 0.2, plan.random() < 0.2], float(plan.uniform(-0.9, 0.9))))

    def f(x):
        nodes = list(x)
        total = 0.0
        for rule, operands, constant, c in steps:
            args = []
            for k in range(rule.arity):
                t = c if constant[k] else ad.tanh(nodes[operands[k] % len(nodes)])
                domain = (0.5, np.inf) if (rule.name, k) == ("div", 1) else rule.domain[k]
                args.append(_bounded(t, domain))
            function = getattr(operator, rule.operator) if rule.operator else getattr(ad, rule.name)
            nodes.append(function(*args))
            total = total + nodes[-1] * nodes[len(nodes) // 2]
        total = total * 2.0 if x[0] > -5.0 else total      # a guard
        for i in range(len(x) - 1):
            total = total + 0.5 * (x[i + 1] - ad.sin(x[i]) ** 2) ** 2 + ad.exp(-x[i] * x[i])
        return total

    return f


def by_program(F, x):
    """The second-order program's nonzeros at x, called directly (None: handed over)."""
    second = F._second()
    return second[0].second_point(x, second[4], None, None)


def same_as_sweeps(F, x):
    """F.hessian(x) (the second-order program, from the second call on) against the
    sweeps: the same operations in the same order, so the same numbers (but for the sign
    of a zero)."""
    F.hessian(x)
    H = F.hessian(x)
    rows, cols = F.hessian_pattern()
    program = by_program(F, x)
    if program is not None:
        np.testing.assert_array_equal(H[rows, cols], program)    # the program's numbers
    reference = F._hessian_dense(x, None)
    np.testing.assert_array_equal(H, reference)
    return H


@pytest.mark.parametrize("seed", range(8))
def test_second_order_program_equals_the_sweeps_on_random_programs(seed):
    n = 6
    f = smooth_program(seed, n)
    rng = np.random.default_rng(seed)
    F = ad.record(f, rng.uniform(-1, 1, n))
    assert F._second() is not None                       # built, not declined
    rows, cols = F.hessian_pattern()
    for x in rng.uniform(-1, 1, (3, n)):
        H = same_as_sweeps(F, x)
        np.testing.assert_allclose(H, H.T, rtol=1e-13, atol=1e-13)
        nz = F.hessian(x, sparse=True)
        np.testing.assert_array_equal(nz, H[rows, cols])
        out = np.empty(len(rows))
        assert F.hessian(x, sparse=True, out=out) is out
        np.testing.assert_array_equal(out, nz)
        # central differences of the (independently swept) gradient
        eps = 1e-6
        fd = np.array([(F.gradient(x + eps * e) - F.gradient(x - eps * e)) / (2 * eps)
                       for e in np.eye(n)])
        np.testing.assert_allclose(H, fd, rtol=1e-5, atol=1e-5)
    X = rng.uniform(-1, 1, (3, n))
    np.testing.assert_array_equal(F.hessian(X, sparse=True), F.hessian(X)[:, rows, cols])
    with pytest.raises(ad.BranchChangedError):         # the guard x[0] > -5
        F.hessian(np.full(n, -6.0))


def rosenbrock_hessian(x):
    """Rosenbrock's Hessian derived by hand: tridiagonal."""
    n = len(x)
    H = np.zeros((n, n))
    for i in range(n - 1):
        H[i, i] += 1200 * x[i] ** 2 - 400 * x[i + 1] + 2
        H[i + 1, i + 1] += 200
        H[i, i + 1] = H[i + 1, i] = -400 * x[i]
    return H


def test_second_order_program_of_rosenbrock_is_its_tridiagonal_hessian():
    n = 40
    F = ad.record(rosenbrock, np.ones(n))
    rows, cols = F.hessian_pattern()
    assert len(rows) == 3 * n - 2 and np.all(np.abs(rows - cols) <= 1)
    program = F._second()[3][0]
    assert len(program) < 25 * n          # the adjoints of the sum folded away
    rng = np.random.default_rng(3)
    F.hessian(np.ones(n))
    for x in rng.uniform(-2, 2, (4, n)):
        expected = rosenbrock_hessian(x)
        np.testing.assert_array_equal(by_program(F, x), F.hessian(x, sparse=True))
        np.testing.assert_allclose(F.hessian(x), expected, rtol=1e-13, atol=1e-9)
        np.testing.assert_allclose(F.hessian(x, sparse=True), expected[rows, cols],
                                   rtol=1e-13, atol=1e-9)


def test_a_one_off_hessian_does_not_build_the_program():
    F = ad.record(rosenbrock, np.ones(5))
    x = np.full(5, 0.3)
    first = F.hessian(x)                 # by the sweeps (ad.hessian records and calls once)
    assert not hasattr(F, "_second_cache")
    second = F.hessian(x)                # from the second call: the program
    assert hasattr(F, "_second_cache")
    np.testing.assert_allclose(second, first, rtol=1e-13)


def test_second_order_program_hands_non_finite_points_to_the_sweeps():
    def f(x):
        return x[0] * x[0] * ad.sqrt(x[1]) + ad.log(x[2]) * x[0]
    F = ad.record(f, [1.0, 1.0, 1.0])
    assert F._second() is not None
    F.hessian(np.array([2.0, 3.0, 0.5]))          # the next calls: the program
    assert by_program(F, np.array([0.0, 0.0, 1.0])) is None      # 0 * inf: NaN there
    # sqrt'(0) = inf: the sweeps' strong zero makes 2 x0 * inf = 0 at x0 = 0 (the program,
    # with plain products, would give NaN there and hands the point over)
    for x in ([0.0, 0.0, 1.0], [1.0, 0.0, 1.0], [2.0, 3.0, 0.5]):
        x = np.array(x)
        np.testing.assert_array_equal(F.hessian(x), F._hessian_dense(x, None))
    with pytest.raises(ValueError, match="math domain error"):
        F.hessian(np.array([1.0, 1.0, -1.0]))
    with pytest.raises(ValueError, match="math domain error"):
        F.hessian(np.array([1.0, 1.0, -1.0]), sparse=True)


def test_functions_the_program_cannot_express_use_the_sweeps():
    G = ad.record(lambda x: abs(x[0]) * x[1] ** 2 + ad.where(x[1] > 0, x[0] * x[1], x[0]),
                  [1.0, 2.0])
    assert G._second() is None
    x = np.array([-1.5, 2.0])
    # d2f/dx0dx1 = 2 sign(x0) x1 + 1, d2f/dx1dx1 = 2 |x0|
    np.testing.assert_allclose(G.hessian(x), [[0.0, -4.0 + 1.0], [-4.0 + 1.0, 3.0]])
    rows, cols = G.hessian_pattern()
    np.testing.assert_array_equal(G.hessian(x, sparse=True), G.hessian(x)[rows, cols])


@pytest.mark.parametrize("name", ["rosenbrock", "powell", "wood", "beale", "mixed"])
def test_second_order_program_of_classic_functions(name):
    from test_replay import FUNCTIONS
    f, n = FUNCTIONS[name]
    F = ad.record(f, np.full(n, 0.9))
    assert F._second() is not None
    for x in np.random.default_rng(7).uniform(0.3, 1.7, (4, n)):
        same_as_sweeps(F, x)


def test_compiled_second_order_program_is_the_vms():
    import shutil
    import warnings
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    n = 8
    f = smooth_program(11, n)
    rng = np.random.default_rng(11)
    F = ad.record(f, rng.uniform(-1, 1, n))
    C = ad.record(f, rng.uniform(-1, 1, n))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ad.CompilerWarning)
        C.compile(hessian=True)
    assert C._second()[1] is not None
    F.hessian(np.zeros(n))                 # the VM's next calls: its program too
    xb, hb = np.empty(n), np.empty(len(C.hessian_pattern()[0]))
    bound = C.bind_hessian(xb, hb)
    for x in rng.uniform(-1, 1, (3, n)):
        assert bits(C.hessian(x, sparse=True)) == bits(F.hessian(x, sparse=True))
        assert bits(C.hessian(x)) == bits(F.hessian(x))
        xb[:] = x
        bound()
        assert bits(hb) == bits(F.hessian(x, sparse=True))
    with pytest.raises(ad.BranchChangedError):
        C.hessian(np.full(n, -6.0))


def test_bound_hessian_writes_the_nonzeros_and_falls_back_where_flagged():
    n = 6
    f = smooth_program(4, n)
    rng = np.random.default_rng(4)
    F = ad.record(f, rng.uniform(-1, 1, n))
    rows, cols = F.hessian_pattern()
    x, h = np.empty(n), np.empty(len(rows))
    call = F.bind_hessian(x, h)
    for point in rng.uniform(-1, 1, (3, n)):
        x[:] = point
        assert call() is None
        np.testing.assert_array_equal(h, F.hessian(point, sparse=True))
        np.testing.assert_allclose(h, F._hessian_dense(point, None)[rows, cols], rtol=1e-12,
                                   atol=1e-12)
    x[:] = -6.0
    with pytest.raises(ad.BranchChangedError):           # the guard: through hessian()
        call()
    with pytest.raises(ValueError, match="shape"):
        F.bind_hessian(x, np.empty(len(rows) + 1))
    with pytest.raises(ValueError, match="share memory"):
        F.bind_hessian(h[:n], h)
    # a non-finite nonzero: the sweeps' answer (strong zero) written instead
    S = ad.record(lambda v: v[0] * v[0] * ad.sqrt(v[1]), [1.0, 1.0])
    x, h = np.array([0.0, 0.0]), np.empty(len(S.hessian_pattern()[0]))
    S.bind_hessian(x, h)()
    r, c = S.hessian_pattern()
    np.testing.assert_array_equal(h, S._hessian_dense(x, None)[r, c])
    # a function the program cannot express: the bound call is hessian() itself
    A = ad.record(lambda v: abs(v[0]) * v[1] ** 2, [1.0, 2.0])
    x, h = np.array([-1.0, 3.0]), np.empty(len(A.hessian_pattern()[0]))
    A.bind_hessian(x, h)()
    r, c = A.hessian_pattern()
    np.testing.assert_array_equal(h, A.hessian(x)[r, c])
