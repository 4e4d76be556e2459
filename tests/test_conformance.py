"""Conformance: every row of the rule table through every engine (issue 25 item 4).

The machinery is in ``tests/_conformance.py`` (sample points, engines, checkers); this
file runs it over ``_rules.RULES`` (never a hand list), and over the reductions and
selections several engines implement (sum, amax/amin, maximum/minimum, where), and shows
that the checker catches the fused max bug when it is put back on purpose.

Cost: each tensor engine runs one program of every rule per device and dtype (PoCL and gcc
build once). The longer sweep (more points, seeds, shapes): benchmarks/stress_conformance.py.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import easyad as ad
from easyad import _rules

from conftest import _NO_OPENCL, OPENCL
from _conformance import (FLOAT32_FORM_ULPS, RTOL, Result, check_derivatives,
                          check_scalar, check_selections, check_tensor, selection_engines,
                          selection_points, disagreements, eager_tensors, float32_ulps,
                          recorded_tensors, replay_engine, samples, scalar_engine,
                          trace_tensors)

RULES = _rules.DIFFERENTIATED_RULES     # stop_gradient: tests/test_stop_gradient.py
IDS = [r.name for r in RULES]
TABLE = {r.name: samples(r) for r in RULES}


def _compiler_works() -> bool:
    F = ad.record(lambda v: v[0] * 2.0, np.array([1.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ad.CompilerWarning)
        return F.compile().compiled


@pytest.fixture(scope="module")
def scalar_results(module_cache):
    """Per rule: Trace, Record, the replay VM and (with a compiler) its compiled C."""
    engines = {"Trace": scalar_engine("trace"), "Record": scalar_engine("record"),
               "VM": replay_engine(False)}
    if _compiler_works():
        engines["compiled"] = replay_engine(True)
    return {r.name: {name: run(r, TABLE[r.name]) for name, run in engines.items()}
            for r in RULES}


@pytest.fixture(scope="module")
def numpy_results(module_cache):
    """Per dtype, per rule, per engine on the numpy device (the fused C compiled once per
    dtype for every rule)."""
    out = {}
    for dtype in (np.float64, np.float32):
        engines = {"eager": eager_tensors(TABLE, "numpy", dtype),
                   "eager strided": eager_tensors(TABLE, "numpy", dtype, "strided"),
                   "eager big-endian": eager_tensors(TABLE, "numpy", dtype, "big-endian"),
                   "TraceTensor": trace_tensors(TABLE, "numpy", dtype),
                   "fused C": recorded_tensors(TABLE, "numpy", dtype, True),
                   "fused C big-endian": recorded_tensors(TABLE, "numpy", dtype, True,
                                                          "big-endian"),
                   "unfused replay": recorded_tensors(TABLE, "numpy", dtype, False,
                                                      "strided")}
        out[np.dtype(dtype)] = {r.name: {e: res[r.name] for e, res in engines.items()}
                                for r in RULES}
    return out


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_scalar_engines_conform(rule, scalar_results):
    """Trace, Record, the VM and compiled C: the points Python's floats raise at raise the
    same exception, values are Python's, the VM's values are the recording's bit for bit,
    compiled C is the VM bit for bit, every derivative is the Trace's."""
    lines = check_scalar(rule, TABLE[rule.name], scalar_results[rule.name])
    assert not lines, "\n".join(lines)


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_derivatives_match_references(rule, scalar_results):
    """The Trace's derivatives (first, and second through NestedTrace) against sympy's,
    central differences and torch's autograd (ordinary points and ties)."""
    lines = check_derivatives(rule, TABLE[rule.name], scalar_results[rule.name]["Trace"])
    assert not lines, "\n".join(lines)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_numpy_tensor_engines_conform(rule, dtype, numpy_results, scalar_results):
    """Eager tensors (contiguous, strided, big-endian inputs), TraceTensor, the fused C and
    the unfused replay on the numpy device, float64 and float32."""
    results = numpy_results[np.dtype(dtype)][rule.name]
    s = TABLE[rule.name]
    lines = check_tensor(rule, s, dtype, results, scalar_results[rule.name]["Trace"],
                         "eager")
    # the same numbers in another layout: the same bits (one input normalisation)
    for same, base in (("eager strided", "eager"), ("eager big-endian", "eager"),
                       ("fused C big-endian", "fused C")):
        for a, b in zip((results[same].values, *results[same].grads),
                        (results[base].values, *results[base].grads)):
            lines += disagreements(a, b, 0, f"{rule.name} {same} vs {base}", s.xs)
    assert not lines, "\n".join(lines)


@pytest.mark.parametrize("rule", [r for r in RULES if r.float32],
                         ids=[r.name for r in RULES if r.float32])
