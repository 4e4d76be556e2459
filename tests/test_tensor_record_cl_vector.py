"""The vector loops of fused OpenCL kernels on CPU devices (easyad/compiler/program/render_cl.py):
every rule of the table through a fused kernel, the scalar rest of lengths that are not a
multiple of the width, reductions, float32, bools, against eager execution and against the
scalar kernels (forced with EASYAD_OPENCL_VECTOR=0, or where the vector ones do not
build)."""
from __future__ import annotations

import operator
import warnings

import numpy as np
import pytest

import easyad as ad
from easyad import _rules
from easyad.compiler.program import fused_cl, vector_cl
from easyad.errors import DeviceError

from test_tensor_record import _opencl_usable, close

pytestmark = pytest.mark.skipif(not _opencl_usable(), reason="no usable OpenCL device")

RNG = np.random.default_rng(23)
N = 1003                  # a vector loop and a scalar rest at every width


def _kernels(F, what="gradient"):
    return [step.spec for step in F._bound[what].steps if isinstance(step, fused_cl.Launch)]


def _run(monkeypatch, f, args, setting=None):
    """(value, gradient, F) of f recorded on OpenCL, its fused kernels built under
    EASYAD_OPENCL_VECTOR=setting (None: the device's width)."""
    with monkeypatch.context() as m:
        if setting is None:
            m.delenv(vector_cl.VECTOR_ENV, raising=False)
        else:
            m.setenv(vector_cl.VECTOR_ENV, str(setting))
        F = ad.record(f, *args, device="opencl", tensor=True)
        value, g = F.value_and_gradient(*args)
        if not np.isnan(value):
            close(F(*args), value, 1e-12)
    return value, g, F


def _width(F, dtype=np.float64):
    """The vector width fused kernels of dtype get on this device: the widest that passed
    its proof (0: scalar kernels)."""
    return vector_cl.fused_width(F._backend, "double" if dtype == np.float64 else "float")


def _leaves(tree):
    return ad._trees.flatten(tree)[0]


def _check(monkeypatch, f, args, tol=1e-12):
    """f's fused value and gradient against eager execution (numpy) and against the
    scalar kernels; the vector loops used where the device has them."""
    value, g, F = _run(monkeypatch, f, args)
    ref_value, ref_g = ad.value_and_grad(f)(*args)
    close(value, ref_value, tol)
    for a, b in zip(_leaves(g), _leaves(ref_g)):
        close(a, b, tol)
    s_value, s_g, S = _run(monkeypatch, f, args, 0)
    close(value, s_value, tol)
    for a, b in zip(_leaves(g), _leaves(s_g)):
        close(a, b, tol)
    assert all(k.width == 0 for k in _kernels(S) + _kernels(S, "value"))
    assert "vreal_t" not in S._bound["gradient"].source
    if _width(F):
        assert _width(F) in [k.width for k in _kernels(F)]
        assert _width(F) in [k.width for k in _kernels(F, "value")]
    return F


# points inside each rule's domain, away from where its value or partials blow up
_RANGES = {"tan": (-1.2, 1.2), "asin": (-0.9, 0.9), "acos": (-0.9, 0.9),
           "atanh": (-0.9, 0.9), "acosh": (1.1, 3.0), "log1p": (-0.9, 3.0),
           "sinh": (-3.0, 3.0), "cosh": (-3.0, 3.0), "exp": (-3.0, 3.0), "expm1": (-3.0, 3.0)}


def _points(rule, k=0):
    lo, hi = rule.domain[k]
    lo, hi = _RANGES.get(rule.name, (max(lo, -3.0) + 0.1, min(hi, 3.0)))
    return RNG.uniform(lo, hi, N)


def _unary(rule):
    return operator.neg if rule.name == "neg" else getattr(ad, rule.name)


def _named_check(monkeypatch, f, args, names, tol=1e-12):
    """_check for a program made of one independent part per rule: each rule's gradient
    leaf is compared on its own, and a failure names the rule. (One program for every rule,
    not one per rule: each recording builds its kernels, ~1 s of PoCL's compiler each.)"""
    value, g, F = _run(monkeypatch, f, args)
    ref_value, ref_g = ad.value_and_grad(f)(*args)
    s_value, s_g, S = _run(monkeypatch, f, args, 0)
    close(value, ref_value, tol)
    close(value, s_value, tol)
    for name, a, b, c in zip(names, _leaves(g), _leaves(ref_g), _leaves(s_g)):
        try:
            close(a, b, tol)
            close(a, c, tol)
        except AssertionError as e:
            raise AssertionError(f"rule {name!r} in a fused vector loop: {e}") from None
    return F


