"""Scalar replay (``ad.record`` -> Function) and ``Function.compile()`` on random programs,
against references that share no code with the replay: mpmath's high-precision values
and derivatives of the same program, plain-float evaluation with the math module, forward
mode (Traces), and recording again. The VM and the compiled code are also compared with
each other (bit for bit: the compiled code calls the same C functions in the same order).
Compiled Functions are built once per module, into a temporary cache."""
import warnings

import numpy as np
import pytest

import easyad as ad
from _programs import Program, math_value
from easyad.compiler import tape as tape_compiler

HAVE_CC = tape_compiler.compiler() is not None
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no C compiler on this machine")

SEEDS = range(8)
COMPILED_SEEDS = (0, 1)


def program(seed):
    return Program(seed, n=5, terms=4, width=3, steps=6)


def points(seed, n, count=3):
    return np.random.default_rng(1000 + seed).uniform(-1.5, 1.5, (count, n))


def close(got, want, tol=1e-11):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def forward_gradient(f, x):
    """The gradient by forward mode: one Trace pass per input."""
    return np.array([f([ad.Trace.variable(v) if i == k else ad.Trace.constant(v)
                        for i, v in enumerate(x)]).derivative for k in range(len(x))])


def same_bits(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.fixture(scope="module")
def cache(module_cache):
    return module_cache


@pytest.fixture(scope="module")
def compiled(cache):
    """seed -> (the VM Function, the same recording compiled with its Hessian program)."""
    if not HAVE_CC:
        pytest.skip("no C compiler on this machine")
    out = {}
    for seed in COMPILED_SEEDS:
        p = program(seed)
        x0 = np.random.default_rng(seed).uniform(-1, 1, p.n)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ad.CompilerWarning)
            C = ad.record(p, x0).compile(hessian=True)
        assert C.compiled
        out[seed] = (ad.record(p, x0), C)
    return out


@pytest.fixture(scope="module")
def optimised(cache):
    """(program, VM Function, the same recording optimised and compiled)."""
    if not HAVE_CC:
        pytest.skip("no C compiler on this machine")
    p = program(3)
    x0 = np.random.default_rng(3).uniform(-1, 1, p.n)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ad.CompilerWarning)
        opt = ad.record(p, x0).compile(optimise=True)
    assert opt.compiled
    return p, ad.record(p, x0), opt


@pytest.mark.parametrize("seed", SEEDS)
def test_vm_against_high_precision_references(seed):
    p = program(seed)
    F = ad.record(p, np.random.default_rng(seed).uniform(-1, 1, p.n))
    for x in points(seed, p.n):
        value, gradient, hessian = p.mp_derivatives(x)
        close(F(x), value, 1e-13)
        close(math_value(p, x), value, 1e-13)       # the reference is the program's own
        close(F.gradient(x), gradient)
        v, g = F.value_and_gradient(x)
        close(v, value, 1e-13)
        close(g, gradient)
        close(F.hessian(x), hessian)
        direction = np.random.default_rng(seed).normal(size=p.n)
        close(F.hvp(x, direction), hessian @ direction)


@pytest.mark.parametrize("seed", SEEDS)
def test_vm_against_forward_mode_and_recording_again(seed):
    p = program(seed)
    F = ad.record(p, np.random.default_rng(seed).uniform(-1, 1, p.n))
    for x in points(seed, p.n):
        g = F.gradient(x)
        close(g, forward_gradient(p, x), 1e-13)
        close(g, ad.grad(p)(x), 1e-13)
        close(F.hessian(x), ad.record(p, x).hessian(x), 1e-13)


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_batches_answer_like_single_points(seed):
    p = program(seed)
    F = ad.record(p, np.zeros(p.n))
    X = points(seed, p.n, count=40)
    G, H, V = F.gradient(X), F.hessian(X), F(X)
    assert G.shape == (40, p.n) and H.shape == (40, p.n, p.n) and V.shape == (40,)
    for k in (0, 17, 39):
        assert same_bits(G[k], F.gradient(X[k]))
        assert same_bits(V[k], F(X[k]))
        # one point runs the Hessian's own program from the second call on, a batch the
        # sweeps: equal to rounding, not always bit for bit (Function.hessian says so)
        close(H[k], F.hessian(X[k]), 1e-13)
    close(G[5], p.mp_derivatives(X[5])[1])


