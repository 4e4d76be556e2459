"""Every Hessian route gives the same numbers, on the first call and every later one.

A recorded Function has several ways to a Hessian: forward-over-reverse sweeps in the VM
(one point, sparse recovery in C; batches; dense blocks), the second-order program
(``compiler.tape.second_order_program``, replayed by the VM or compiled, also behind
``sparse=True``, ``out=`` and ``bind_hessian``), the compiled sweeps
(``compile(hessian=True)``), ``hvp``, and the functional ``ad.hessian`` / ``ad.hvp``.
Random scalar programs over every rule of the table (and selects, abs, maximum, minimum,
pow with constants of both signs) are run through all of them at ordinary points and at
extreme ones (1e150, 1e-150, +-0, near overflow): the routes must agree exactly (NaN and
infinities in the same places, the same finite numbers: they do the same operations in
the same order), and at ordinary points match finite differences of the gradient.
"""
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
_POSITIVE = ("log", "log2", "log10", "sqrt", "acosh", "log1p", "cbrt", "gammaln", "digamma")
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
    if name == "logit":
        return ad.tanh(u) * 0.4 + 0.5
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
        if name == "polygamma":     # an integer order (the value is flat in it)
            return function(2.0, w * w + 0.5)
        if name in ("xlogy", "xlog1py"):
            return function(u, w * w + 0.5 - (name == "xlog1py"))
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
    if not isinstance(first, type):
        assert same(first, first.T), first       # symmetric, at every point
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
    for _trial in range(3):
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
                # (differences see a stop_gradient's value move, the derivative must not)
                stopped = any(step[0] == "stop_gradient" for step in steps)
                if number < len(ORDINARY) and not isinstance(H, type) and \
                        np.isfinite(H).all() and not stopped:
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
                        assert same(G.hvp(np.stack([x, x]), np.stack([v, -v]))[0], product)


def _quiet():
    context = warnings.catch_warnings()
    context.__enter__()
    warnings.simplefilter("ignore", RuntimeWarning)
    return context


