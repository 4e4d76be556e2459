# GENERATED from easyad/_rules.py by tools/render_rule_methods.py, do not edit.
"""RuleMethods: the elementwise methods and operators of Tensor and TraceTensor, one per
row of the rule table (with its aliases and operator dunders), written out so that mypy
and IDEs see them. Each calls the class's hook, ``_unary_rule(rule)`` or
``_binary_rule(rule, other, reflected)``; a binary one returns NotImplemented for an
operand the class does not take, so Python tries the other operand's reflected method.
"""
from __future__ import annotations

from typing import Any, TypeVar

from easyad._rules import RULES_BY_NAME, Rule

_T = TypeVar("_T", bound="RuleMethods")

_NEG = RULES_BY_NAME["neg"]
_SIN = RULES_BY_NAME["sin"]
_COS = RULES_BY_NAME["cos"]
_TAN = RULES_BY_NAME["tan"]
_ASIN = RULES_BY_NAME["asin"]
_ACOS = RULES_BY_NAME["acos"]
_ATAN = RULES_BY_NAME["atan"]
_SINH = RULES_BY_NAME["sinh"]
_COSH = RULES_BY_NAME["cosh"]
_TANH = RULES_BY_NAME["tanh"]
_ASINH = RULES_BY_NAME["asinh"]
_ACOSH = RULES_BY_NAME["acosh"]
_ATANH = RULES_BY_NAME["atanh"]
_EXP = RULES_BY_NAME["exp"]
_EXPM1 = RULES_BY_NAME["expm1"]
_LOG = RULES_BY_NAME["log"]
_LOG2 = RULES_BY_NAME["log2"]
_LOG10 = RULES_BY_NAME["log10"]
_LOG1P = RULES_BY_NAME["log1p"]
_SQRT = RULES_BY_NAME["sqrt"]
_CBRT = RULES_BY_NAME["cbrt"]
_ABS = RULES_BY_NAME["abs"]
_ERF = RULES_BY_NAME["erf"]
_ADD = RULES_BY_NAME["add"]
_SUB = RULES_BY_NAME["sub"]
_MUL = RULES_BY_NAME["mul"]
_DIV = RULES_BY_NAME["div"]
_POW = RULES_BY_NAME["pow"]
_ATAN2 = RULES_BY_NAME["atan2"]
_HYPOT = RULES_BY_NAME["hypot"]
_MAXIMUM = RULES_BY_NAME["maximum"]
_MINIMUM = RULES_BY_NAME["minimum"]