def test_float32_forms_conform(rule, numpy_results):
    """Rows with float32 forms: every float32 engine on the numpy device (the fused C
    computes them in float) against eager numpy, in ulps (``FLOAT32_FORM_ULPS``) at the
    rule's sample points: ordinary values, ±0, ±inf, NaN, tiny and huge magnitudes."""
    results = numpy_results[np.dtype(np.float32)][rule.name]
    base = results["eager"]
    lines = []
    for name, res in results.items():
        for kind, got, want in (("value", res.values, base.values),
                                *(("gradient", g, b) for g, b in zip(res.grads, base.grads))):
            d = float32_ulps(got, want)
            if d.max() > FLOAT32_FORM_ULPS[kind]:
                k = int(d.argmax())
                lines.append(f"{rule.name} {name} {kind}: {d.max():.3g} ulps from eager at "
                             f"x = {TABLE[rule.name].xs[0][k]!r} ({got[k]!r} vs {want[k]!r})")
    assert not lines, "\n".join(lines)


@pytest.fixture(scope="module", params=OPENCL or [pytest.param("opencl", marks=_NO_OPENCL)])
def opencl_results(request, module_cache):
    """Per dtype, per rule: eager OpenCL tensors and the fused OpenCL kernels, on each
    working OpenCL device (conftest's list; module-scoped: one build per program)."""
    opencl_device = request.param
    out = {}
    for dtype in (np.float64, np.float32):
        engines = {"eager OpenCL": eager_tensors(TABLE, opencl_device, dtype),
                   "fused OpenCL": recorded_tensors(TABLE, opencl_device, dtype, True,
                                                    "big-endian")}
        out[np.dtype(dtype)] = {r.name: {e: res[r.name] for e, res in engines.items()}
                                for r in RULES}
    return out


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_opencl_engines_conform(dtype, opencl_results, numpy_results, scalar_results):
    """Eager OpenCL tensors and the fused OpenCL kernels (big-endian inputs) against the
    eager numpy tensor, every rule (one test: the device's programs hold every rule)."""
    lines = []
    for rule in RULES:
        results = {"eager": numpy_results[np.dtype(dtype)][rule.name]["eager"],
                   **opencl_results[np.dtype(dtype)][rule.name]}
        lines += check_tensor(rule, TABLE[rule.name], dtype, results,
                              scalar_results[rule.name]["Trace"], "eager")
    assert not lines, "\n".join(lines)


# ---- reductions and selections ----

@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_selections_conform_on_numpy(dtype, rng, module_cache):
    """sum, amax/amin, maximum/minimum, where, abs over exp values, with ties, near-ties,
    ±0 and inf: the fused C and the unfused replay pick the elements eager execution
    picks (same zeros in the gradient) and agree to rounding."""
    x = selection_points(rng)
    with np.errstate(all="ignore"):
        lines = check_selections(x, selection_engines(x * 0.5, "numpy", dtype),
                                 rtol=RTOL[np.dtype(dtype)])
    assert not lines, "\n".join(lines)


def test_selections_conform_on_opencl(opencl_device, rng):
    """The same on OpenCL (float64): eager kernels and the fused OpenCL program."""
    x = selection_points(rng)
    engines = selection_engines(x * 0.5, opencl_device)
    engines["numpy eager"] = selection_engines(x * 0.5)["eager"]
    del engines["unfused"]
    with np.errstate(all="ignore"):
        lines = check_selections(x, engines, reference="numpy eager")
    assert not lines, "\n".join(lines)


def _recomputing_compared_values(monkeypatch):
    """Put the fused max bug back on purpose: the fused C's backward loop compares a
    recomputed operand that rounds one ulp away from the value the max was taken over
    (what glibc's vector exp did to the forward loop's scalar exp). The injection is
    the compared operand ``x`` of every ``x == m`` a fused map renders, through
    ``Plan.map_tree`` (test-only monkeypatch; nothing in easyad changes)."""
    from easyad import _expr
    from easyad.compiler.program import plan

    original = plan.Plan.map_tree

    def rounded_apart(node):
        if isinstance(node, _expr.Bin) and node.op == "==" and \
                isinstance(node.left, _expr.Var) and isinstance(node.right, _expr.Var):
            return _expr.Bin("==", _expr.Call("nextafter", (node.left, _expr.Num(0.0))),
                             node.right)
        if isinstance(node, _expr.Bin):
            return _expr.Bin(node.op, rounded_apart(node.left), rounded_apart(node.right))
        if isinstance(node, _expr.Call):
            return _expr.Call(node.name, tuple(rounded_apart(a) for a in node.args))
        if isinstance(node, _expr.Neg):
            return _expr.Neg(rounded_apart(node.operand))
        return node

    monkeypatch.setattr(plan.Plan, "map_tree",
                        lambda self, ins, k: rounded_apart(original(self, ins, k)))