@needs_cc
@pytest.mark.parametrize("seed", COMPILED_SEEDS)
def test_compiled_equals_the_vm_and_the_references(seed, compiled):
    F, C = compiled[seed]
    p = program(seed)
    X = points(seed, p.n, count=4)
    F.hessian(X[0])      # one-point Hessians from the second call on: the second-order program
    for x in X:
        assert same_bits(C(x), F(x))
        assert same_bits(C.gradient(x), F.gradient(x))
        assert same_bits(C.hessian(x), F.hessian(x))
        direction = np.linspace(-1.0, 1.0, p.n)
        assert same_bits(C.hvp(x, direction), F.hvp(x, direction))
    value, gradient, hessian = p.mp_derivatives(X[0])
    close(C(X[0]), value, 1e-13)
    close(C.gradient(X[0]), gradient)
    close(C.hessian(X[0]), hessian)
    # a batch: rows over threads in the compiled code
    Y = points(seed + 50, p.n, count=300)
    assert same_bits(C.gradient(Y), F.gradient(Y))
    g = np.empty(p.n)
    C.gradient(X[1], out=g)
    assert same_bits(g, F.gradient(X[1]))


def branching(x, lib=None):
    """A program with a guard: the branch taken depends on x0 > x1."""
    base = program(5)(x, lib)
    if x[0] > x[1]:
        return base + x[2] * x[3]
    return base - x[2] * x[2]


@needs_cc
def test_a_changed_branch_is_handled_alike_by_the_vm_and_the_compiled_code(cache):
    x0 = np.array([0.5, -0.5, 0.3, 0.2, 0.1])
    F = ad.record(branching, x0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ad.CompilerWarning)
        C = ad.record(branching, x0).compile(hessian=True)
    same_branch = np.array([0.9, 0.1, -0.4, 0.7, 1.1])
    other_branch = np.array([-0.2, 0.6, 0.8, -0.3, 0.5])

    def reference(x):
        return Program.mp_derivatives(_Wrapped(branching), x)
    for R in (F, C):
        value, gradient, hessian = reference(same_branch)
        close(R(same_branch), value, 1e-13)
        close(R.gradient(same_branch), gradient)
        close(R.hessian(same_branch), hessian)
        with pytest.raises(ad.BranchChangedError):
            R.gradient(other_branch)
        with pytest.raises(ad.BranchChangedError):
            R.hessian(other_branch)
        value, gradient, hessian = reference(other_branch)
        close(R.gradient(other_branch, on_branch_change="retape"), gradient)
        close(R.hessian(other_branch, on_branch_change="retape"), hessian)
        G, mask = R.gradient(np.stack([same_branch, other_branch]), on_branch_change="mask")
        assert mask.tolist() == [False, True] and np.isnan(G[1]).all()
        close(G[0], reference(same_branch)[1])
    # the recording is unchanged by the calls at the other branch
    assert same_bits(F.gradient(same_branch), C.gradient(same_branch))


class _Wrapped:
    """A plain function in Program's place, for Program.mp_derivatives."""

    def __init__(self, f, n=5):
        self.f, self.n = f, n

    def __call__(self, x, lib=None):
        return self.f(x, lib)


@needs_cc
def test_the_optimised_compiled_program_against_the_references(optimised):
    p, F, opt = optimised
    X = points(3, p.n, count=3)
    for x in X:
        value, gradient, _ = p.mp_derivatives(x)
        # the optimiser keeps values bit for bit; it adds adjoints in another order
        assert same_bits(opt(x), F(x))
        close(opt(x), value, 1e-13)
        close(opt.gradient(x), F.gradient(x), 1e-12)
        close(opt.gradient(x), gradient)
    close(opt.gradient(X), F.gradient(X), 1e-12)


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_a_saved_function_loads_and_replays_the_same(seed, tmp_path):
    p = program(seed)
    F = ad.record(p, np.random.default_rng(seed).uniform(-1, 1, p.n))
    path = tmp_path / "f.npz"
    F.save(path)
    L = ad.load(path)
    assert (L.n_inputs, L.n_outputs, len(L)) == (F.n_inputs, F.n_outputs, len(F))
    X = points(seed, p.n)
    assert same_bits(L.gradient(X), F.gradient(X)) and same_bits(L(X), F(X))
    close(L.hessian(X[0]), p.mp_derivatives(X[0])[2])