def test_every_unary_rule_in_a_vector_loop(monkeypatch):
    rules = [r for r in _rules.UNARY_RULES]
    xs = []
    for rule in rules:
        x = _points(rule)
        if rule.name in ("abs", "neg", "cbrt", "sin", "atan", "erf"):
            x[::7] = 0.0                  # sign(0) = 0: abs's kink, and zero partials
        xs.append(x)

    def f(xs):
        return sum(ad.sum(_unary(r)(x) * x) for r, x in zip(rules, xs))
    _named_check(monkeypatch, f, (tuple(xs),), [r.name for r in rules])


_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
           "div": operator.truediv, "pow": operator.pow}


def test_every_binary_rule_in_a_vector_loop(monkeypatch):
    rules = list(_rules.BINARY_RULES)
    parts = []
    for rule in rules:
        p = {"x": _points(rule, 0), "y": _points(rule, 1)}
        if rule.name == "div":
            p["y"] = np.where(np.abs(p["y"]) < 0.2, 0.5, p["y"])
        if rule.name in ("maximum", "minimum", "hypot", "atan2"):
            p["y"][::5] = p["x"][::5]     # ties: the derivative split
        if rule.name in ("hypot", "mul", "pow"):
            p["x"][::9] = 0.0             # div0 at 0, the strong zero
            p["y"][::9] = 0.0
        if rule.name == "pow":
            p["y"][::4] = 2.0             # exponents the helper does exactly
        parts.append(p)
    ops = [_BINARY.get(r.name) or getattr(ad, r.name) for r in rules]

    def f(parts):
        return sum(ad.sum(op(p["x"], p["y"]) * p["x"]) for op, p in zip(ops, parts))
    # leaves in tree order: each part's "x" then "y"
    _named_check(monkeypatch, f, (tuple(parts),),
                 [f"{r.name} d/{k}" for r in rules for k in ("x", "y")])


_SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, 2.0, -3.0, 0.5, np.inf, -np.inf, np.nan, 1e-310,
                      1e300, -1e300, 710.0, -750.0])


