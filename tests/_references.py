"""Independent references for tests/test_rules.py, all derived from the rule table.

- sample points: seeded interior points of each rule's domain plus special values;
- the rule's ``value`` string evaluated by Python's math module (the float reference),
  by sympy (symbolic derivatives, evaluated with mpmath) and by PyTorch (autograd);
- a five-point central finite difference with a step scaled to the input.

Nothing here imports easyad's compiled core: references must not share its code.
"""
from __future__ import annotations

import functools
import math
import operator
import zlib

import numpy as np
import scipy.special as _special
import sympy as sp

from easyad._expr import call_rules
# the rows whose derivative is their value's (stop_gradient: tests/test_stop_gradient.py)
from easyad._rules import DIFFERENTIATED_RULES as RULES
from easyad._rules import Rule

UNARY = tuple(r for r in RULES if r.arity == 1)
BINARY = tuple(r for r in RULES if r.arity == 2)

# Special values tried wherever they lie inside a rule's (open) domain.
SPECIAL_UNARY = (0.0, 1e-8, 0.5, -0.5, 1.0, -1.0, 2.0, -3.0, 10.0, -20.0)
SPECIAL_BINARY = (0.0, 0.5, 1.0, -1.0, 2.0, -3.0)

# Probe values for error behaviour: boundaries, huge, infinite and NaN inputs.
PROBES_UNARY = (0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -3.0, 710.0, -710.0, 1e308, -1e308,
                math.inf, -math.inf, math.nan)
PROBES_BINARY = (0.0, -0.0, 0.5, 1.0, -1.0, 2.5, -3.0, -8.0, 1e308, math.inf, -math.inf,
                 math.nan)

# Width of the window sampled on an unbounded side of a domain.
_WINDOW = 4.0


def rule_id(rule: Rule) -> str:
    return rule.name


# ---- sample points -------------------------------------------------------------------

def sampling_interval(lo: float, hi: float) -> tuple[float, float]:
    """A finite window of the open interval (lo, hi): all of it if bounded, else 4 wide."""
    if math.isinf(lo) and math.isinf(hi):
        return (-_WINDOW / 2, _WINDOW / 2)
    if math.isinf(hi):
        return (lo, lo + _WINDOW)
    if math.isinf(lo):
        return (hi - _WINDOW, hi)
    return (lo, hi)


def in_domain(rule: Rule, point: tuple[float, ...]) -> bool:
    return all(lo < v < hi for v, (lo, hi) in zip(point, rule.domain))


def interior_points(rule: Rule, n: int = 4) -> list[tuple[float, ...]]:
    """n points drawn uniformly from the middle 90% of each input's sampling window.

    The generator is seeded from the rule's name, so the points are the same on every run
    and do not change when rules are added to the table.
    """
    rng = np.random.default_rng(zlib.crc32(rule.name.encode()))
    columns = []
    for lo, hi in rule.domain:
        a, b = sampling_interval(lo, hi)
        margin = 0.05 * (b - a)
        columns.append(rng.uniform(a + margin, b - margin, n))
    return [tuple(float(c[i]) for c in columns) for i in range(n)]


def special_points(rule: Rule) -> list[tuple[float, ...]]:
    """Special values (pairs of them for binary rules) that lie inside the rule's domain."""
    if rule.arity == 1:
        candidates = [(v,) for v in SPECIAL_UNARY]
    else:
        candidates = [(a, b) for a in SPECIAL_BINARY for b in SPECIAL_BINARY]
    return [p for p in candidates if in_domain(rule, p)]


def probe_points(rule: Rule) -> list[tuple[float, ...]]:
    """Inputs for error checks: probes plus each finite domain bound and a step beyond it."""
    if rule.arity == 2:
        return [(a, b) for a in PROBES_BINARY for b in PROBES_BINARY]
    values = list(PROBES_UNARY)
    for lo, hi in rule.domain:
        values += [b + s for b in (lo, hi) if math.isfinite(b) for s in (-0.5, 0.0, 0.5)]
    return [(v,) for v in values]


# ---- the float reference: the value string evaluated by Python's math module ---------

