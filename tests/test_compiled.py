"""Function.compile(): the recorded program optimised, rendered to C, compiled and cached.

The reference is the replay VM on the same recording. The compiled code calls the same C
functions of the rule table (``_ops.h``, ``_helpers.h``), in the same order, with flags
that change no result (no contraction into FMAs, no reassociation), and hands every point
where a guard flips or an entry fails back to the VM: so results are compared **bit for
bit** (NaN where NaN, and the sign of zeros), not within a tolerance. The optimiser
(constant folding, CSE, exact identities, dead code; ``compile(optimise=True)``) keeps
values bit for bit, but sums adjoints in another order (a shared entry adds its
consumers' adjoints before multiplying by its partials; another layout, another order of
additions), so its gradients and Hessians are compared within 1e-12 relative (plus
1e-12 absolute, for terms that cancel), VM against VM and compiled against VM.
Compiled objects are shared through one temporary cache directory for the module.
"""
import math
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import easyad as ad
from easyad import _rules
from easyad.compiler import tape as tape_compiler
from easyad.compiler.tape import library
from test_replay import random_program, rosenbrock

HAVE_CC = tape_compiler.compiler() is not None
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no C compiler on this machine")


@pytest.fixture(scope="module", autouse=True)
def cache(module_cache):
    return module_cache


def same(a, b):
    """Equal bit for bit where numbers, NaN where NaN, zeros of the same sign."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        return False
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan], b[~nan])
                and np.array_equal(np.signbit(a[~nan]), np.signbit(b[~nan])))


def outcome(call):
    """A call's result, or the type and message of what it raised."""
    try:
        return "ok", call()
    except Exception as error:     # the VM's errors are the reference
        return type(error).__name__, str(error)


def agree(left, right):
    (kind, a), (kind2, b) = left, right
    if kind != kind2:
        return False
    if kind != "ok":
        return a == b
    if isinstance(a, tuple):
        return all(same(x, y) for x, y in zip(a, b))
    return same(a, b)


def compiled(f, x0, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ad.CompilerWarning)
        F = ad.record(f, x0, **options).compile()
    assert F.compiled
    return F


def special_points(n, rng):
    """Ordinary points, then NaN, +-inf, zeros (kinks: abs, maximum's ties) and huge ones."""
    X = list(rng.uniform(-1, 1, (4, n)))
    for value in (np.nan, np.inf, -np.inf, 0.0, -0.0, 1e300, -1e-320):
        x = rng.uniform(-1, 1, n)
        x[rng.integers(n)] = value
        X.append(x)
    X.append(np.zeros(n))
    return np.array(X)


# Every row of the table (the first rows and those after stop_gradient) in the random
# programs. The rows after it first showed values an ulp from the VM's: gcc folded
# tanh(c) and the like, correctly rounded, where a select made an operand a constant on
# one branch (library._NOT_FOLDED); the test below, on seeds where fmin/fmax/xlogy/expit/
# gammaln feed such selects, pins the fix.
FIRST_ROWS = _rules.DIFFERENTIATED_RULES


@needs_cc
def test_libm_of_a_selected_constant_is_the_vms():
    """fmin(x, c) is c on one branch: gcc must not fold tanh(c) there (MPFR rounds it
    correctly; glibc's tanh(0.3603618934763546) is an ulp away from that)."""
    c = 0.3603618934763546

    def f(v):
        m = ad.fmin(2.0 * ad.tanh(v[1]), c)
        return [ad.tanh(m), ad.exp(ad.maximum(v[0], c)), ad.sin(ad.fmax(v[0], c) * 3.0)]
    x = np.array([0.12974652405951614, 0.986383983217785])
    F = ad.record(f, np.array([0.1, 0.2]))
    C = compiled(f, np.array([0.1, 0.2]))
    assert same(np.asarray(F(x)), np.asarray(C(x)))
    assert np.asarray(C(x))[0] == math.tanh(c)      # the run-time libm's value


