"""The rule table's expressions as Python callables, over any Numeric kind.

The compiled core renders ``_rules.py`` into C; everything that runs the same formulas in
Python (higher-order reverse mode on Records, Taylor arithmetic, tensors on numpy) compiles
them here instead, against a namespace that says what ``sin``, ``mul0``... mean for its kind.
``generic_namespace()`` maps every name an expression may call to easyad's generic
functions, so a compiled partial works on floats, Traces, Records and anything else that
implements the Numeric protocol (the piecewise helpers read values through ``.number``).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from easyad import _rules as rules

Expression = Callable[[Any, Any, Any], Any]  # (x, y, z) -> value


def c_function_name(rule: rules.Rule) -> str | None:
    """The function a rule's value expression calls (``fabs`` for abs), or None (operators)."""
    head = rule.value.split("(")[0]
    return head if head.isidentifier() and "(" in rule.value else None


def number_of(t: Any) -> float:
    """The plain value of any Numeric kind (``.number`` of Traces, Records, Taylors)."""
    if isinstance(t, (int, float)):
        return float(t)
    number = getattr(t, "number", None)
    if number is None:
        raise TypeError(f"cannot read the value of a {type(t).__name__}")
    return float(number)


# Piecewise-constant helpers return plain floats: their derivative is 0 wherever defined,
# so the result carries no derivative in any mode.
def _sign(t: Any) -> float:
    v = number_of(t)
    return 1.0 if v > 0 else (-1.0 if v < 0 else v)


def _heaviside(t: Any) -> float:
    v = number_of(t)
    return 1.0 if v > 0 else (0.0 if v < 0 else (0.5 if v == 0 else v))


def _mul0(a: Any, b: Any) -> Any:
    # strong zero: a zero factor contributes exactly nothing, even against inf or NaN
    if number_of(a) == 0.0 or number_of(b) == 0.0:
        return 0.0
    return a * b


def _div0(a: Any, b: Any) -> Any:
    return 0.0 if number_of(a) == 0.0 else a / b


@functools.lru_cache(maxsize=1)
def generic_namespace() -> Mapping[str, Any]:
    """Every name a rule expression may call, bound to easyad's generic functions."""
    import easyad as ad

    ns: dict[str, Any] = {"sign": _sign, "heaviside": _heaviside, "mul0": _mul0, "div0": _div0}
    for rule in rules.RULES:
        name = c_function_name(rule)
        if name is not None:
            ns[name] = getattr(ad, rule.name)
    return ns


@functools.lru_cache(maxsize=None)
def _code(text: str) -> Any:
    return compile(f"lambda x, y, z: ({text})", f"<rule expression {text!r}>", "eval")


def compile_expression(text: str, namespace: Mapping[str, Any]) -> Expression:
    """A rule expression as a Python function ``(x, y, z) -> value`` over ``namespace``."""
    function: Expression = eval(_code(text), dict(namespace))  # noqa: S307 (the rule table)
    return function


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