def _np_float(f):
    return lambda a, b: float(f(a, b))


# The table's helpers in plain Python (only maximum/minimum occur in value strings).
PY_HELPERS = {
    "sign": lambda t: 1.0 if t > 0 else (-1.0 if t < 0 else t),
    "heaviside": lambda t: 1.0 if t > 0 else (0.0 if t < 0 else (0.5 if t == 0 else t)),
    "mul0": lambda a, b: 0.0 if a == 0.0 or b == 0.0 else a * b,
    "div0": lambda a, b: 0.0 if a == 0.0 else a / b,
    "maximum": _np_float(np.maximum),  # numpy's rule: NaN propagates
    "minimum": _np_float(np.minimum),
}
PY_NAMESPACE = {name: getattr(math, name) for name in dir(math) if not name.startswith("_")}
PY_NAMESPACE.update(PY_HELPERS)


class Approximate(float):
    """A reference value from another implementation (scipy's) of a function that no
    Python module computes as C's libm or easyad's helper does (gammaln: glibc's lgamma
    against cephes; digamma): equal to within ``rtol`` relative plus ``atol``, not bit
    for bit. Tests that compare bits read these two fields."""

    rtol = 1e-13
    atol = 1e-15


def _library(f, approximate=False):
    # a scipy or numpy ufunc on floats: IEEE values (inf, NaN) and no exception
    def call(*args):
        with np.errstate(all="ignore"):
            v = float(f(*args))
        return Approximate(v) if approximate and math.isfinite(v) else v
    return call


def _pick(a, b):
    # fmax's share of a (_rules.HELPERS): 1 where a wins or only b is NaN, 1/2 at a tie
    if a != a or b != b:
        return a if a != a and b != b else (1.0 if b != b else 0.0)
    return 1.0 if a > b else (0.0 if a < b else 0.5)


# the rows of scipy.special and numpy's float ufuncs, by scipy and numpy (not easyad):
# scipy's formulas differ from the helpers' in the last bit (logit near 1/2, expit below
# 0, cephes' lgamma), and CPython's erfc from libm's, so those compare to a tolerance;
# numpy's fmax, fmin and logaddexp are the same algorithms, bit for bit
PY_NAMESPACE.update(
    expit=_library(_special.expit, True), logit=_library(_special.logit, True),
    # gammaln(-inf): inf as C99's lgamma and torch (scipy: -inf)
    gammaln=_library(lambda x: np.inf if x == -np.inf else _special.gammaln(x), True),
    digamma=_library(_special.psi, True),
    polygamma=_library(lambda n, x: _special.polygamma(math.floor(n + 0.5), x), True),
    xlogy=_library(_special.xlogy, True), xlog1py=_library(_special.xlog1py, True),
    erfc=_library(math.erfc, True), logaddexp=_library(np.logaddexp, True),
    logaddexp2=_library(np.logaddexp2, True), fmax=_library(np.fmax),
    fmin=_library(np.fmin), pick=_pick)


@functools.lru_cache(maxsize=None)
def _compiled(text: str):
    return compile(text, text, "eval")


def math_value(rule: Rule, *args: float) -> float:
    """The rule's value string evaluated on floats by the math module (raises like it)."""
    names = dict(zip("xy", args))
    return eval(_compiled(rule.value), PY_NAMESPACE, names)  # noqa: S307 (table text)


# numpy's maximum/minimum return the second operand for maximum(0.0, -0.0), unlike its
# documented where(x1 >= x2, x1, x2); IEEE 754 leaves the sign of that zero unspecified.
_ZERO_SIGN_UNSPECIFIED = {"maximum", "minimum"}


def zero_sign_specified(rule: Rule) -> bool:
    """Whether the sign of a zero result is defined by the reference (so tests compare it)."""
    return not set(_compiled(rule.value).co_names) & _ZERO_SIGN_UNSPECIFIED


def has_math_reference(rule: Rule) -> bool:
    """Whether every function the value string calls exists in the math namespace."""
    return all(name in PY_NAMESPACE for name in _compiled(rule.value).co_names)