class RuleMethods:
    """The rule-table methods of a tensor class; it supplies the two hooks."""

    __slots__ = ()

    def _unary_rule(self: _T, rule: Rule) -> _T:
        raise NotImplementedError

    def _binary_rule(self: _T, rule: Rule, other: Any, reflected: bool) -> _T:
        raise NotImplementedError

    # -- neg: -x --
    def neg(self: _T) -> _T:
        """negation -x, elementwise."""
        return self._unary_rule(_NEG)

    __neg__ = neg

    # -- sin: sin(x) --
    def sin(self: _T) -> _T:
        """sine, elementwise (see ad.sin)."""
        return self._unary_rule(_SIN)

    # -- cos: cos(x) --
    def cos(self: _T) -> _T:
        """cosine, elementwise (see ad.cos)."""
        return self._unary_rule(_COS)

    # -- tan: tan(x) --
    def tan(self: _T) -> _T:
        """tangent, elementwise (see ad.tan)."""
        return self._unary_rule(_TAN)

    # -- asin: asin(x) --
    def asin(self: _T) -> _T:
        """inverse sine, elementwise (see ad.asin)."""
        return self._unary_rule(_ASIN)

    arcsin = asin

    # -- acos: acos(x) --
    def acos(self: _T) -> _T:
        """inverse cosine, elementwise (see ad.acos)."""
        return self._unary_rule(_ACOS)

    arccos = acos

    # -- atan: atan(x) --
    def atan(self: _T) -> _T:
        """inverse tangent, elementwise (see ad.atan)."""
        return self._unary_rule(_ATAN)

    arctan = atan

    # -- sinh: sinh(x) --
    def sinh(self: _T) -> _T:
        """hyperbolic sine, elementwise (see ad.sinh)."""
        return self._unary_rule(_SINH)

    # -- cosh: cosh(x) --
    def cosh(self: _T) -> _T:
        """hyperbolic cosine, elementwise (see ad.cosh)."""
        return self._unary_rule(_COSH)

    # -- tanh: tanh(x) --
    def tanh(self: _T) -> _T:
        """hyperbolic tangent, elementwise (see ad.tanh)."""
        return self._unary_rule(_TANH)

    # -- asinh: asinh(x) --
    def asinh(self: _T) -> _T:
        """inverse hyperbolic sine, elementwise (see ad.asinh)."""
        return self._unary_rule(_ASINH)

    arcsinh = asinh

    # -- acosh: acosh(x) --
    def acosh(self: _T) -> _T:
        """inverse hyperbolic cosine, elementwise (see ad.acosh)."""
        return self._unary_rule(_ACOSH)

    arccosh = acosh

    # -- atanh: atanh(x) --
    def atanh(self: _T) -> _T:
        """inverse hyperbolic tangent, elementwise (see ad.atanh)."""
        return self._unary_rule(_ATANH)

    arctanh = atanh

    # -- exp: exp(x) --
    def exp(self: _T) -> _T:
        """exponential (the partial reuses z), elementwise (see ad.exp)."""
        return self._unary_rule(_EXP)

    # -- expm1: expm1(x) --
    def expm1(self: _T) -> _T:
        """exp(x) - 1, accurate near 0, elementwise (see ad.expm1)."""
        return self._unary_rule(_EXPM1)

    # -- log: log(x) --
    def log(self: _T) -> _T:
        """natural logarithm, elementwise (see ad.log)."""
        return self._unary_rule(_LOG)

    ln = log

    # -- log2: log2(x) --
    def log2(self: _T) -> _T:
        """base-2 logarithm, elementwise (see ad.log2)."""
        return self._unary_rule(_LOG2)

    # -- log10: log10(x) --
    def log10(self: _T) -> _T:
        """base-10 logarithm, elementwise (see ad.log10)."""
        return self._unary_rule(_LOG10)

    # -- log1p: log1p(x) --
    def log1p(self: _T) -> _T:
        """log(1 + x), accurate near 0, elementwise (see ad.log1p)."""
        return self._unary_rule(_LOG1P)

    # -- sqrt: sqrt(x) --
    def sqrt(self: _T) -> _T:
        """square root, elementwise (see ad.sqrt)."""
        return self._unary_rule(_SQRT)

    # -- cbrt: cbrt(x) --
    def cbrt(self: _T) -> _T:
        """cube root, elementwise (see ad.cbrt)."""
        return self._unary_rule(_CBRT)

    # -- abs: fabs(x) --
    def abs(self: _T) -> _T:
        """absolute value; abs'(0) = 0, elementwise (see ad.abs)."""
        return self._unary_rule(_ABS)

    absolute = abs

    __abs__ = abs

    # -- erf: erf(x) --
    def erf(self: _T) -> _T:
        """error function, elementwise (see ad.erf)."""
        return self._unary_rule(_ERF)

    # -- add: x + y --

    def add(self: _T, other: Any) -> _T:
        """x + y, elementwise with broadcasting."""
        return self._binary_rule(_ADD, other, False)

    def _radd(self: _T, other: Any) -> _T:
        """x + y, elementwise with broadcasting."""
        return self._binary_rule(_ADD, other, True)

    def __add__(self: _T, other: Any) -> _T:
        """x + y, elementwise with broadcasting."""
        return self._binary_rule(_ADD, other, False)

    def __radd__(self: _T, other: Any) -> _T:
        """x + y, elementwise with broadcasting."""
        return self._binary_rule(_ADD, other, True)

    # -- sub: x - y --

    def sub(self: _T, other: Any) -> _T:
        """x - y, elementwise with broadcasting."""
        return self._binary_rule(_SUB, other, False)

    def _rsub(self: _T, other: Any) -> _T:
        """x - y, elementwise with broadcasting."""
        return self._binary_rule(_SUB, other, True)

    def __sub__(self: _T, other: Any) -> _T:
        """x - y, elementwise with broadcasting."""
        return self._binary_rule(_SUB, other, False)

    def __rsub__(self: _T, other: Any) -> _T:
        """x - y, elementwise with broadcasting."""
        return self._binary_rule(_SUB, other, True)

    # -- mul: x * y --

    def mul(self: _T, other: Any) -> _T:
        """x * y, elementwise with broadcasting."""
        return self._binary_rule(_MUL, other, False)

    def _rmul(self: _T, other: Any) -> _T:
        """x * y, elementwise with broadcasting."""
        return self._binary_rule(_MUL, other, True)

    def __mul__(self: _T, other: Any) -> _T:
        """x * y, elementwise with broadcasting."""
        return self._binary_rule(_MUL, other, False)

    def __rmul__(self: _T, other: Any) -> _T:
        """x * y, elementwise with broadcasting."""
        return self._binary_rule(_MUL, other, True)

    # -- div: x / y --

    def div(self: _T, other: Any) -> _T:
        """x / y, elementwise with broadcasting."""
        return self._binary_rule(_DIV, other, False)

    def _rdiv(self: _T, other: Any) -> _T:
        """x / y, elementwise with broadcasting."""
        return self._binary_rule(_DIV, other, True)

    def __truediv__(self: _T, other: Any) -> _T:
        """x / y, elementwise with broadcasting."""
        return self._binary_rule(_DIV, other, False)

    def __rtruediv__(self: _T, other: Any) -> _T:
        """x / y, elementwise with broadcasting."""
        return self._binary_rule(_DIV, other, True)

    # -- pow: pow(x, y) --

    def pow(self: _T, other: Any) -> _T:
        """x ** y, elementwise with broadcasting (see ad.pow)."""
        return self._binary_rule(_POW, other, False)

    def _rpow(self: _T, other: Any) -> _T:
        """x ** y, elementwise with broadcasting (see ad.pow)."""
        return self._binary_rule(_POW, other, True)

    power = pow
    _rpower = _rpow

    def __pow__(self: _T, other: Any, mod: None = None) -> _T:
        """x ** y, elementwise with broadcasting (see ad.pow)."""
        if mod is not None:
            return NotImplemented
        return self._binary_rule(_POW, other, False)

    def __rpow__(self: _T, other: Any, mod: None = None) -> _T:
        """x ** y, elementwise with broadcasting (see ad.pow)."""
        if mod is not None:
            return NotImplemented
        return self._binary_rule(_POW, other, True)

    # -- atan2: atan2(x, y) --

    def atan2(self: _T, other: Any) -> _T:
        """angle of the point (y, x): atan2(x, y) = atan(x/y), elementwise with broadcasting (see
        ad.atan2)."""
        return self._binary_rule(_ATAN2, other, False)

    def _ratan2(self: _T, other: Any) -> _T:
        """angle of the point (y, x): atan2(x, y) = atan(x/y), elementwise with broadcasting (see
        ad.atan2)."""
        return self._binary_rule(_ATAN2, other, True)

    arctan2 = atan2
    _rarctan2 = _ratan2

    # -- hypot: hypot(x, y) --

    def hypot(self: _T, other: Any) -> _T:
        """sqrt(x*x + y*y) without overflow, elementwise with broadcasting (see ad.hypot)."""
        return self._binary_rule(_HYPOT, other, False)

    def _rhypot(self: _T, other: Any) -> _T:
        """sqrt(x*x + y*y) without overflow, elementwise with broadcasting (see ad.hypot)."""
        return self._binary_rule(_HYPOT, other, True)

    # -- maximum: maximum(x, y) --

    def maximum(self: _T, other: Any) -> _T:
        """larger of x and y; ties split the derivative, elementwise with broadcasting (see
        ad.maximum)."""
        return self._binary_rule(_MAXIMUM, other, False)

    def _rmaximum(self: _T, other: Any) -> _T:
        """larger of x and y; ties split the derivative, elementwise with broadcasting (see
        ad.maximum)."""
        return self._binary_rule(_MAXIMUM, other, True)

    # -- minimum: minimum(x, y) --

    def minimum(self: _T, other: Any) -> _T:
        """smaller of x and y; ties split the derivative, elementwise with broadcasting (see
        ad.minimum)."""
        return self._binary_rule(_MINIMUM, other, False)

    def _rminimum(self: _T, other: Any) -> _T:
        """smaller of x and y; ties split the derivative, elementwise with broadcasting (see
        ad.minimum)."""
        return self._binary_rule(_MINIMUM, other, True)