@pytest.mark.parametrize("seed", range(3))
def test_compiled_hessian_and_hvp_agree_with_the_vm(seed):
    """compile(hessian=True): the second-order program and the sweeps compiled; its
    Hessian, bound Hessian and HVP are the VM's numbers, at ordinary and extreme points."""
    rng = np.random.default_rng(seed)
    names = [n for n in RULE_NAMES if n not in ("select", "abs", "maximum", "minimum")]
    steps = random_program(rng, names[rng.integers(len(names))], N)
    F, f = _recorded(steps, ORDINARY[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ad.CompilerWarning)
        C = _recorded(steps, ORDINARY[0])[0].compile(hessian=True)
    if not C.compiled:
        pytest.skip("no C compiler")
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for x in ORDINARY + EXTREME:
            expected = outcome(lambda: F.hessian(x))
            agree([("VM", expected)] + routes(C, f, x))
            for j in range(N):
                v = np.eye(N)[j] * 0.5 - 0.25
                compiled, vm = outcome(lambda: C.hvp(x, v)), outcome(lambda: F.hvp(x, v))
                assert compiled is vm if isinstance(vm, type) else same(compiled, vm)


def test_linear_and_constant_functions_have_zero_hessians_by_every_route():
    """No second-order program has a nonzero to compute: every route gives zeros (the
    second call, bind_hessian and compile(hessian=True) raised "a Function needs at least
    one output")."""
    x = np.array([1.0, 2.0])
    for f in (lambda x: 3.0 * x[0] + x[1], lambda x: x[0] * 0.0 + 2.0, lambda x: -x[1]):
        F = ad.record(f, x)
        for _ in range(3):
            assert same(F.hessian(x), np.zeros((2, 2)))
        assert same(F.hessian(np.stack([x, x])), np.zeros((2, 2, 2)))
        assert same(F.hvp(x, np.ones(2)), np.zeros(2))
        h = np.full(len(F.hessian_pattern()[0]), np.nan)
        F.bind_hessian(x, h)()
        assert same(h, np.zeros(len(h)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ad.CompilerWarning)
            G = ad.record(f, x).compile(hessian=True)
        assert same(G.hessian(x), np.zeros((2, 2)))
        assert same(G.hessian(x), np.zeros((2, 2)))
        assert same(ad.hessian(f)(x), np.zeros((2, 2)))


@pytest.mark.parametrize("base", [-2.0, -0.5, 0.0])
def test_constant_base_of_either_sign(base):
    """c ** x with c <= 0 (log(c) in the exponent's partial is NaN or -inf, which the
    second-order program folded to nothing, then raised TapeFormatError): every call
    gives the sweeps' numbers."""
    def f(x):
        return base ** x[0] + x[1] ** 3 * x[0]
    x = np.array([2.0, 1.5])
    F = ad.record(f, x)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        agree(routes(F, f, x) + [("later", F.hessian(x))])
        H = F.hessian(x)
    # the entries that do not go through log(c): by hand
    assert H[1, 1] == 6.0 * 1.5 * 2.0 and H[0, 1] == H[1, 0] == 3.0 * 1.5 ** 2


def test_optimise_keeps_comparisons_of_variables_that_are_not_inputs():
    """A guard or select comparing a variable made inside f (not an input, so a constant
    of the optimised program) no longer makes compile(optimise=True) raise
    TapeFormatError; values and gradients stay the VM's."""
    def f(x):
        w = x[0].tape.variable(2.0)          # not an input of the Function
        u = x[1].tape.variable(3.0)
        z = x[0] * x[1]
        if w < u:                            # a guard of two constants: never changes
            z = z + x[0]
        if w > x[0]:                         # a guard with the constant first
            z = z * 2.0
        return ad.where(w < x[1], z, -z)     # a select whose comparison reads w first
    x = np.array([1.0, 4.0])
    F = ad.record(f, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ad.CompilerWarning)
        C = ad.record(f, x).compile(optimise=True)
    for point in (x, np.array([1.5, 5.0]), np.array([0.5, 2.5])):
        assert F(point) == C(point)
        assert np.allclose(F.gradient(point), C.gradient(point), rtol=1e-15, atol=0)
        assert C(point) == f_plain(point)
    with pytest.raises(BranchChangedError):
        C(np.array([3.0, 5.0]))              # w > x[0] changes: the VM reports it


def f_plain(x):
    z = x[0] * x[1] + x[0]
    z = z * 2.0
    return z if 2.0 < x[1] else -z


@pytest.mark.parametrize("x", [0.3, 1.0, -2.0])
def test_hessians_of_atan2_and_hypot_with_a_constant_first(x):
    """atan2(0.5, x) and hypot(0.5, x) on arrays of Records (an AttributeError: numpy's
    object ufunc asked the float 0.5 for .arctan2) and of one number (H of shape (1, 1)
    made float() fail): against the derivatives by hand."""
    atan2 = x / (0.25 + x * x) ** 2
    hypot = 0.25 / (0.25 + x * x) ** 1.5
    assert np.isclose(ad.hessian(lambda t: ad.atan2(0.5, t))(x), atan2, rtol=1e-14)
    assert np.isclose(ad.hessian(lambda t: ad.hypot(0.5, t))(x), hypot, rtol=1e-14)
    assert np.isclose(ad.hvp(lambda t: ad.atan2(0.5, t), x, 2.0), 2.0 * atan2, rtol=1e-14)
    points = np.array([x, 2.0 * x])
    H = ad.hessian(lambda t: ad.sum(ad.atan2(0.5, t)) + ad.sum(ad.hypot(0.5, t)))(points)
    expected = [p / (0.25 + p * p) ** 2 + 0.25 / (0.25 + p * p) ** 1.5 for p in points]
    assert np.allclose(H, np.diag(expected), rtol=1e-14, atol=0)
    assert ad.atan2(0.5, np.array([1.0])).dtype == np.float64     # plain arrays: numpy's


def test_large_magnitudes_give_one_symmetric_hessian():
    """Near overflow the two sweeps of H[r, c] and H[c, r] round differently (one gave
    inf, the other a number): every route takes the upper triangle, computed alike."""
    steps = [("asinh", 0, 0, -1.5), ("abs", 2, 0, -1.5), ("pow_const_exponent", 0, 0, 2.0),
             ("tan", 4, 4, 3.0), ("abs", 6, 3, -0.5), ("atan2", 1, 5, 3.0),
             ("expm1", 0, 1, 2.0)]
    x = np.array([1.7e308, 1.0, -1.7e308])
    F, f = _recorded(steps, ORDINARY[0])
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        results = routes(F, f, x)
        agree(results)
        H = results[0][1]
    assert np.isinf(H[0, 0]) and same(H, H.T)


TENSOR_PROGRAMS = 4


@pytest.mark.parametrize("seed", range(TENSOR_PROGRAMS))
def test_tensor_function_agrees_with_the_scalar_routes(seed):
    """TensorFunction.hessian (reverse over reverse, another order of operations) matches
    the scalar routes to rounding at ordinary points; its value is the same number by
    every method (call, value_and_gradient, batches)."""
    rng = np.random.default_rng(100 + seed)
    steps = random_program(rng, RULE_NAMES[rng.integers(len(RULE_NAMES))], N)
    F, f = _recorded(steps, ORDINARY[0])
    T = ad.record(f, ORDINARY[0], tensor=True)
    for x in ORDINARY:
        H = F.hessian(x)
        tolerance = 1e-12 * (1 + np.nanmax(np.abs(H)))
        assert np.allclose(T.hessian(x), H, rtol=1e-12, atol=tolerance, equal_nan=True)
        # ad.hessian / ad.hvp of a structure: the graph route (reverse over reverse)
        on_tensors = lambda p: run_program(steps, p["x"], N)     # noqa: E731
        graph = ad.hessian(on_tensors)({"x": x})["x"]["x"]
        assert np.allclose(graph, H, rtol=1e-12, atol=tolerance, equal_nan=True)
        v = np.array([0.3, -1.0, 2.0])
        assert np.allclose(ad.hvp(on_tensors, {"x": x}, {"x": v})["x"], F.hvp(x, v),
                           rtol=1e-12, atol=tolerance, equal_nan=True)
        value = T(x)
        assert value == T.value_and_gradient(x)[0]
        assert T(np.stack([x, x]))[1] == value
        assert T.value_and_gradient(np.stack([x, x]))[0][0] == value


def random_tensor_program(rng):
    """One sum (the output itself, as Rosenbrock's) of elementwise functions of shifted
    slices of x, each slice taken where it is read: loops that the value program and the
    value-and-gradient program cut and merge differently."""
    lo, shift = int(rng.integers(0, 2)), int(rng.integers(1, 3))
    c, weight = float(rng.choice([1.0, -0.5])), float(rng.choice([100.0, -1.5]))
    name = ["sin", "exp", "tanh", "atan", "square"][int(rng.integers(5))]

    def f(x):
        n = len(x) - shift

        def a():
            return x[lo:n]
        b = x[lo + shift:n + shift]
        extra = a() * a() if name == "square" else getattr(ad, name)(a())
        return ad.sum((c - a()) ** 2 + weight * (b - a() ** 2) ** 2 + extra)
    return f


@pytest.mark.parametrize("seed", range(4))
def test_tensor_function_values_are_one_number_by_every_method(seed):
    """T(x), T.value_and_gradient(x)[0] and both batched are bit-identical (they differed
    by 1.8e-12: the two programs' loops summed in other orders), and agree with the
    scalar Function to rounding."""
    rng = np.random.default_rng(seed)
    f = random_tensor_program(rng)
    n = int(rng.choice([13, 100, 257]))
    T = ad.record(f, rng.normal(size=n), tensor=True)
    X = rng.normal(size=(3, n)) * 2.0
    values = T(X)
    pairs = T.value_and_gradient(X)[0]
    for b, x in enumerate(X):
        value = T(x)
        assert value == T.value_and_gradient(x)[0] == values[b] == pairs[b]
    F = ad.record(f, X[0], tensor=False)
    assert np.allclose(F(X), values, rtol=1e-13, atol=0)


def test_negative_constant_base_is_nan_by_the_graph_routes_too():
    """The exponent's partial of (-2) ** x, log(-2) * z, is NaN in the sweeps; the
    create_graph sweeps (ad.hessian of a structure, TensorFunction.hessian, Record
    create_graph) raised "math domain error" there instead."""
    def f(x):
        return (-2.0) ** x[0] * x[1]
    x = np.array([2.0, 1.0])
    expected = ad.record(f, x).hessian(x)
    assert np.isnan(expected[0, 0]) and expected[1, 1] == 0.0
    with np.errstate(all="ignore"):
        assert same(ad.hessian(lambda p: f(p["x"]))({"x": x})["x"]["x"], expected)
        assert same(ad.record(f, x, tensor=True).hessian(x), expected)
        tape = ad.WengertList()
        a, b = tape.variable(2.0), tape.variable(1.0)
        d = ((-2.0) ** a * b).derivatives(create_graph=True)
        assert np.isnan(float(d[a].derivatives()[a]))
    with pytest.raises(ValueError):          # a value, not derivative code: still checked
        ad.log(-2.0)