# ---- sympy: symbolic value and partials ---------------------------------------------

X, Y, Z = sp.symbols("x y z", real=True)


def library_function(rule: Rule, library: str, namespace: dict):
    """The rule's function in a library, from its spelling in the row: a name in
    ``namespace``, or an expression in x, y over it; None where the library lacks it."""
    spelling = rule.spelling(library)
    if spelling is None:
        return None
    if spelling.isidentifier():
        return namespace[spelling]
    code = compile(spelling, f"<{library} spelling of {rule.name}>", "eval")
    return lambda *args: eval(code, namespace, dict(zip("xy", args)))  # noqa: S307


# the table's calls (sin, fabs, pow...) as the rows spell them in sympy, and the helpers:
# away from ties and zeros (where the tests use them) these are the plain maths; sympy's
# Heaviside(0) is 1/2 and sign(0) is 0, the table's conventions
SYMPY_NAMESPACE = {
    **{name: library_function(rule, "sympy", vars(sp))
       for name, rule in call_rules(RULES).items()},
    "sign": sp.sign,
    "heaviside": sp.Heaviside,
    "mul0": lambda a, b: a * b,
    "div0": lambda a, b: a / b,
    "pick": lambda a, b: sp.Heaviside(a - b),
}


def _parse(text: str) -> sp.Expr:
    return sp.parse_expr(text, local_dict={**SYMPY_NAMESPACE, "x": X, "y": Y, "z": Z},
                         evaluate=True)


@functools.lru_cache(maxsize=None)
def sympy_value(rule: Rule) -> sp.Expr:
    return _parse(rule.value)


@functools.lru_cache(maxsize=None)
def sympy_partials(rule: Rule) -> tuple[sp.Expr, ...]:
    """The table's partial strings parsed by sympy, with z replaced by the value."""
    value = sympy_value(rule)
    return tuple(_parse(p).xreplace({Z: value}) for p in rule.partials)


@functools.lru_cache(maxsize=None)
def sympy_derivatives(rule: Rule) -> tuple[sp.Expr, ...]:
    """sympy's own derivatives of the value string, one per input."""
    value = sympy_value(rule)
    return tuple(sp.diff(value, s) for s in (X, Y)[:rule.arity])


def evaluate(expr: sp.Expr, point: tuple[float, ...], digits: int = 30) -> float:
    """expr at the (exact binary) point, evaluated with mpmath to ``digits`` digits.

    Returns NaN where the result is not a finite real number (a pole, 0/0, complex).
    """
    subs = {s: sp.Float(v, digits + 10) for s, v in zip((X, Y), point)}
    result = expr.xreplace(subs).evalf(digits)
    if not (result.is_number and result.is_real and result.is_finite):
        return math.nan
    return float(result)


@functools.lru_cache(maxsize=None)
def smooth_points(rule: Rule) -> tuple[tuple[float, ...], ...]:
    """Interior and special points where the value is defined and every sympy derivative is
    finite: where finite differences, sympy and torch all give a reference derivative.

    Kinks on the sign/heaviside conventions stay (abs at 0, maximum at a tie): there the
    symmetric difference quotient, sympy's Heaviside(0) = 1/2 and torch all give the
    average of the one-sided derivatives, which is the table's convention.
    """
    points = []
    for p in interior_points(rule) + special_points(rule):
        try:
            math_value(rule, *p)
        except (ArithmeticError, ValueError):
            continue
        if all(math.isfinite(evaluate(d, p)) for d in sympy_derivatives(rule)):
            points.append(p)
    return tuple(points)


# numpy float64 versions of the table's functions: partials evaluated without exceptions
# (inf/NaN instead), to tell where a rule's partials are finite.
NP_NAMESPACE = {name: getattr(np, name) for name in PY_NAMESPACE if hasattr(np, name)}
NP_NAMESPACE.update(PY_HELPERS, erf=math.erf, pow=np.power, fabs=np.fabs, pick=_pick,
                    expit=_special.expit, digamma=_special.psi, erfc=_special.erfc,
                    polygamma=lambda n, x: _special.polygamma(np.floor(n + 0.5), x))