def _special_points_agree(monkeypatch, rules, vectorised):
    parts = []
    for rule in rules:
        xs = [RNG.normal(size=N) * 2 for _ in range(rule.arity)]
        for x in xs:
            x[RNG.choice(N, N // 4, replace=False)] = RNG.choice(_SPECIALS, N // 4)
        parts.append(tuple(xs))
    ops = [(_BINARY.get(r.name) or getattr(ad, r.name)) if r.arity == 2 else _unary(r)
           for r in rules]

    def f(parts):
        return sum(ad.sum(op(*p) * p[0]) for op, p in zip(ops, parts))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _, g, F = _run(monkeypatch, f, (tuple(parts),))
        _, s_g, _ = _run(monkeypatch, f, (tuple(parts),), 0)
    if _width(F) and vectorised:
        assert _width(F) in [k.width for k in _kernels(F)]
    names = [f"{r.name} operand {k}" for r in rules for k in range(r.arity)]
    for name, a, b in zip(names, _leaves(g), _leaves(s_g), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-300, equal_nan=True,
                                   err_msg=f"rule {name}: vector lanes vs scalar kernels")


def test_every_rule_at_special_points_as_the_scalar_kernels(monkeypatch):
    """Zeros, infinities, NaN, huge and subnormal values, out of the domain too, in some
    lanes of a vector: each lane as the scalar kernels compute it (PoCL 3.1's vector pow
    got the other lanes of such a vector wrong: pow is lane by lane). The rules with a
    vector form in one program, each on its own inputs (lanes never mix rules), proven to
    run in vector loops (stop_gradient among them: its value is x; the rows after it call
    _helpers.h functions with no vector builtin, lane by lane: easyad_v_* of
    _kernels.LANEWISE_HELPERS)."""
    _special_points_agree(monkeypatch, list(_rules.RULES), vectorised=True)


def test_the_scipy_rows_keep_the_loop_vector_and_its_bits(monkeypatch):
    """The rows after stop_gradient (erfc... fmax, fmin and their pick) in a fused loop:
    every loop of the program at the device's width (one of them made the whole loop
    scalar before), and each gradient as the scalar kernels' (the helpers run lane by
    lane, the same code; the arithmetic around them is vector code, which the compiler
    may contract otherwise: an ulp or two, as for every row)."""
    first = _rules.RULES.index(_rules.STOP_GRADIENT) + 1
    rules = list(_rules.RULES[first:])
    assert {r.name for r in rules} >= {"erfc", "expit", "logit", "gammaln", "digamma",
                                       "polygamma", "xlogy", "xlog1py", "logaddexp",
                                       "logaddexp2", "copysign", "fmax", "fmin"}
    parts = []
    for rule in rules:
        xs = [_points(rule, k) for k in range(rule.arity)]
        if rule.name in ("fmax", "fmin"):
            xs[1][::5] = xs[0][::5]          # ties: pick's 1/2
            xs[1][::7] = np.nan              # NaN: ignored
        parts.append(tuple(xs))

    def f(parts):
        return sum(ad.sum(getattr(ad, r.name)(*p) * p[-1]) for r, p in zip(rules, parts))
    _, g, F = _run(monkeypatch, f, (tuple(parts),))
    _, s_g, S = _run(monkeypatch, f, (tuple(parts),), 0)
    width = _width(F)
    if not width:
        pytest.skip("this device proved no vector width")
    loops = [k for k in _kernels(F) if k.n >= width]     # (the sum of the parts: 0-d)
    assert loops and all(k.width == width for k in loops), \
        [(k.name, k.n, k.width) for k in _kernels(F)]
    names = [f"{r.name} operand {k}" for r in rules for k in range(r.arity)]
    for name, a, b in zip(names, _leaves(g), _leaves(s_g), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-300, equal_nan=True,
                                   err_msg=f"rule {name}: vector vs scalar kernels")


def test_hvp_through_vector_loops():
    """Second-order sweeps: the tangents' strong zeros (tmul) on vectors."""
    def f(x):
        return ad.sum(ad.sin(x) * ad.exp(-x * x) + ad.sqrt(x * x + 1) * ad.tanh(x)
                      + ad.maximum(x, 0.3) ** 3)
    x, v = RNG.normal(size=N), RNG.normal(size=N)
    F = ad.record(f, x, device="opencl", tensor=True)
    close(F.hvp(x, v), ad.hvp(f, x, v), 1e-12)
    if _width(F):
        assert _width(F) in [k.width for k in _kernels(F, "hvp")]


def _chain(x):
    return ad.sum((ad.exp(-x) * ad.sin(x) + ad.sqrt(x) * 2.0) / (1.0 + x * x))


@pytest.mark.parametrize("setting", [None, 4])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 15, 16, 17, 2 * 256 * 8 + 3, N])
def test_lengths_around_the_width(monkeypatch, n, setting):
    """A vector loop and the scalar rest, at the device's width and at 4 lanes."""
    x = RNG.uniform(0.1, 2.0, n)
    value, g, F = _run(monkeypatch, _chain, (x,), setting)
    ref_value, ref_g = ad.value_and_grad(_chain)(x)
    close(value, ref_value, 1e-12)
    close(g, ref_g, 1e-12)
    width = 4 if setting else _width(F)
    assert [k.width for k in _kernels(F)] == [width if width and n >= width else 0]