def test_checker_catches_the_fused_max_bug(rng, monkeypatch, module_cache):
    """The suite's selection checker must report a fused kernel that recomputes the values
    a max compares and loses the gradient of the chosen elements."""
    if not _compiler_works():
        pytest.skip("no C compiler: the fused C program is not built")
    x = selection_points(rng)
    with np.errstate(all="ignore"):
        assert check_selections(x, selection_engines(x * 0.5)) == []   # as shipped
        _recomputing_compared_values(monkeypatch)
        lines = check_selections(x, selection_engines(x * 0.5))
    # only the fused engine is reported, and for gradients (the values are right)
    assert lines and all(line.startswith("selections fused gradient") for line in lines), \
        lines


def test_checker_catches_a_swapped_tie_rule(monkeypatch, module_cache):
    """Another wrong engine: the fused C's heaviside at a tie gives 1 (not the table's
    1/2), so maximum/minimum at ties hand the whole derivative to both sides. The rule
    table check (check_tensor) reports it for maximum and minimum, at ties only."""
    if not _compiler_works():
        pytest.skip("no C compiler: the fused C program is not built")
    from easyad.compiler.program import fused_c
    header = fused_c.c_header
    monkeypatch.setattr(fused_c, "c_header", lambda: header() + [
        "#undef heaviside", "#define heaviside(t) ((t) >= 0.0 ? 1.0 : 0.0)"])
    table = {name: TABLE[name] for name in ("maximum", "minimum", "mul")}
    with np.errstate(all="ignore"):
        fused = recorded_tensors(table, "numpy", np.float64, True)
        eager = eager_tensors(table, "numpy", np.float64)
    for name, s in table.items():
        rule = _rules.RULES_BY_NAME[name]
        lines = check_tensor(rule, s, np.float64, {"eager": eager[name],
                                                   "fused C": fused[name]},
                             Result(s.xs[0], (), [None] * s.size), "eager")
        if name == "mul":
            assert lines == []
            continue
        assert lines and all("fused C float64 d/d" in line for line in lines), lines
        tied = {(float(a), float(b)) for a, b in zip(*s.xs) if a == b}
        for line in lines:
            if "more points" not in line:
                point = line.split(" at (")[1].split("):")[0]
                a, b = (float(v) for v in point.split(", "))
                assert (a, b) in tied, line


# ---- disagreements found by this suite, fixed ----

def test_replay_raises_the_recordings_pow_error_at_zero_base():
    """Found by this suite: the tape keeps one pow for ``ad.pow`` (math.pow: ValueError)
    and ``**`` (float: ZeroDivisionError), and the replay raised ZeroDivisionError where
    the recording of ``ad.pow`` raised ValueError. Every engine now raises
    ad.PowDomainError, which both spellings' ``except`` clauses catch."""
    F = ad.record(lambda v: ad.pow(v[0], v[1]), np.array([1.0, 2.0]))
    with pytest.raises(ValueError):
        ad.pow(0.0, -1.0)
    with pytest.raises(ValueError):
        F(np.array([0.0, -1.0]))
    G = ad.record(lambda v: v[0] ** v[1], np.array([1.0, 2.0]))
    with pytest.raises(ZeroDivisionError):
        G(np.array([0.0, -1.0]))
    for function in (F, G):
        with pytest.raises(ad.PowDomainError, match=r"pow\(0\.0, -1\.0\) in entry"):
            function.gradient(np.array([0.0, -1.0]))


# functions of three inputs whose partials are exact (no libm rounding), met at signed
# zeros, infinities and NaN-making products: the strong zero decides every zero's sign
_SIGNED_ZERO_FUNCTIONS = {
    "product": lambda a, b, c: a * b * c,
    "quotient": lambda a, b, c: (a * b) / c,
    "minus": lambda a, b, c: -(a * b) + c * 0.0,
    "max": lambda a, b, c: ad.maximum(a, b) * c,
    "sqrt": lambda a, b, c: ad.sqrt(ad.abs(a)) * b - c,
    "pow": lambda a, b, c: ad.pow(ad.abs(a), 0.5) * (b * c),
}
_SIGNED_ZERO_VALUES = [0.0, -0.0, 1.0, -2.0, np.inf, -np.inf]


