"""The rule table's expressions as Python callables, and what their names mean in Python.

The compiled core renders ``_rules.py`` into C, with the helpers of ``_helpers.h``.
Everything that runs the same formulas in Python compiles them here instead, against a
namespace that says what ``sin``, ``mul0``... mean for its kind of number. This module is
the one owner of those Python meanings (``_helpers.h`` owns the C/OpenCL ones; the tests
check that they agree):

- ``generic_namespace()``: floats, Traces, Records and any Numeric (higher-order reverse
  mode, Taylor arithmetic, Traces of Traces or Records): table calls go to easyad's generic
  functions ``ad.<rule>``; the piecewise helpers read values through ``.number``;
- ``series_namespace(is_zero)``: the generic one with strong zeros judged by ``is_zero``
  (Taylor mode: a whole series that is 0 contributes nothing);
- ``numpy_namespace()``: arrays (the numpy tensor backend): table calls go to numpy's
  ufunc named by each row (``Rule.numpy``), or where numpy has none to the table's C
  (``_core._rule_values``), helpers elementwise with ``np.where``.

Names a table call may have come from ``_expr.call_rules`` (a row whose value is a bare
call, like ``fabs(x)`` for abs); the expressions are rendered by ``_expr``.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from easyad import _core, _expr
from easyad import _rules as rules

Expression = Callable[[Any, Any, Any], Any]  # (x, y, z) -> value


def number_of(t: Any) -> float:
    """The plain value of any Numeric kind (``.number`` of Traces, Records, Taylors; of a
    nested Trace, the value at its innermost level)."""
    while not isinstance(t, (int, float)):
        number = getattr(t, "number", None)
        if number is None:
            raise TypeError(f"cannot read the value of a {type(t).__name__}")
        t = number
    return float(t)


# ---- helpers on Numeric kinds (floats, Traces, Records...) ----
# Piecewise-constant helpers return plain floats: their derivative is 0 wherever defined,
# so the result carries no derivative in any mode.

def _sign(t: Any) -> float:
    v = number_of(t)
    return 1.0 if v > 0 else (-1.0 if v < 0 else v)


def _heaviside(t: Any) -> float:
    v = number_of(t)
    return 1.0 if v > 0 else (0.0 if v < 0 else (0.5 if v == 0 else v))


def _pick(a: Any, b: Any) -> float:
    # fmax's share of a (_helpers.h): piecewise constant, a plain float
    va, vb = number_of(a), number_of(b)
    if va > vb:
        return 1.0
    if va < vb:
        return 0.0
    if va == vb:
        return 0.5
    if va != va and vb != vb:
        return va
    return 1.0 if vb != vb else 0.0


def _mul0(a: Any, b: Any) -> Any:
    # strong zero: a zero factor against inf or NaN contributes exactly nothing. Otherwise
    # the plain product, so a factor whose value is 0 still passes on its derivative
    # (higher-order sweeps differentiate these products again).
    va, vb = number_of(a), number_of(b)
    if (va == 0.0 and not math.isfinite(vb)) or (vb == 0.0 and not math.isfinite(va)):
        return 0.0
    return a * b


def _div0(a: Any, b: Any) -> Any:
    # 0/0 counts as 0 (the subgradient of hypot at the origin), 0/NaN too (as in C).
    # Otherwise the quotient, so a numerator whose value is 0 passes on its derivative.
    va, vb = number_of(a), number_of(b)
    if va == 0.0 and (vb == 0.0 or vb != vb):
        return 0.0
    return a / b


# ---- helpers on numpy arrays ----

# mul0 and div0 are numpy ufuncs of the core (one C pass with _helpers.h's definitions);
# numpy's masks only for what those refuse (object arrays)
_MUL0, _DIV0 = _core._mul0_ufunc, _core._div0_ufunc


def _np_mul0(a: Any, b: Any) -> Any:
    # strong zero: a zero factor gives exactly 0, even against inf or NaN
    try:
        return _MUL0(a, b)
    except TypeError:
        return np.where((np.asarray(a) == 0) | (np.asarray(b) == 0), 0.0, a * b)


def _np_div0(a: Any, b: Any) -> Any:
    try:
        return _DIV0(a, b)
    except TypeError:
        return np.where(np.asarray(a) == 0, 0.0, a / np.where(np.asarray(a) == 0, 1.0, b))


def _np_heaviside(t: Any) -> Any:
    return np.heaviside(t, 0.5)


def _np_choose(c: Any, a: Any, b: Any) -> Any:
    return np.where(c, a, b)


def _np_pick(a: Any, b: Any) -> Any:
    a, b = np.asarray(a), np.asarray(b)
    nan_a, nan_b = a != a, b != b
    with np.errstate(invalid="ignore"):
        share = np.where(a > b, 1.0, np.where(a < b, 0.0, 0.5))
    share = np.where(nan_a | nan_b, np.where(nan_a & nan_b, np.nan, np.where(nan_b, 1.0, 0.0)),
                     share)
    dtype = np.result_type(a, b)
    return share.astype(dtype) if dtype.kind == "f" else share


def _rule_arrays(rule: rules.Rule, function: Any) -> Any:
    """A row numpy has no ufunc for, on arrays: the table's C over float64 (the values
    the replay sweeps give, IEEE inf and NaN where math would raise), in the inputs'
    float dtype; object arrays (Records, Traces) element by element through ``function``."""
    opcode, ufunc = rules.OPCODES[rule.name], np.frompyfunc(function, rule.arity, 1)

    def apply(*args: Any) -> Any:
        arrays = [np.asarray(a) for a in args]
        if any(a.dtype.kind not in "biuf" for a in arrays):
            return ufunc(*arrays)
        out = _core._rule_values(opcode, *arrays)
        dtype = np.result_type(*arrays)
        return out.astype(dtype) if dtype.kind == "f" and dtype != out.dtype else out
    return apply


# ---- namespaces ----

@functools.lru_cache(maxsize=1)
def generic_namespace() -> Mapping[str, Any]:
    """Every name a rule expression may call, bound to easyad's generic functions."""
    import easyad._core as core

    ns: dict[str, Any] = {"sign": _sign, "heaviside": _heaviside, "mul0": _mul0,
                          "div0": _div0, "pick": _pick}
    for name, rule in _expr.call_rules().items():
        ns[name] = getattr(core, rule.name)
    return ns


