"""The helpers and spellings of the rule table mean the same everywhere.

- every helper of ``_rules.HELPERS`` is defined in the one header (``easyad/_helpers.h``,
  C core and OpenCL kernels) and in each Python namespace (``_expressions``);
- the helpers agree between numpy, Python and OpenCL on special values;
- pow at integer exponents: the C core, numpy and OpenCL agree (exactly for 0, 1, 2);
- each row's numpy, torch and sympy spelling computes the row's value (so ``ad.sinc`` on
  an array could not quietly use numpy's normalised sinc).
"""
from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest
import sympy as sp
import torch

import easyad as ad
from easyad import _expr, _expressions, _rules
from easyad.tensor import _kernels

ROOT = Path(__file__).resolve().parent.parent
HEADER = (ROOT / "easyad" / "_helpers.h").read_text(encoding="utf-8")
SPECIAL = (0.0, -0.0, 1.0, -2.5, 3.0, math.inf, -math.inf, math.nan)


def same(a, b) -> bool:
    """Equal as IEEE values, NaN equal to NaN."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


def test_the_kernels_include_the_one_header():
    assert _kernels.HELPERS == HEADER
    assert not (ROOT / "easyad" / "tensor" / "cl").exists()


@pytest.mark.parametrize("name", sorted(_rules.HELPERS))
def test_every_helper_is_defined_everywhere(name):
    assert re.search(rf"#define {name}\b", HEADER), f"{name} missing from _helpers.h"
    for namespace in (_expressions.generic_namespace(), _expressions.numpy_namespace(),
                      _expressions.series_namespace(lambda t: t == 0)):
        assert callable(namespace[name])


def test_every_call_of_the_table_has_a_meaning():
    used = set().union(*(_expr.calls(t) for r in _rules.RULES for t in (r.value, *r.partials)))
    for namespace in (_expressions.generic_namespace(), _expressions.numpy_namespace()):
        assert used <= set(namespace)


def _pairs():
    return [np.array(c, dtype=float) for c in zip(*itertools.product(SPECIAL, SPECIAL))]


@pytest.mark.parametrize("name", sorted(_rules.HELPERS))
def test_helpers_agree_on_floats_and_arrays(name):
    arity = 1 if name in ("sign", "heaviside") else 2
    args = _pairs()[:arity]
    with np.errstate(all="ignore"):
        expected = _expressions.numpy_namespace()[name](*args)
    python = _expressions.generic_namespace()[name]
    got, want = [], []
    for i in range(len(args[0])):
        try:   # Python floats raise where C and numpy give inf (1.0 / 0.0)
            got.append(python(*(float(a[i]) for a in args)))
        except ArithmeticError:
            continue
        want.append(expected[i])
    assert len(got) >= len(expected) // 2 and same(got, want)


@pytest.mark.parametrize("name", sorted(_rules.HELPERS))
def test_helpers_agree_on_opencl(name, opencl_device):
    arity = 1 if name in ("sign", "heaviside") else 2
    args = _pairs()[:arity]
    operands = dict(zip("xy", args))
    text = f"{name}({', '.join('xy'[:arity])})"
    with np.errstate(all="ignore"):
        expected = _expressions.numpy_namespace()[name](*args)
    be = ad.Tensor.constant(args[0], device=opencl_device)._backend
    data = {k: ad.Tensor.constant(v, device=opencl_device)._data for k, v in operands.items()}
    (out,) = be.map("helper_" + name, (text,), data, args[0].shape, (np.dtype(np.float64),))
    assert same(be.to_numpy(out), expected)


EXPONENTS = [float(n) for n in range(-4, 9)]
EXACT = (0.0, 1.0, 2.0)   # the header's exact cases: 1, x, x * x


def _bases():
    rng = np.random.default_rng(13)
    return np.concatenate([rng.uniform(-3.0, 3.0, 200), rng.uniform(0.0, 1e3, 50),
                           [0.0, -0.0, 1.0, -1.0, 0.5, 1e-100, 1e100]])


def _reference(x, n):
    """math.pow per element (the host's pow, which the core promises to equal), and where
    it is defined without an error (no 0 ** -1, no overflow)."""
    out, ok = np.empty_like(x), np.ones(x.shape, dtype=bool)
    for i, v in enumerate(x):
        try:
            out[i] = math.pow(v, n)
        except (ArithmeticError, ValueError):
            ok[i] = False
    return out, ok


@pytest.mark.parametrize("n", EXPONENTS)
def test_pow_at_integer_exponents_c_and_numpy(n):
    x = _bases()
    expected, ok = _reference(x, n)
    assert ok.sum() > 250
    # the C core: ad.pow on floats and a Trace's ** are math.pow to the last bit
    assert same([ad.pow(float(v), n) for v in x[ok]], expected[ok])
    assert same([(ad.Trace.variable(float(v)) ** n).number for v in x[ok]], expected[ok])
    # numpy's array pow is its own (SIMD) code: exact where the header is, else 1 ulp
    got = np.power(x[ok], n)
    if n in EXACT:
        assert same(got, expected[ok])
    np.testing.assert_array_max_ulp(got, expected[ok], maxulp=1)


@pytest.mark.parametrize("n", EXPONENTS)
def test_pow_at_integer_exponents_opencl(n, opencl_device):
    x = _bases()
    expected, ok = _reference(x, n)
    got = np.asarray(ad.Tensor.constant(x[ok], device=opencl_device) ** n)
    if n in EXACT:
        assert same(got, expected[ok])
    # the device's pow otherwise: OpenCL allows 16 ulp, PoCL does better
    np.testing.assert_array_max_ulp(got, expected[ok], maxulp=2)


# ---- spellings: each row's numpy, torch and sympy names compute the row's value ----

def _point(rule):
    return {"asin": (0.3,), "acos": (0.3,), "atanh": (0.3,), "acosh": (1.7,), "log": (0.7,),
            "log2": (0.7,), "log10": (0.7,), "sqrt": (0.7,), "pow": (0.7, 1.3),
            "xlogy": (0.7, 1.3), "xlog1py": (0.7, 1.3)}.get(
        rule.name, (0.7, -1.3)[:rule.arity] if rule.name != "cbrt" else (-0.7,))


def _value(rule, point):
    return float(_expressions.compile_expression(rule.value, _expressions.numpy_namespace())(
        *point, *([0.0] * (3 - len(point)))))


@pytest.mark.parametrize("rule", _rules.RULES, ids=lambda r: r.name)
def test_numpy_spelling(rule):
    spelling = rule.spelling("numpy")
    point = _point(rule)
    if spelling is None:
        return
    ufunc = getattr(np, spelling)
    assert isinstance(ufunc, np.ufunc)
    assert float(ufunc(*point)) == pytest.approx(_value(rule, point), rel=1e-15)
    if rule.name not in ("neg", "add", "sub", "mul", "div"):   # ad.<name> on arrays uses it
        fn = getattr(ad, rule.name)
        assert same(fn(*(np.array([v]) for v in point)), [float(ufunc(*point))])


def test_generic_functions_without_a_ufunc_go_through_easyad():
    x = np.array([0.3, -1.2])
    assert same(ad.erf(x), [math.erf(0.3), math.erf(-1.2)])


@pytest.mark.parametrize("rule", _rules.RULES, ids=lambda r: r.name)
def test_torch_spelling(rule):
    spelling = rule.spelling("torch")
    if spelling is None:
        pytest.skip("torch has no such function")
    point = _point(rule)
    args = [torch.tensor(v, dtype=torch.float64) for v in point]
    if spelling.isidentifier():
        got = getattr(torch, spelling)(*args)
    else:
        got = eval(spelling, vars(torch), dict(zip("xy", args)))  # noqa: S307 (table text)
    assert float(got) == pytest.approx(_value(rule, point), rel=1e-14)


@pytest.mark.parametrize("rule", _rules.RULES, ids=lambda r: r.name)
def test_sympy_spelling(rule):
    spelling = rule.spelling("sympy")
    if spelling is None:
        pytest.skip("sympy has no such function")
    point = [sp.Float(v, 30) for v in _point(rule)]
    if spelling.isidentifier():
        got = getattr(sp, spelling)(*point)
    else:
        got = eval(spelling, vars(sp), dict(zip("xy", point)))  # noqa: S307 (table text)
    assert float(got) == pytest.approx(_value(rule, _point(rule)), rel=1e-14)