def test_every_engine_gives_the_strong_zeros_bits(module_cache):
    """The backward sweeps' strong zero is _helpers.h's mul0 (EASYAD_MUL0) in every
    engine: the Record sweep (_engine/tape.pxi), the replay VM (_ops.h's reverse runs),
    compiled C, eager tensors and the fused C program give the same gradient bits at
    signed zeros, infinities and 0 * inf, signs of zeros included (np.signbit)."""
    if not _compiler_works():
        pytest.skip("no C compiler: compiled C and the fused program are not built")
    grid = np.array(np.meshgrid(*[_SIGNED_ZERO_VALUES] * 3)).reshape(3, -1)
    for name, f in _SIGNED_ZERO_FUNCTIONS.items():
        record, ok = np.full(grid.shape, np.nan), np.zeros(grid.shape[1], dtype=bool)
        for p, point in enumerate(grid.T.tolist()):
            lst = ad.WengertList()
            xs = [lst.variable(v) for v in point]
            try:
                d = f(*xs).derivatives()
            except (ValueError, ArithmeticError):
                continue            # Python raises there (1 / 0): the tensors do not
            record[:, p], ok[p] = [d[x] for x in xs], True
        F = ad.record(lambda v, f=f: f(v[0], v[1], v[2]), np.array([1.0, 1.0, 1.0]))
        with warnings.catch_warnings():
            warnings.simplefilter("error", ad.CompilerWarning)
            C = ad.record(lambda v, f=f: f(v[0], v[1], v[2]),
                          np.array([1.0, 1.0, 1.0])).compile()
        lst = ad.WengertList()
        ts = [ad.Tensor.variable(row, lst) for row in grid]
        d = ad.sum(f(*ts)).derivatives()
        T = ad.record(lambda x, f=f: ad.sum(f(x[0], x[1], x[2])), grid, tensor=True)
        engines = {"VM": F.gradient(grid.T[ok]).T, "compiled C": C.gradient(grid.T[ok]).T,
                   "eager tensors": np.array([d[t] for t in ts])[:, ok],
                   "fused C": T.gradient(grid)[:, ok]}
        want = record[:, ok]
        zeros = want == 0.0
        # mul0 makes a zero contribution +0.0 (never p * g's -0.0), and sums start at +0.0
        assert zeros.sum() >= 40 and not np.signbit(want[zeros]).any()
        for engine, got in engines.items():
            np.testing.assert_array_equal(got, want, err_msg=f"{name}: {engine}")
            assert (np.signbit(got[zeros]) == np.signbit(want[zeros])).all(), \
                (name, engine, grid[:, ok][:, zeros.any(axis=0)])


@pytest.mark.parametrize("scale", [1e-300, 1e300, 1.0])
def test_atan2_partials_at_tiny_and_huge_points(scale):
    """Found by this suite: atan2's partials were y/(x*x + y*y), inf at (1e-300, 1e-300)
    (x*x underflows) and 0 at (1e300, 1e300); the true values are ±1/(2 scale)."""
    x, y = ad.Trace.variable(scale), ad.Trace.constant(scale)
    assert ad.atan2(x, y).derivative == pytest.approx(0.5 / scale, rel=1e-15)
    x, y = ad.Trace.constant(scale), ad.Trace.variable(scale)
    assert ad.atan2(x, y).derivative == pytest.approx(-0.5 / scale, rel=1e-15)


def test_fused_opencl_float32_sin_and_cos_in_one_kernel(opencl_device):
    """Found by this suite: a fused float32 kernel calling sin and cos took both from one
    vector sincos even where the device's proof had found vector sin and cos wrong (and
    computes them lane by lane): PyPI's PoCL 3.0 on AVX-512 gave sin(1e-8) = 0.0105 =
    sin(1e-8 * 2**20) there. Now sincos is used only where sin and cos are trusted."""
    table = {name: TABLE[name] for name in ("sin", "cos")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ad.KernelFallbackWarning)
        got = recorded_tensors(table, opencl_device, np.float32, True)
    for name in table:
        x = TABLE[name].xs[0].astype(np.float32)
        with np.errstate(all="ignore"):
            want = getattr(np, name)(x)
        np.testing.assert_allclose(got[name].values, want, rtol=1e-6, equal_nan=True,
                                   err_msg=name)


def test_big_endian_float32_tensors_stay_float32():
    """Found by this suite: a big-endian float32 array (np.dtype(">f4") != float32) made a
    float64 tensor; it is float32 as the native array's, with the same values."""
    a = np.array([0.1, -2.5, 3.0], dtype=">f4")
    t = ad.Tensor.variable(a, ad.WengertList())
    assert t.dtype == np.float32 and t.value.dtype == np.float32
    np.testing.assert_array_equal(t.value, a.astype(np.float32))
    assert ad.TraceTensor.variable(a).dtype == np.float32
    assert ad.Tensor.variable(a.astype(">f8"), ad.WengertList()).dtype == np.float64
