"""Record once, replay many: Function values, gradients, Jacobians, Hessians at new points.

References: reverse mode recorded afresh at each point (an independent recording), sympy
Hessians of classic test functions, central finite differences of the replayed gradient.
"""
import operator
import pickle

import numpy as np
import pytest
import sympy as sp

import easyad as ad


# ---- classic test functions, written once for every Numeric kind ----

def rosenbrock(x):
    return sum(100 * (x[i + 1] - x[i] ** 2) ** 2 + (1 - x[i]) ** 2 for i in range(len(x) - 1))


def powell(x):
    return ((x[0] + 10 * x[1]) ** 2 + 5 * (x[2] - x[3]) ** 2 + (x[1] - 2 * x[2]) ** 4
            + 10 * (x[0] - x[3]) ** 4)


def wood(x):
    return (100 * (x[0] ** 2 - x[1]) ** 2 + (x[0] - 1) ** 2 + (x[2] - 1) ** 2
            + 90 * (x[2] ** 2 - x[3]) ** 2 + 10.1 * ((x[1] - 1) ** 2 + (x[3] - 1) ** 2)
            + 19.8 * (x[1] - 1) * (x[3] - 1))


def beale(x):
    return ((1.5 - x[0] + x[0] * x[1]) ** 2 + (2.25 - x[0] + x[0] * x[1] ** 2) ** 2
            + (2.625 - x[0] + x[0] * x[1] ** 3) ** 2)


def mixed(x):
    return ad.exp(x[0] / 3) * ad.sin(x[1]) + ad.log(1 + x[2] ** 2) * ad.sqrt(x[0] ** 2 + 1) \
        - ad.tanh(x[1] * x[2]) + ad.atan2(x[0], x[2] + 3) + ad.hypot(x[1], 2.0)


SYMPY_NAMESPACE = {"exp": sp.exp, "sin": sp.sin, "log": sp.log, "sqrt": sp.sqrt,
                   "tanh": sp.tanh, "atan2": sp.atan2, "hypot": lambda a, b: sp.sqrt(a**2 + b**2)}

FUNCTIONS = {"rosenbrock": (rosenbrock, 5), "powell": (powell, 4), "wood": (wood, 4),
             "beale": (beale, 2), "mixed": (mixed, 3)}


def sympy_reference(f, n):
    """value, gradient and Hessian functions of f, differentiated by sympy."""
    xs = sp.symbols(f"x0:{n}", real=True)

    class Namespace:  # ad.<fn> resolved to sympy's while tracing f symbolically
        def __getattr__(self, name):
            return SYMPY_NAMESPACE[name]

    globals_ = dict(f.__globals__, ad=Namespace())
    g = type(f)(f.__code__, globals_)
    expr = g(list(xs))
    grad = [sp.diff(expr, v) for v in xs]
    hess = [[sp.diff(gi, v) for v in xs] for gi in grad]
    lam = lambda e: sp.lambdify([xs], e, "math")  # noqa: E731
    return lam(expr), lam(grad), lam(hess)