@pytest.mark.parametrize("n", [600, N, 100003])
def test_reductions_to_one_number_in_lanes_and_rest(monkeypatch, n):
    def f(x):
        return ad.amax(x) + ad.amin(x) * 2 + ad.sum(x * x)
    x = RNG.normal(size=n)
    F = _check(monkeypatch, f, (x,))
    for k in (0, 5, 300, n // 2 + 3, n - 2, n - 1):      # lanes, and the last item's rest
        y = x.copy()
        y[k] = np.nan
        assert np.isnan(F(y))
        y[k] = np.inf
        assert F(y) == np.inf
        y[k] = -np.inf
        assert np.isnan(F(y))
        y[k] = 1e3
        close(F(y), ad.value_and_grad(f)(y)[0], 1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_float32_programs_in_vector_loops(monkeypatch, seed):
    from test_tensor_record import _random_program
    f = _random_program(seed)
    x = RNG.normal(size=N).astype(np.float32)
    value, g, F = _run(monkeypatch, f, (x,))
    s_value, s_g, _ = _run(monkeypatch, f, (x,), 0)
    ref_value, ref_g = ad.value_and_grad(f)(x.astype(np.float64))
    assert g.dtype == np.float32
    assert "typedef float real_t;" in F._bound["gradient"].source
    width = _width(F, np.float32)
    if width:
        assert width in [k.width for k in _kernels(F)]
        assert f"typedef float{width} vreal_t;" in F._bound["gradient"].source
    np.testing.assert_allclose(value, ref_value, rtol=1e-4)
    np.testing.assert_allclose(g, ref_g, rtol=1e-3, atol=1e-3 * np.abs(ref_g).max())
    np.testing.assert_allclose(value, s_value, rtol=1e-5)
    np.testing.assert_allclose(g, s_g, rtol=1e-5, atol=1e-5 * np.abs(s_g).max())


def test_where_comparisons_and_maximum_in_float32(monkeypatch):
    def f(x):
        return ad.sum(ad.where(x > 0.1, x ** 2, -x) + ad.maximum(x, 0.3) * ad.tanh(x))
    x = RNG.normal(size=N).astype(np.float32)
    value, g, F = _run(monkeypatch, f, (x,))
    s_value, s_g, _ = _run(monkeypatch, f, (x,), 0)
    np.testing.assert_allclose(value, s_value, rtol=1e-5)
    np.testing.assert_allclose(g, s_g, rtol=1e-6, atol=1e-6)


_MASK = RNG.random(N) < 0.5


@pytest.mark.parametrize("name, f", [
    ("where", lambda x: ad.sum(ad.where(x > 0.1, x ** 2, -x) + ad.maximum(x, 0.3))),
    ("where of a recorded mask", lambda x: ad.sum(ad.where(_MASK, ad.sin(x), x * x))),
    ("comparisons as numbers", lambda x: ad.sum((x > 0).astype(np.float64) * x * x
                                                + (x <= x * x).astype(np.float64))),
    ("a condition stored for a broadcast", lambda x: ad.sum(
        ad.where((x > 0)[:, None], x[:, None] * np.arange(3.0), ad.cos(x)[:, None]))),
    ("infinities and NaN as operands", lambda x: ad.sum(
        ad.maximum(x, -np.inf) + ad.where(x > 0, x, np.inf) * 0.0 + ad.minimum(x, np.inf))),
    ("a slice at an offset", lambda x: ad.sum(x[3:] * ad.exp(-x[:-3]))),
    ("a broadcast number", lambda x: ad.sum(ad.sin(x) * ad.sum(x) + x[5])),
    ("a broadcast condition", lambda x: ad.sum(ad.where(x[5:6] > 0, ad.exp(x), -x)
                                               + ad.where(x[6:7] < 0, x, ad.sin(x)))),
])
def test_bools_numbers_and_slices(monkeypatch, name, f):
    x = RNG.normal(size=N)
    x[::11] = 0.1                               # ties of the comparison
    if name == "infinities and NaN as operands":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            value, g, _ = _run(monkeypatch, f, (x,))
            s_value, s_g, _ = _run(monkeypatch, f, (x,), 0)
        assert np.isnan(value) and np.isnan(s_value)   # inf * 0: NaN, as in numpy
        np.testing.assert_array_equal(g, s_g)
        return
    _check(monkeypatch, f, (x,))


def test_scalar_kernels_where_the_vector_ones_do_not_build(monkeypatch):
    """A device whose PoCL cannot build the vector loops gets the scalar kernels, with no
    warning; where the scalar ones do not build either, the CompilerWarning as before."""
    x = RNG.uniform(0.1, 2.0, N)
    F = ad.record(_chain, x, device="opencl", tensor=True)
    be = F._backend
    if not vector_cl.fused_width(be, "double"):    # (a fallback warns here, not below)
        pytest.skip("this device gets scalar kernels")
    real_kernel = type(be).kernel
    refused = []

    def failing(self, source, name, scalar_dtypes):
        if "vreal_t" in source:
            refused.append(name)
            raise DeviceError("building the OpenCL kernel failed: test")
        return real_kernel(self, source, name, scalar_dtypes)
    monkeypatch.setattr(type(be), "kernel", failing)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value, g = F.value_and_gradient(x)
    assert refused
    assert all(k.width == 0 for k in _kernels(F))
    ref_value, ref_g = ad.value_and_grad(_chain)(x)
    close(value, ref_value, 1e-12)
    close(g, ref_g, 1e-12)

    def missing(self, source, name, scalar_dtypes):    # built, but without the kernel
        if "vreal_t" in source:
            raise AttributeError(name)
        return real_kernel(self, source, name, scalar_dtypes)
    monkeypatch.setattr(type(be), "kernel", missing)
    G = ad.record(_chain, x, device="opencl", tensor=True)
    close(G.value_and_gradient(x)[1], ref_g, 1e-12)
    assert all(k.width == 0 for k in _kernels(G))


def test_forced_scalar_kernels_are_the_same_kernels_as_before(monkeypatch):
    """EASYAD_OPENCL_VECTOR=0: no vector helpers, loops of elements per work-item."""
    x = RNG.uniform(0.1, 2.0, N)
    _, _, S = _run(monkeypatch, _chain, (x,), 0)
    source = S._bound["gradient"].source
    assert "vreal_t" not in source and "easyad_v_" not in source
    if S._backend.device.is_gpu:    # a work-item per element, partials strided by the grid
        assert "i += get_global_size(0)" in source
    else:                           # a run of elements per work-item, 8 running partials
        assert "for (int U_ = 0; U_ < 8; U_++)" in source


@pytest.mark.parametrize("setting, expected", [("0", 0), ("4", 4), ("3", 0), ("x", 0)])
def test_the_width_setting(monkeypatch, setting, expected):
    F = ad.record(_chain, np.ones(4), device="opencl", tensor=True)
    monkeypatch.setenv(vector_cl.VECTOR_ENV, setting)
    assert vector_cl.vector_width(F._backend, "double") == expected
    monkeypatch.delenv(vector_cl.VECTOR_ENV)
    width = vector_cl.vector_width(F._backend, "double")
    assert width in (0, 2, 4, 8, 16)
    preferred = F._backend.device._handle.preferred_vector_width_double
    assert width == (preferred if preferred in (2, 4, 8, 16) else 0)


def test_vector_math_is_checked_against_the_scalar_builtins_in_the_proof(monkeypatch):
    """The device's vector builtins are compared with its scalar ones at special values in
    the child process that proves the width (the check is a kernel too); the verdict keeps
    what it found and the backend reads it from there, building nothing; a width with no
    verdict of its check trusts none of them; a builtin whose lanes differ is found."""
    from easyad.tensor import _devices, _proofs
    be = _devices.resolve("opencl")
    width = vector_cl.fused_width(be, "double")
    if not width:
        pytest.skip("this device gets scalar kernels")
    verdict = _proofs.verdicts(be.device._handle, [f"fused:double:{width}"])
    found = frozenset(verdict[f"fused:double:{width}"]["lanewise"])
    assert found <= vector_cl.VECTOR_MATH

    class Broken:             # the device, where building a kernel fails
        device = be.device

        def kernel(self, *args):
            raise DeviceError("build failed")
    assert vector_cl.untrusted_vector_math(Broken(), "double", width) == found
    no_check = {"ok": True, "problem": ""}      # a verdict without the check's finding
    monkeypatch.setattr(_proofs, "verdicts", lambda handle, kinds: {k: no_check for k in kinds})
    assert vector_cl.untrusted_vector_math(Broken(), "double", width) == \
        vector_cl.VECTOR_MATH
    monkeypatch.undo()

    class Wrong:             # the device, with one vector result off by one in one lane
        def __init__(self, row):
            self.reads, self.row = 0, row

        def __getattr__(self, name):
            return getattr(be, name)

        def to_numpy(self, buf):
            out = be.to_numpy(buf)
            self.reads += 1
            if self.reads == 1:                  # the vector results come back first
                # rows: each builtin in sorted order, then sincos's sine and its cosine
                n = len(out) // (len(vector_cl.VECTOR_MATH) + 2)
                out[self.row * n + 3] += 1.0
            return out
    names = sorted(vector_cl.VECTOR_MATH)
    assert vector_cl.check_vector_math(Wrong(names.index("sin")), "double", width) == \
        found | {"sin"}
    # a wrong vector sincos distrusts what it stands for (sin and cos then run lane by lane)
    assert vector_cl.check_vector_math(Wrong(len(names)), "double", width) == \
        found | {"sin"}
    assert vector_cl.check_vector_math(Wrong(len(names) + 1), "double", width) == \
        found | {"cos"}


def test_untrusted_vector_math_is_computed_lane_by_lane(monkeypatch):
    """A builtin the check found wrong in vectors is called on each lane by itself: the
    same values as eager execution and as the scalar kernels."""
    from easyad.tensor import _devices
    be = _devices.resolve("opencl")
    width = vector_cl.fused_width(be, "double")
    if not width:
        pytest.skip("this device gets scalar kernels")
    kept = be.__dict__.setdefault("_untrusted_vector_math", {})
    monkeypatch.setitem(kept, ("double", width), frozenset({"sin", "exp", "atan2"}))

    def f(p):
        x, y = p
        return ad.sum(ad.sin(x) * ad.exp(-x * x) + ad.atan2(x, y) * ad.cos(y))
    x, y = RNG.normal(size=N), RNG.normal(size=N)
    _check(monkeypatch, f, ((x, y),))
    F = ad.record(f, (x, y), device="opencl", tensor=True)
    F.gradient((x, y))
    source = F._bound["gradient"].source
    assert "easyad_lw_sin(" in source and "easyad_lw_atan2(" in source
    assert "easyad_lw_cos(" not in source