def partial_values(rule: Rule, args: tuple[float, ...], value: float) -> list[float]:
    """The table's partials of rule at args, evaluated by numpy (inf/NaN, no exceptions)."""
    names = {"x": np.float64(args[0]), "y": np.float64(args[-1] if rule.arity == 2 else 0.0),
             "z": np.float64(value)}
    with np.errstate(all="ignore"):
        return [float(eval(_compiled(p), NP_NAMESPACE, names)) for p in rule.partials]  # noqa: S307


# ---- PyTorch: the value string evaluated on float64 tensors ---------------------------

def torch_namespace():
    """The table's calls as the rows spell them in torch (a row's None: left out)."""
    import torch

    functions = {name: library_function(rule, "torch", vars(torch))
                 for name, rule in call_rules(RULES).items()}
    return {name: f for name, f in functions.items() if f is not None}


def torch_gradient(rule: Rule, point: tuple[float, ...]) -> tuple[float, ...]:
    """d value / d input for each input, by torch autograd in float64.

    Raises NameError when the value string calls a function torch lacks.
    """
    import torch

    inputs = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in point]
    names = dict(zip("xy", inputs))
    out = eval(_compiled(rule.value), torch_namespace(), names)  # noqa: S307
    grads = torch.autograd.grad(out, inputs, allow_unused=True)
    return tuple(0.0 if g is None else float(g) for g in grads)


# ---- finite differences ---------------------------------------------------------------

EPS = 2.0 ** -52
FD_RELATIVE_STEP = 1e-4


def fd_step(x: float, lo: float, hi: float) -> float:
    """A step scaled to x: 1e-4 * |x| (1e-4 at 0), but at most 1e-4 of the distance to the
    domain's edge, so the stencil stays inside and resolves the curvature near it."""
    scale = abs(x) if x != 0.0 else 1.0
    distance = min(x - lo, hi - x)
    return FD_RELATIVE_STEP * min(scale, distance)


def _five_point(f, x: float, h: float) -> tuple[float, float]:
    values = [f(x + k * h) for k in (-2, -1, 1, 2)]
    estimate = (values[0] - 8 * values[1] + 8 * values[2] - values[3]) / (12 * h)
    rounding = 4 * 1.5 * EPS * max(abs(v) for v in values) / h
    return estimate, rounding


def central_difference(f, x: float, h: float) -> tuple[float, float] | None:
    """Five-point central difference of f at x with step h, and its rounding-error bound;
    None where the stencil straddles a jump (atan2's branch cut): there is no reference.

    Truncation error is h**4 f'''''/30: with h at 1e-4 of the length scale of f it is about
    1e-17 relative, and still below 1e-9 where f varies 20 times faster than |x| suggests
    (tan at -20, 0.4 from a pole). Rounding: each f(x + kh) carries about eps |f|, and the
    weights (1, 8, 8, 1)/12h sum to 1.5/h, so the bound is 1.5 eps max|f| / h, times a margin
    of 4 for libm's last-bit errors. A jump shows as estimates at h and h/2 that disagree far
    beyond both bounds (they grow like 1/h).
    """
    estimate, rounding = _five_point(f, x, h)
    half, half_rounding = _five_point(f, x, h / 2)
    if abs(estimate - half) > 1e-6 * abs(estimate) + 2 * (rounding + half_rounding):
        return None
    return estimate, rounding


# ---- how a rule is called --------------------------------------------------------------

def appliers(rule: Rule, ad) -> dict[str, object]:
    """Every spelling of a rule: the generic ad.<name> and/or its Python operator."""
    out = {}
    if hasattr(ad, rule.name):
        out[f"ad.{rule.name}"] = getattr(ad, rule.name)
    if rule.operator:
        out[rule.operator] = getattr(operator, rule.operator)
    return out


def float_reference(rule: Rule, label: str):
    """The plain-Python function the applier called ``label`` must agree with on floats:
    the operator on Python floats, or the math module for ad.<name>."""
    if label.startswith("ad."):
        return functools.partial(math_value, rule)
    return getattr(operator, label)