@needs_cc
@pytest.mark.parametrize("seed", range(8))
def test_random_programs_compiled_equal_the_vm(seed, table=FIRST_ROWS):
    n = 7
    f = random_program(seed, n, table)
    rng = np.random.default_rng(100 + seed)
    x0 = rng.uniform(-1, 1, n)
    F = ad.record(f, x0)
    C = compiled(f, x0)
    X = special_points(n, rng)
    used = 0
    for x in X:
        assert agree(outcome(lambda: F(x)), outcome(lambda: C(x))), x
        assert agree(outcome(lambda: F.gradient(x)), outcome(lambda: C.gradient(x))), x
        assert agree(outcome(lambda: F.value_and_gradient(x)),
                     outcome(lambda: C.value_and_gradient(x))), x
        used += C._native.point(x, True) is not None
    assert used >= 4            # the ordinary points at least ran compiled
    # batches: rows over threads in C; a flagged row sends the whole call to the VM
    Y = rng.uniform(-1, 1, (2000, n))
    assert same(F.gradient(Y), C.gradient(Y)) and same(F(Y), C(Y))
    assert agree(outcome(lambda: F.gradient(X)), outcome(lambda: C.gradient(X)))
    assert agree(outcome(lambda: F(X)), outcome(lambda: C(X)))


@pytest.mark.parametrize("seed", range(8))
def test_the_optimised_program_replays_like_the_recorded_one(seed):
    n = 7
    f = random_program(seed, n, FIRST_ROWS)
    rng = np.random.default_rng(200 + seed)
    x0 = rng.uniform(-1, 1, n)
    F = ad.record(f, x0)
    tape, ins, outs = tape_compiler.optimise(F.tape, F.inputs, F.outputs)
    G = ad.Function(tape, ins, outs)
    assert len(G) <= len(F)
    C = F
    if HAVE_CC:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ad.CompilerWarning)
            C = ad.record(f, x0).compile(optimise=True)
        assert C.compiled
    for x in special_points(n, rng):
        left = outcome(lambda: F.value_and_gradient(x))
        if left[0] != "ok":     # errors are the VM's to report on the recorded tape
            assert agree(left, outcome(lambda: C.value_and_gradient(x)))
            continue
        for H in (G, C):
            value, gradient = H.value_and_gradient(x)
            assert same(value, left[1][0]), x
            close(gradient, left[1][1])
        close(G.hessian(x), F.hessian(x))