def points(n, count, rng):
    return rng.uniform(0.3, 1.7, size=(count, n))


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_values_gradients_hessians_match_sympy_at_new_points(name, rng):
    f, n = FUNCTIONS[name]
    value, gradient, hessian = sympy_reference(f, n)
    F = ad.record(f, np.full(n, 0.9))
    for x in points(n, 5, rng):
        assert F(x) == pytest.approx(value(x), rel=1e-12)
        np.testing.assert_allclose(F.gradient(x), gradient(x), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(F.hessian(x), np.array(hessian(x), dtype=float),
                                   rtol=1e-9, atol=1e-9)
        v = rng.normal(size=n)
        np.testing.assert_allclose(F.hvp(x, v), np.array(hessian(x), dtype=float) @ v,
                                   rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_replay_equals_a_fresh_recording(name, rng):
    f, n = FUNCTIONS[name]
    F = ad.record(f, np.full(n, 1.1))
    for x in points(n, 4, rng):
        lst = ad.WengertList()
        xs = np.array([lst.variable(v) for v in x], dtype=object)
        z = f(xs)
        d = z.derivatives()
        assert F(x) == pytest.approx(z.number, rel=1e-14)
        np.testing.assert_allclose(F.gradient(x), [d[v] for v in xs], rtol=1e-12, atol=1e-12)


def test_batches_equal_rows_and_use_threads(rng):
    n = 30
    F = ad.record(rosenbrock, np.ones(n))
    X = points(n, 3000, rng)  # large enough to split over threads
    G = F.gradient(X)
    assert G.shape == (3000, n)
    for r in (0, 1234, 2999):
        np.testing.assert_array_equal(G[r], F.gradient(X[r]))
    np.testing.assert_array_equal(F(X), [F(x) for x in X[:5]] + list(F(X[5:])))
    H = F.hessian(X[:7])
    assert H.shape == (7, n, n)
    np.testing.assert_allclose(H[3], F.hessian(X[3]), rtol=0, atol=0)
    V = rng.normal(size=(7, n))
    np.testing.assert_allclose(F.hvp(X[:7], V), np.einsum("bij,bj->bi", H, V), rtol=1e-10)


def test_hessian_by_finite_differences_of_the_gradient(rng):
    F = ad.record(mixed, np.full(3, 0.5))
    x = np.array([0.7, -0.4, 1.3])
    eps = 1e-6
    fd = np.array([(F.gradient(x + eps * e) - F.gradient(x - eps * e)) / (2 * eps)
                   for e in np.eye(3)]).T
    np.testing.assert_allclose(F.hessian(x), fd, rtol=1e-6, atol=1e-6)


def test_jacobian_of_several_outputs():
    def polar(x):
        return [x[0] * ad.cos(x[1]), x[0] * ad.sin(x[1]), 3.0]

    F = ad.record(polar, [1.0, 0.5])
    r, a = 2.0, 1.2
    J = F.jacobian([r, a])
    expected = [[np.cos(a), -r * np.sin(a)], [np.sin(a), r * np.cos(a)], [0.0, 0.0]]
    np.testing.assert_allclose(J, expected, rtol=1e-14)
    np.testing.assert_allclose(F([r, a]), [r * np.cos(a), r * np.sin(a), 3.0])
    with pytest.raises(ValueError, match="scalar function"):
        F.gradient([r, a])


def branchy(x):
    if x[0] > 0:
        return x[0] * x[1]
    return -x[0] * x[1] ** 2


def test_branch_change_raises_names_the_comparison():
    F = ad.record(branchy, [1.0, 2.0])
    np.testing.assert_allclose(F.gradient([2.0, 3.0]), [3.0, 2.0])
    with pytest.raises(ad.BranchChangedError, match=r"x\[0\] > 0.0.*True when recorded"):
        F.gradient([-2.0, 3.0])


def test_branch_change_retape_and_mask():
    F = ad.record(branchy, [1.0, 2.0])
    X = np.array([[2.0, 3.0], [-2.0, 3.0], [0.5, 1.0]])
    G = F.gradient(X, on_branch_change="retape")
    np.testing.assert_allclose(G, [[3.0, 2.0], [-9.0, 12.0], [1.0, 0.5]])
    values, mask = F(X, on_branch_change="mask")
    assert mask.tolist() == [False, True, False]
    assert np.isnan(values[1]) and values[0] == 6.0 and values[2] == 0.5
    H, mask = F.hessian(X, on_branch_change="mask")
    assert np.isnan(H[1]).all() and not np.isnan(H[[0, 2]]).any()


def test_where_is_replayed_without_guards():
    F = ad.record(lambda x: ad.where(x[0] > 0, ad.sqrt(x[0]) * x[1], x[0] * x[1] ** 2),
                  [1.0, 2.0])
    X = np.array([[4.0, 3.0], [-2.0, 3.0], [0.0, 1.0]])
    np.testing.assert_allclose(F(X), [6.0, -18.0, 0.0])
    # the sqrt of the branch not taken fails at -2: no error, no NaN leaks
    np.testing.assert_allclose(F.gradient(X), [[0.75, 2.0], [9.0, -12.0], [1.0, 0.0]])
    np.testing.assert_allclose(F.hessian([4.0, 3.0]), [[-3 / 32, 0.25], [0.25, 0.0]])


def test_math_errors_on_replay_name_the_operation():
    F = ad.record(lambda x: ad.log(x[0]) + x[1], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"math domain error in entry \d+ \(log\) replaying row 1"):
        F(np.array([[1.0, 1.0], [-1.0, 1.0]]))
    G = ad.record(lambda x: x[0] / x[1], [1.0, 1.0])
    with pytest.raises(ZeroDivisionError):
        G([1.0, 0.0])


def test_bad_shapes_and_inputs():
    F = ad.record(rosenbrock, np.ones(3))
    with pytest.raises(ValueError, match=r"shape \(3,\) or \(B, 3\)"):
        F([1.0, 2.0])
    with pytest.raises(ValueError, match="1-D"):     # scalar code takes one 1-D point
        ad.record(rosenbrock, np.ones((2, 2)), tensor=False)
    with pytest.raises(ValueError, match="on_branch_change"):
        ad.record(rosenbrock, np.ones(3), on_branch_change="ignore")
    with pytest.raises(ValueError, match="v must have shape"):
        F.hvp(np.ones(3), np.ones(2))


def test_pickle_save_and_load(tmp_path):
    F = ad.record(mixed, [0.5, 0.2, 0.9])
    x = np.array([0.3, 0.4, 1.5])
    G = pickle.loads(pickle.dumps(F))
    np.testing.assert_array_equal(G.gradient(x), F.gradient(x))
    path = tmp_path / "mixed.npz"
    F.save(path)
    H = ad.load(path)
    np.testing.assert_array_equal(H.hessian(x), F.hessian(x))
    assert H(x) == F(x)
    np.savez(tmp_path / "other.npz", a=np.ones(2))
    with pytest.raises(ValueError, match="not a saved easyad Function"):
        ad.load(tmp_path / "other.npz")


def test_constant_outputs_and_unused_inputs():
    F = ad.record(lambda x: 2.5, [1.0, 2.0])
    assert F([3.0, 4.0]) == 2.5
    np.testing.assert_array_equal(F.gradient([3.0, 4.0]), [0.0, 0.0])
    np.testing.assert_array_equal(F.hessian([3.0, 4.0]), np.zeros((2, 2)))


def test_functional_hessian_and_hvp():
    x = np.array([1.2, 0.8, 1.1, 0.9])
    _, _, hessian = sympy_reference(wood, 4)
    np.testing.assert_allclose(ad.hessian(wood)(x), np.array(hessian(x), dtype=float), rtol=1e-10)
    v = np.array([1.0, -1.0, 0.5, 2.0])
    np.testing.assert_allclose(ad.hvp(wood, x, v), np.array(hessian(x), dtype=float) @ v,
                               rtol=1e-10)


def test_to_dot_pictures_the_tape():
    lst = ad.WengertList()
    x = lst.variable(2.0, name="x")
    y = x * ad.sin(x) + 1.0
    dot = lst.to_dot(y.derivatives())
    assert dot.startswith("digraph WengertList {") and dot.rstrip().endswith("}")
    assert "x\\nvalue 2" in dot and "sin" in dot and "adjoint" in dot
    assert dot.count("->") == 5  # x->sin, x->mul, sin->mul, mul->add, and the constant 1->add
    F = ad.record(lambda v: ad.where(v[0] > 0, v[0], 0.0), [1.0])
    assert "condition" in F.to_dot()


def test_scipy_trust_exact_with_easyad_gradient_and_hessian():
    optimize = pytest.importorskip("scipy.optimize")
    x0 = np.array([1.3, 0.7, 0.8, 1.9, 1.2])  # (from -1.2 the 4-D problem has a local minimum)
    result = optimize.minimize(rosenbrock, x0, jac=ad.grad(rosenbrock),
                               hess=ad.hessian(rosenbrock), method="trust-exact",
                               options={"gtol": 1e-10})
    assert result.success
    np.testing.assert_allclose(result.x, np.ones(5), atol=1e-6)


def test_guard_after_the_output_is_checked():
    # f returns its input unchanged on one branch: the guard comes after the output entry
    F = ad.record(lambda v: v[0] if v[0] > 0 else -v[0], [1.0])
    np.testing.assert_array_equal(F.gradient([2.0]), [1.0])
    with pytest.raises(ad.BranchChangedError):
        F.gradient([-1.0])
    np.testing.assert_array_equal(F.gradient([-1.0], on_branch_change="retape"), [-1.0])


# ---- the replay layout: random programs, replayed like fresh recordings ----

def _bounded(t, domain):
    """t in (-1, 1) mapped inside an open interval of a rule's domain."""
    lo, hi = domain
    if lo == -np.inf and hi == np.inf:
        return 2.0 * t
    if hi == np.inf:
        return (lo + 1.5) + t
    return 0.5 * (lo + hi) + 0.45 * (hi - lo) * t


def random_program(seed, n, table=None):
    """A generic f of n inputs: every rule of the table (or of ``table``) on bounded
    arguments, constants in both operand places, selects and their comparisons, and a
    loop (long runs of one opcode, a chain of sums) so the replay layout has real
    reordering to do."""
    from easyad import _rules as rules
    # (not stop_gradient: differences of the gradient would see the stopped values)
    table = rules.DIFFERENTIATED_RULES if table is None else table
    plan = np.random.default_rng(seed)
    steps = []
    for _ in range(60):
        rule = table[plan.integers(len(table))]
        operands = plan.integers(0, 10**6, size=2)
        constant = [plan.random() < 0.2, plan.random() < 0.2]
        steps.append((rule, operands, constant, float(plan.uniform(-0.9, 0.9)),
                      plan.random() < 0.15))

    def f(x):
        nodes = list(x)
        total = 0.0
        for rule, operands, constant, c, select in steps:
            args = []
            for k in range(rule.arity):
                t = c if constant[k] else ad.tanh(nodes[operands[k] % len(nodes)])
                domain = (0.5, np.inf) if (rule.name, k) == ("div", 1) else rule.domain[k]
                args.append(_bounded(t, domain))
            function = getattr(operator, rule.operator) if rule.operator else getattr(ad, rule.name)
            z = function(*args)
            if select:
                other = nodes[operands[0] % len(nodes)]
                z = ad.where(other > c, z, other * c)
            nodes.append(z)
            total = total + z
        for i in range(len(x) - 1):       # a loop: the same operations per term
            total = total + 0.5 * (x[i + 1] - ad.sin(x[i]) ** 2) ** 2 + ad.exp(-x[i] * x[i])
        return total

    return f


@pytest.mark.parametrize("seed", range(12))
def test_random_programs_replay_like_fresh_recordings(seed):
    n = 7
    f = random_program(seed, n)
    rng = np.random.default_rng(seed)
    F = ad.record(f, rng.uniform(-1, 1, n))
    runs = F._replayer.runs
    assert sum(length for _, length, _ in runs) + n == len(F)
    for x in rng.uniform(-1, 1, (3, n)):
        lst = ad.WengertList()
        xs = np.array([lst.variable(v) for v in x], dtype=object)
        z = f(xs)
        d = z.derivatives()
        fresh = np.array([d[v] for v in xs])
        assert F(x) == z.number  # the same operations on the same numbers: bit for bit
        np.testing.assert_allclose(F.gradient(x), fresh, rtol=1e-12, atol=1e-12)
        G = F.gradient(np.vstack([x, x]))           # the batch path agrees with the point path
        np.testing.assert_array_equal(G[1], F.gradient(x))
        eps = 1e-6
        fd = np.array([(F.gradient(x + eps * e) - F.gradient(x - eps * e)) / (2 * eps)
                       for e in np.eye(n)])
        np.testing.assert_allclose(F.hessian(x), fd, rtol=1e-5, atol=1e-5)


def test_a_loop_is_laid_out_in_a_few_long_runs():
    F = ad.record(rosenbrock, np.ones(200))
    runs = F._replayer.runs
    assert len(runs) <= 10, runs              # per term: pow, sub, pow, mul, sub, pow, add, add
    assert max(length for _, length, _ in runs) >= 199


def guarded_squares(x):
    s = sum(x[i] ** 2 for i in range(len(x)))
    return s if x[0] > 0 else -s


def test_one_point_calls_fall_back_to_the_general_path():
    # one point in one C call (values, gradients, sparse Hessians); a changed branch, an
    # error or the mask mode there must behave exactly as the batch path does
    F = ad.record(guarded_squares, np.ones(4))
    x, flipped = np.array([1.0, 2.0, 3.0, 4.0]), np.array([-1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(F.hessian(x), 2 * np.eye(4))     # a diagonal: one colour
    np.testing.assert_array_equal(F.gradient(x), 2 * x)
    assert F(x) == 30.0
    for method in (F, F.gradient, F.hessian, F.value_and_gradient):
        with pytest.raises(ad.BranchChangedError):
            method(flipped)
    for method in (F, F.gradient, F.hessian):
        result, changed = method(flipped, on_branch_change="mask")
        assert changed is True and np.isnan(result).all()
    np.testing.assert_array_equal(F.hessian(flipped, on_branch_change="retape"), -2 * np.eye(4))
    G = ad.record(lambda v: ad.log(v[0]) * v[1], [1.0, 1.0])
    with pytest.raises(ValueError, match="math domain error"):
        G.gradient(np.array([-1.0, 1.0]))
    with pytest.raises(ValueError, match="math domain error"):
        G(np.array([-1.0, 1.0]))


def test_complex_input_is_refused_like_records_refuse_it():
    # issue 12, item 6: numpy dropped the imaginary part with only a ComplexWarning
    F = ad.record(lambda v: v[0] * v[1], [1.0, 2.0])
    for call in (lambda: F([1 + 5j, 2.0]), lambda: F(np.array([1 + 5j, 2.0])),
                 lambda: F.gradient([1 + 5j, 2.0]), lambda: F.jacobian([[1j, 2.0]]),
                 lambda: F.hvp([1.0, 2.0], [1j, 0.0]), lambda: ad.record(lambda v: v[0], [1j])):
        with pytest.raises(TypeError, match="complex"):
            call()
    with pytest.raises(TypeError, match="real number"):
        ad.WengertList().variable(1 + 5j)
    assert F(np.array([3.0, 2.0])) == 6.0


def test_branching_on_number_is_silent_unless_strict():
    # issue 12, item 12: a branch on .number records no guard
    def f(v):
        return v[0] if v[0].number > 0 else -v[0]
    F = ad.record(f, [1.0])
    assert F(np.array([-2.0])) == -2.0                      # the recorded branch, silently
    np.testing.assert_array_equal(F.gradient(np.array([-2.0])), [1.0])
    with pytest.raises(RuntimeError, match=r"test_replay.py:\d+ reads .number of a "
                                           r"recorded variable.*strict=True"):
        ad.record(f, [1.0], strict=True)
    G = ad.record(lambda v: v[0] if v[0] > 0 else -v[0], [1.0], strict=True)   # a guard
    with pytest.raises(ad.BranchChangedError):
        G(np.array([-2.0]))
    wrong_sin = ad.define("strict_sin", np.sin, np.cos)     # easyad's own reads are allowed
    H = ad.record(lambda v: wrong_sin(v[0]) * v[0], [1.0], strict=True)
    np.testing.assert_allclose(H.gradient(np.array([0.5])), [np.cos(0.5) * 0.5 + np.sin(0.5)])
    lst = ad.WengertList()
    assert lst.variable(2.0).number == 2.0                   # outside ad.record: a float