def _unchecked(name: str, function: Any) -> Any:
    """``function`` as derivative code computes it on plain numbers: C's NaN or infinity
    where Python raises (log(-2) in the partial of (-2) ** x, as the replay sweeps give);
    on Records and tensors the function itself (whose errors are the recording's)."""
    fallback = getattr(np, _expr.call_rules()[name].spelling("numpy") or name, None)

    def call(*args: Any) -> Any:
        try:
            return function(*args)
        except (ValueError, ArithmeticError):
            if fallback is None or not all(type(a) in (float, int) for a in args):
                raise
            with np.errstate(all="ignore"):
                return float(fallback(*args))
    return call


@functools.lru_cache(maxsize=1)
def derivative_namespace() -> Mapping[str, Any]:
    """The generic namespace for partials and their tangents (create_graph sweeps): a
    function of plain numbers that fails gives C's value instead (``_unchecked``)."""
    ns = dict(generic_namespace())
    for name in _expr.call_rules():
        ns[name] = _unchecked(name, ns[name])
    return ns


@functools.lru_cache(maxsize=1)
def derivative_rules() -> Mapping[str, CompiledRule]:
    """Every rule's partials compiled against ``derivative_namespace()``."""
    ns = derivative_namespace()
    return {r.name: compile_rule(r, ns) for r in rules.RULES}


def series_namespace(is_zero: Callable[[Any], bool]) -> Mapping[str, Any]:
    """The generic namespace with the strong-zero helpers judging whole values by
    ``is_zero`` (Taylor series: a factor that is 0 as a whole series contributes nothing)."""
    def mul0(a: Any, b: Any) -> Any:
        return 0.0 if is_zero(a) or is_zero(b) else a * b

    def div0(a: Any, b: Any) -> Any:
        return 0.0 if is_zero(a) else a / b
    return {**generic_namespace(), "mul0": mul0, "div0": div0}


@functools.lru_cache(maxsize=1)
def numpy_namespace() -> Mapping[str, Any]:
    """Every name a rule expression calls, as numpy functions on arrays: the ufunc each row
    names (``Rule.numpy``); where numpy has none, the table's C on float arrays (the
    generic function on object arrays)."""
    ns: dict[str, Any] = {"sign": np.sign, "heaviside": _np_heaviside, "mul0": _np_mul0,
                          "div0": _np_div0, "maximum": np.maximum, "minimum": np.minimum,
                          "choose": _np_choose, "pick": _np_pick}
    for name, rule in _expr.call_rules().items():
        if name in ns:
            continue
        spelling = rule.spelling("numpy")
        if spelling is not None:
            ns[name] = getattr(np, spelling)
        else:   # numpy has no ufunc (erf, or a row whose C comes from _helpers.h):
            # the table's C on float arrays, the generic function on object arrays
            import easyad._core as core
            ns[name] = _rule_arrays(rule, getattr(core, rule.name))
    return ns


# ---- compiling ----

@functools.lru_cache(maxsize=None)
def _code(text: str, params: tuple[str, ...]) -> Any:
    source = _expr.render(text, "python")
    return compile(f"lambda {', '.join(params)}: ({source})", f"<expression {text!r}>", "eval")


def compile_expression(text: str, namespace: Mapping[str, Any],
                       params: tuple[str, ...] = ("x", "y", "z")) -> Any:
    """An expression as a Python function of ``params`` (default ``(x, y, z) -> value``)
    over ``namespace``."""
    return eval(_code(text, params), dict(namespace))  # noqa: S307 (table text)


@dataclass(frozen=True)
class CompiledRule:
    rule: rules.Rule
    value: Expression
    partials: tuple[Expression, ...]


def compile_rule(rule: rules.Rule, namespace: Mapping[str, Any]) -> CompiledRule:
    return CompiledRule(rule, compile_expression(rule.value, namespace),
                        tuple(compile_expression(p, namespace) for p in rule.partials))


@functools.lru_cache(maxsize=1)
def generic_rules() -> Mapping[str, CompiledRule]:
    """Every rule compiled against the generic namespace, by rule name."""
    ns = generic_namespace()
    return {r.name: compile_rule(r, ns) for r in rules.RULES}


# The core's NestedTrace (a Trace of Traces or Records) evaluates the table on its parts
# with these; the core imports no module above it, so they are registered with it here.
_core._register_service("expressions.generic_rules", generic_rules)
_core._register_service("expressions.generic_namespace", generic_namespace)