def close(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert np.array_equal(np.isnan(a), np.isnan(b))
    finite = np.isfinite(a) & np.isfinite(b)
    np.testing.assert_array_equal(a[~finite & ~np.isnan(a)], b[~finite & ~np.isnan(b)])
    np.testing.assert_allclose(a[finite], b[finite], rtol=1e-12, atol=1e-12)


def test_the_optimiser_folds_shares_and_drops():
    def f(x):
        c = ad.sin(2.0) * 3.0                      # constants: folded
        a = x[0] * x[1] + ad.exp(x[0])
        b = x[0] * x[1] + ad.exp(x[0])             # the same again: shared
        unused = ad.log(x[1] ** 2 + 1.0)           # dead: dropped
        del unused
        return (a * 1.0 - 0.0) / 1.0 + b * c + -(-x[1]) ** 1.0
    F = ad.record(f, [0.3, 0.7])
    tape, ins, outs = tape_compiler.optimise(F.tape, F.inputs, F.outputs)
    G = ad.Function(tape, ins, outs)
    assert len(G) < len(F) - 8, (len(G), len(F))
    for x in ([0.3, 0.7], [-2.0, 5.0], [0.0, -0.0]):
        x = np.array(x)
        close(F.value_and_gradient(x)[1], G.value_and_gradient(x)[1])
        assert F(x) == G(x)


@needs_cc
def test_strong_zero_selects_kinks_and_live_errors():
    def f(x):
        root = ad.where(x[0] > 0, ad.sqrt(x[0]), 0.0)    # sqrt'(0) = inf, not taken: 0
        kink = abs(x[1]) + ad.maximum(x[0], x[1])         # abs'(0) = 0, ties split
        strong = x[2] * ad.log(ad.where(x[2] > 0, x[2], 1.0))
        return root * x[1] + kink + strong + x[0] * 0.0
    F = ad.record(f, [1.0, 2.0, 3.0])
    C = compiled(f, [1.0, 2.0, 3.0])
    for x in ([0.0, 0.0, 0.0], [-1.0, 0.5, -2.0], [4.0, -0.0, 1e-300], [np.inf, 1.0, 2.0],
              [2.0, 2.0, np.nan], [-0.0, -0.0, -0.0]):
        x = np.array(x)
        assert agree(outcome(lambda: F.value_and_gradient(x)),
                     outcome(lambda: C.value_and_gradient(x))), x
    # an error on a live entry: raised (by the VM, to which the point is handed)
    G = compiled(lambda x: ad.log(x[0]) + x[1], [1.0, 1.0])
    with pytest.raises(ValueError, match="math domain error in entry"):
        G.gradient(np.array([-1.0, 1.0]))
    with pytest.raises(ValueError, match="math domain error"):
        G(np.array([[1.0, 1.0], [-1.0, 1.0]]))


@needs_cc
def test_non_finite_values_of_checked_entries_are_the_vms_to_judge(tmp_path, monkeypatch):
    """The C flags every non-finite value of an entry with an error policy, and the VM tells
    an error (raised) from a value of an inf operand (returned): both in a run long enough
    to be a loop and in entries written one by one; the C holds no more than the rule
    functions it calls (not the table's header, nor the sweeps of _ops.h)."""
    monkeypatch.setenv("EASYAD_CACHE_DIR", str(tmp_path))

    def f(x):      # logs of 40 inputs (a loop), then one more log of their sum (one entry)
        logs = [ad.log(x[k]) for k in range(40)]
        return ad.log(sum(logs[1:], logs[0]) + 100.0)
    F = ad.record(f, np.ones(40))
    C = compiled(f, np.ones(40))
    x = np.ones(40)
    x[3] = np.inf                 # log(inf) = inf: a value, not an error
    assert np.isinf(C(x)) and C(x) == F(x)
    assert same(C.gradient(x), F.gradient(x))
    x[3] = -1.0                   # log(-1): a domain error, in the loop
    with pytest.raises(ValueError, match="math domain error in entry"):
        C.gradient(x)
    x[3] = 1e-300                 # log(1e-300) + 100 < 0: the last log's domain error
    with pytest.raises(ValueError, match="math domain error in entry"):
        C(x)
    x[3] = 0.5
    assert same(C.gradient(x), F.gradient(x)) and C(x) == F(x)
    [source] = (tmp_path / "compiled").glob("*.c")
    text = source.read_text()
    # only the rule functions it calls, copied in: no header of the table, no sweeps
    assert "_rule_functions.h\"" not in text and "_ops.h\"" not in text
    assert "easyad_rule_status" not in text and "easyad_sin_value" not in text
    assert "easyad_log_value(double x, double y) {" in text
    assert "easyad_log_d0(double x, double y, double z) {" in text


@needs_cc
def test_branch_guards_are_checked():
    def f(x):
        return x[0] * x[1] if x[0] > x[1] else x[1] - x[0]
    C = compiled(f, [2.0, 1.0])
    assert C.gradient(np.array([3.0, 1.0])).tolist() == [1.0, 3.0]
    with pytest.raises(ad.BranchChangedError):
        C.gradient(np.array([1.0, 3.0]))
    X = np.array([[3.0, 1.0], [1.0, 3.0]])
    np.testing.assert_array_equal(C.gradient(X, on_branch_change="retape"),
                                  [[1.0, 3.0], [-1.0, 1.0]])
    g, mask = C.gradient(X, on_branch_change="mask")
    assert mask.tolist() == [False, True] and np.isnan(g[1]).all()
    M = compiled(f, [2.0, 1.0], on_branch_change="mask")
    g, mask = M.gradient(X)
    assert mask.tolist() == [False, True]
    g, mask = M.gradient(X[:1])       # mask mode with no flagged row: compiled, all False
    assert mask.tolist() == [False] and g.tolist() == [[1.0, 3.0]]


@needs_cc
def test_rosenbrock_batches_and_several_outputs():
    F = ad.record(rosenbrock, np.full(30, 0.5))
    C = compiled(rosenbrock, np.full(30, 0.5))
    X = np.random.default_rng(3).uniform(-2, 2, (5000, 30))   # threads share the rows
    assert same(F.gradient(X), C.gradient(X))
    assert same(F(X), C(X))

    def polar(x):
        return [ad.hypot(x[0], x[1]), ad.atan2(x[1], x[0]), 2.0]
    P = ad.record(polar, [1.0, 1.0])
    Q = compiled(polar, [1.0, 1.0])
    x = np.array([3.0, -4.0])
    assert same(P(x), Q(x)) and same(P.jacobian(x), Q.jacobian(x))   # Jacobian: the VM
    assert same(P(np.array([x, x])), Q(np.array([x, x])))


def test_user_primitives_are_not_compiled():
    square = ad.define("compiled_test_square", lambda t: t * t, lambda t: 2 * t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F = ad.record(lambda x: square(x[0]) + x[1], [1.0, 2.0]).compile()
    assert not F.compiled
    np.testing.assert_array_equal(F.gradient(np.array([3.0, 1.0])), [6.0, 1.0])


def test_without_a_compiler_a_warning_and_the_vm(monkeypatch, tmp_path):
    monkeypatch.setattr(library, "_warned", set())
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    F = ad.record(rosenbrock, np.full(4, 0.5))
    with pytest.warns(ad.CompilerWarning, match="no C compiler found.*Install one"):
        F.compile()
    assert not F.compiled
    x = np.array([0.1, 0.2, 0.3, 0.4])
    np.testing.assert_array_equal(F.gradient(x), ad.record(rosenbrock, x).gradient(x))
    # a compiler that fails: the same warning class, what it said, and the VM
    monkeypatch.setattr(library, "_warned", set())
    broken = tmp_path / "broken-cc"
    broken.write_text("#!/bin/sh\necho 'broken compiler' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    with pytest.warns(ad.CompilerWarning, match="failed.*broken compiler"):
        G = ad.record(rosenbrock, np.full(4, 0.25)).compile()
    assert not G.compiled and G.gradient(x).shape == (4,)


@needs_cc
def test_a_second_process_loads_from_the_cache_without_compiling(tmp_path):
    real = tape_compiler.compiler()
    folder = tmp_path / "bin"
    folder.mkdir()
    wrapper = folder / "easyad-test-cc"
    wrapper.write_text(f"#!/bin/sh\nexec {' '.join(real)} \"$@\"\n")
    wrapper.chmod(0o755)
    marker = tmp_path / "compiler-ran"
    env = dict(os.environ, CC=str(wrapper), EASYAD_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(sys.path))
    script = textwrap.dedent("""
        import sys, warnings, numpy as np, easyad as ad
        warnings.simplefilter("error", ad.CompilerWarning)
        f = lambda x: sum(ad.sin(x[i]) * x[i + 1] for i in range(len(x) - 1))
        F = ad.record(f, np.full(6, 0.5)).compile()
        assert F.compiled
        x = np.linspace(-1, 1, 6)
        assert np.array_equal(F.gradient(x), ad.record(f, x).gradient(x))
        print("ok")
    """)

    def run():
        return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=120)

    first = run()
    assert first.stdout.strip() == "ok", first.stderr
    assert len(list((tmp_path / "cache" / "compiled").glob("*.so"))) == 1
    # now the "compiler" only says its version (part of the cache key) as before, and
    # otherwise leaves a mark and fails: the second process must not compile
    wrapper.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && exec {' '.join(real)} "
                       f"--version\ntouch {marker}\nexit 1\n")
    second = run()
    assert second.stdout.strip() == "ok", second.stderr
    assert not marker.exists()


@needs_cc
@pytest.mark.parametrize("f", [
    lambda x: x[0],                                   # an input as the output
    lambda x: 3.0,                                    # a constant output
    lambda x: x[1] * 2.0,                             # an unused input
    lambda x: [x[0], 2.0, x[0] * x[1]],               # several outputs
    lambda x: ad.where(x[0] > 0, x[0], -x[0]) * 0.0 + x[1] ** 2.0,
], ids=["input", "constant", "unused", "several", "select-times-zero"])
def test_edge_programs(f):
    F = ad.record(f, [1.0, 2.0])
    C = compiled(f, [1.0, 2.0])
    X = np.array([[1.0, 2.0], [-3.0, 0.5], [0.0, -0.0], [np.nan, np.inf]])
    for x in X:
        assert same(F(x), C(x))
        if F.scalar:
            assert same(F.gradient(x), C.gradient(x))
    assert same(F(X), C(X))
    assert same(F.jacobian(X), C.jacobian(X))
    if F.scalar:
        assert same(F.gradient(X), C.gradient(X))


# ---- second order compiled (compile(hessian=True)), and the preallocated calls ----

def compiled_second(f, x0, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ad.CompilerWarning)
        F = ad.record(f, x0, **options).compile(hessian=True)
    assert F.compiled and F._native.second_order
    return F


@needs_cc
@pytest.mark.parametrize("seed", range(8))
def test_random_programs_hessians_and_hvps_compiled_equal_the_vm(seed, table=FIRST_ROWS):
    n = 7
    f = random_program(seed, n, table)
    rng = np.random.default_rng(300 + seed)
    x0 = rng.uniform(-1, 1, n)
    F = ad.record(f, x0)
    C = compiled_second(f, x0)
    used = 0
    for x in special_points(n, rng):
        v = rng.normal(size=n)
        assert agree(outcome(lambda: F.hessian(x)), outcome(lambda: C.hessian(x))), x
        assert agree(outcome(lambda: F.hvp(x, v)), outcome(lambda: C.hvp(x, v))), x
        used += C._native.hvp_point(x, v) is not None
    assert used >= 4


def test_second_order_c_is_a_step_per_rule_and_tables_of_rows():
    """compile(hessian=True)'s C stays small, since gcc's time grows with it (a ~340-entry
    program took 12-18 s of gcc as a statement and a K-direction loop per entry): one
    tangent step function per (rule, operands needed), called once per entry, and the
    adjoints' tangents as loops over tables of rows. (That it gives the VM's bits:
    test_random_programs_hessians_and_hvps_compiled_equal_the_vm.)"""
    import re

    from easyad import _core
    n = 7
    F = ad.record(random_program(0, n), np.random.default_rng(300).uniform(-1, 1, n))
    layout = _core._Replayer(F.tape, list(F.inputs), list(F.outputs))._layout()
    source = tape_compiler.render(layout, "test", np.eye(n))
    second = source[source.index("/* second order"):]
    hessian = second[:second.index("static EASYAD_CUT void hvp0(")]
    defined = re.findall(r"void (hessian_t\d+_\d)\(", hessian)
    called = re.findall(r"^    (hessian_t\d+_\d)\(dv \+ \d+, p0 \+ \d+, ", hessian, re.M)
    assert len(defined) == len(set(defined)) >= 10 and set(called) == set(defined)
    assert len(called) >= 150                     # the entries: a call each
    assert len(re.findall(r"static const int32_t R\d+\[", hessian)) >= 1
    # K-direction loops: a few per step function and table, not one per entry
    loops = hessian.count(f"for (k = 0; k < {n}; k++)")
    assert loops <= len(defined) + 3 * hessian.count("static const int32_t R") + 2 * n + 40
    assert len(second) < 150_000


@needs_cc
@pytest.mark.parametrize("n", [2, 10, 40])
def test_rosenbrock_hessians_sparse_and_dense_compiled(n):
    x = np.random.default_rng(n).uniform(-2, 2, n)
    F = ad.record(rosenbrock, np.full(n, 0.5))
    C = compiled_second(rosenbrock, np.full(n, 0.5))
    assert same(F.hessian(x), C.hessian(x)) and same(F.hvp(x, x), C.hvp(x, x))
    # ran compiled: the second-order program (the compiled sweeps keep the HVP)
    second = C._second()
    assert second[1] is not None and second[1].second_point(x, second[4], None, None) \
        is not None

    def dense(x):                      # every pair interacts: no colouring, identity seeds
        s = sum(x[i] for i in range(len(x)))
        return ad.exp(s * 0.1) + s * s * x[0]
    D = ad.record(dense, np.full(5, 0.5))
    E = compiled_second(dense, np.full(5, 0.5))
    y = np.linspace(-1, 1, 5)
    assert same(D.hessian(y), E.hessian(y)) and same(D.hvp(y, y), E.hvp(y, y))


@needs_cc
def test_second_order_guards_selects_strong_zero_and_errors():
    def f(x):
        root = ad.where(x[0] > 0, ad.sqrt(x[0]), 0.0) * x[1]
        kink = abs(x[1]) * x[2] + ad.maximum(x[0], x[1]) ** 2
        return root + kink + x[2] * ad.log(ad.where(x[2] > 0, x[2], 1.0))
    F = ad.record(f, [1.0, 2.0, 3.0])
    C = compiled_second(f, [1.0, 2.0, 3.0])
    for x in ([0.0, 0.0, 0.0], [-1.0, 0.5, -2.0], [4.0, -0.0, 1e-300], [np.inf, 1.0, 2.0],
              [2.0, 2.0, np.nan], [-0.0, -0.0, -0.0], [1.0, 2.0, 3.0]):
        x = np.array(x)
        v = np.array([1.0, -2.0, 0.5])
        assert agree(outcome(lambda: F.hessian(x)), outcome(lambda: C.hessian(x))), x
        assert agree(outcome(lambda: F.hvp(x, v)), outcome(lambda: C.hvp(x, v))), x

    def g(x):
        return x[0] * x[1] ** 2 if x[0] > x[1] else ad.log(x[1] - x[0])
    G = compiled_second(g, [2.0, 1.0])
    assert same(G.hessian(np.array([3.0, 1.0])), [[0.0, 2.0], [2.0, 6.0]])
    with pytest.raises(ad.BranchChangedError):
        G.hessian(np.array([1.0, 3.0]))
    with pytest.raises(ad.BranchChangedError):
        G.hvp(np.array([1.0, 3.0]), np.array([1.0, 0.0]))
    L = compiled_second(lambda x: ad.log(x[0]) * x[1], [1.0, 1.0])
    with pytest.raises(ValueError, match="math domain error"):
        L.hessian(np.array([-1.0, 1.0]))


@needs_cc
def test_gradient_into_a_preallocated_array_and_bound_calls():
    F = ad.record(rosenbrock, np.full(10, 0.5))
    C = compiled(rosenbrock, np.full(10, 0.5))
    rng = np.random.default_rng(5)
    x, g, value = rng.uniform(-2, 2, 10), np.empty(10), np.empty(1)
    assert C.gradient(x, out=g) is g and same(g, F.gradient(x))
    assert F.gradient(x, out=np.empty(10)).tolist() == g.tolist()     # the VM: same
    for H in (C, F):                   # compiled, and the VM through the fallback
        call = H.bind_gradient(x, g, value)
        for _ in range(3):
            x[:] = rng.uniform(-2, 2, 10)
            assert call() is None
            assert same(g, F.gradient(x)) and value[0] == F(x)
    with pytest.raises(ValueError, match="share memory"):
        C.bind_gradient(x, x)
    with pytest.raises(ValueError, match="C-contiguous float64"):
        C.bind_gradient(x, np.empty(9))
    with pytest.raises(ValueError, match="C-contiguous float64"):
        C.bind_gradient(x.astype(np.float32), g)

    def f(x):
        return x[0] * x[1] if x[0] > x[1] else x[1] - x[0]
    B = compiled(f, [2.0, 1.0])
    x, g = np.array([3.0, 1.0]), np.empty(2)
    call = B.bind_gradient(x, g)
    call()
    assert g.tolist() == [1.0, 3.0]
    x[:] = [1.0, 3.0]
    with pytest.raises(ad.BranchChangedError):          # flagged: the VM raises
        call()
    R = compiled(f, [2.0, 1.0], on_branch_change="retape")
    call = R.bind_gradient(x, g)
    call()
    assert g.tolist() == [-1.0, 1.0]


def test_prelude_copies_the_rule_functions_called_and_falls_back_to_the_headers():
    from easyad.compiler.tape import prelude as P
    body = "static int fwd0(double* v) { v[1] = easyad_sin_value(v[0], 0.0); return 0; }\n"
    text = P.prelude(body)
    assert "easyad_sin_value(double x, double y) {" in text and "double sin(double);" in text
    assert "easyad_cos_value" not in text and "easyad_sin_d0" not in text
    assert "_rule_functions.h" not in text.split("#else")[0]
    # _helpers.h's functions only where reached (through macros and each other)
    assert "easyad_fn_digamma(" not in text and "easyad_fn_hypot(" not in text
    deep = P.prelude(body.replace("easyad_sin_value(v[0], 0.0)", "polygamma(2.0, v[0])"))
    for name in ("easyad_fn_polygamma(", "easyad_hurwitz(", "easyad_cotpi(",
                 "easyad_fn_digamma(", "easyad_fn_pow("):
        assert name in deep
    assert "easyad_fn_logit(" not in deep and "easyad_fn_mul0(" not in deep
    # a name nothing here declares (a new rule's libm function): the headers themselves
    assert P.prelude(body.replace("easyad_sin_value", "j0")) == P.HEADERS


def test_libm_is_one_table_read_by_the_prelude_the_flags_and_the_vector_math():
    from easyad.compiler import libm
    from easyad.compiler.program import cstyle
    from easyad.compiler.tape import library
    from easyad.compiler.tape import prelude as P
    assert P.DECLARED is libm.DECLARED
    names = [f.name for f in libm.FUNCTIONS]
    assert len(names) == len(set(names))
    flags = {f[len("-fno-builtin-"):] for f in library._FLAGS if f.startswith("-fno-builtin-")}
    # IEEE 754 rounds these exactly (or they are exact): the compiler may fold them
    exact = set("sqrt fabs floor ceil trunc round fmod copysign fmax fmin fma ldexp "
                "frexp".split())
    assert flags == set(names) - exact == set(libm.NOT_FOLDED)
    assert {"tanh", "pow", "lgamma", "atan2"} <= flags
    # libmvec's functions are libm's, none of them exact
    assert set(cstyle.libmvec_functions()) <= set(libm.NOT_FOLDED)
    assert set(libm._LIBMVEC_2_22 + libm._LIBMVEC_2_35) <= set(libm.NOT_FOLDED)


@needs_cc
def test_prelude_declarations_are_maths_and_the_code_is_the_same(tmp_path, monkeypatch):
    """The declarations in place of <math.h> agree with it (gcc refuses conflicting types),
    every function of the rule table is covered (no fallback), and a program compiled
    with the prelude is the same assembly as with the headers."""
    import re

    from easyad import _core, _rules
    from easyad.compiler.tape import prelude as P
    from easyad.compiler.tape import renderer
    cc = tape_compiler.compiler()
    every = "".join(f"double f_{r.name}_{kind}(double x) {{ return "
                    f"easyad_{r.name}_{kind}(x, x{', x' * (kind != 'value')}"
                    f"{', x, x, x' * kind.startswith('t')}); }}\n"
                    for r in _rules.RULES for kind in ("value", "d0", "t0")
                    if not (kind == "t0" and r.name in ("stop_gradient",)))
    text = P.prelude(every)
    assert text != P.HEADERS
    decl = tmp_path / "decl.c"
    # <math.h>, then the prelude's declarations of the same functions (its macros are
    # glibc's spelling, redefined here without a warning only where spelled alike)
    decl.write_text("#include <math.h>\n#undef isnan\n#undef isinf\n#undef isfinite\n"
                    "#undef NAN\n#undef INFINITY\n" + "\n".join(P.DECLARED.values()) + "\n"
                    + text + every)
    done = subprocess.run([*cc, "-fsyntax-only", "-std=gnu99", "-Werror", str(decl)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    n = 7
    F = ad.record(random_program(2, n), np.random.default_rng(302).uniform(-1, 1, n))
    layout = _core._Replayer(F.tape, list(F.inputs), list(F.outputs))._layout()
    mine = renderer.render(layout, "t")
    monkeypatch.setattr(renderer, "prelude", lambda body: P.HEADERS)
    headers = renderer.render(layout, "t")
    assert P.HEADERS not in mine and P.HEADERS in headers
    folder = os.path.dirname(ad.__file__)
    assembly = []
    for name, text in (("mine.c", mine), ("headers.c", headers)):
        (tmp_path / name).write_text(text)
        done = subprocess.run([*cc, "-O3", "-S", "-std=gnu99", "-w", "-ffp-contract=off",
                               "-fno-math-errno", "-fno-trapping-math", f"-I{folder}",
                               f"-I{os.path.join(folder, '_generated')}", name, "-o", "-"],
                              cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        # function labels count the functions parsed (the headers have more)
        assembly.append([re.sub(r"\.LF[BE]\d+", ".LF", x)
                         for x in done.stdout.splitlines() if ".file" not in x])
    assert len(assembly[0]) > 500 and assembly[0] == assembly[1]
