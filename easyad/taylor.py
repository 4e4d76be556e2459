"""Taylor mode: higher derivatives of scalar functions from truncated power series.

Layer: rules (``_rules.py``) -> compiled core (the generic functions ``ad.sin``...) ->
taylor (this module), beside ``functional.py``. Nothing here restates a derivative: every
elementary function propagates series through the partial-derivative expressions of the rule
table, compiled by ``_expressions.compile_rule`` against easyad's generic namespace (whose
``ad.sin`` etc. call back the :class:`Taylor` methods of the same names).

A :class:`Taylor` holds the normalised coefficients ``c_i = u^(i)(t0) / i!`` of a quantity u
along one variable t, truncated after order k. For ``z = f(x)`` with the table's partial
``p(x, z) = f'(x)``, ``z' = p * x'`` gives, coefficient by coefficient,
``z_m = (1/m) sum_{j=1..m} j x_j p_{m-j}``, where the partial's series is evaluated on the
series truncated to order m - 1 (if p uses z, z is built one order at a time first; if not,
p is evaluated once at order k - 1). Binary rules add ``y_j q_{m-j}`` for the second partial.
Only + - * / (and integer powers, which are products) have direct O(k^2) formulas.
"""
from __future__ import annotations

import functools
import numbers
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import numpy as np
from numpy.typing import ArrayLike, NDArray

from easyad import _core, _expr, _expressions, _rules
from easyad._core import Record, Trace

__all__ = ["Taylor", "taylor"]

Coefficients: TypeAlias = NDArray[np.float64]
_PLAIN_REAL = (int, float, np.integer, np.floating, np.bool_)
_MAX_INTEGER_POWER = 2 ** 20  # larger constant exponents go through the table's pow rule


def _is_plain_real(value: object) -> bool:
    return isinstance(value, _PLAIN_REAL) or (
        isinstance(value, numbers.Real) and not isinstance(value, np.ndarray))


class Taylor:
    """A truncated Taylor series: the value and scaled derivatives of a quantity along t.

    ``coefficients[i]`` is the i-th derivative with respect to t at the expansion point,
    divided by i!; the series is exact up to its order k = ``len(coefficients) - 1``. Taylors
    work with ``+ - * / **`` (plain numbers on either side), comparisons (of values, like
    Trace), and every generic function ``ad.sin``, ``ad.pow``... (as methods of the same
    names, from the rule table). Combining two series keeps the smaller order. For a binary
    generic function with a plain number first, make it a series: the core asks the first
    operand, so write ``ad.atan2(Taylor.constant(1.0, k), t)``, not ``ad.atan2(1.0, t)``
    (operators such as ``2.0 ** t`` work either way).

    Parameters
    ----------
    coefficients : array_like
        The 1-D, non-empty coefficients ``[u(t0), u'(t0), u''(t0)/2, ...]``.

    Examples
    --------
    >>> import easyad as ad
    >>> t = ad.Taylor.variable(0.0, order=4)
    >>> ad.exp(t).coefficients      # 1, 1, 1/2, 1/6, 1/24
    array([1.        , 1.        , 0.5       , 0.16666667, 0.04166667])
    >>> (ad.sin(t) / (1.0 + t)).derivatives()[:3]
    array([ 0.,  1., -2.])
    """

    __slots__ = ("_c",)
    _is_taylor_series = True   # how user primitives (primitives.py) spot a series
    __hash__ = None  # type: ignore[assignment]  # == compares values, as for Trace

    def __init__(self, coefficients: ArrayLike) -> None:
        c = np.array(coefficients, dtype=np.float64)
        if c.ndim != 1 or c.size == 0:
            raise ValueError(f"Taylor coefficients must be a non-empty 1-D sequence, "
                             f"got shape {c.shape}")
        self._c = c

    @classmethod
    def _of(cls, c: Coefficients) -> Taylor:
        t = object.__new__(cls)
        t._c = c
        return t

    @classmethod
    def variable(cls, x0: float, order: int) -> Taylor:
        """The series of t itself at t0 = x0: ``[x0, 1, 0, ..., 0]`` (order + 1 terms).

        >>> Taylor.variable(2.0, order=2).coefficients
        array([2., 1., 0.])
        """
        c = np.zeros(_check_order(order) + 1)
        c[0] = _real(x0, "x0")
        if order > 0:
            c[1] = 1.0
        return cls._of(c)

    @classmethod
    def constant(cls, value: float, order: int) -> Taylor:
        """A constant series: ``[value, 0, ..., 0]`` (order + 1 terms).

        >>> Taylor.constant(3.0, order=2).coefficients
        array([3., 0., 0.])
        """
        c = np.zeros(_check_order(order) + 1)
        c[0] = _real(value, "value")
        return cls._of(c)

    @property
    def coefficients(self) -> Coefficients:
        """The normalised coefficients ``u^(i)(t0) / i!`` (a read-only view)."""
        view: Coefficients = self._c.view()
        view.flags.writeable = False
        return view

    @property
    def number(self) -> float:
        """The value, the constant coefficient (as ``Trace.number``)."""
        return float(self._c[0])

    @property
    def order(self) -> int:
        """The highest power of the series."""
        return self._c.size - 1

    def derivatives(self) -> Coefficients:
        """The derivatives ``u^(i)(t0)``, i = 0..order: the coefficients times i!.

        >>> (Taylor.variable(3.0, order=3) ** 3).derivatives()
        array([27., 27., 18.,  6.])
        """
        factorials = np.cumprod(np.maximum(np.arange(self._c.size, dtype=np.float64), 1.0))
        return self._c * factorials

    def truncate(self, order: int) -> Taylor:
        """The same series cut after ``order`` (at most the current order).

        >>> Taylor([1.0, 2.0, 3.0]).truncate(1).coefficients
        array([1., 2.])
        """
        if not 0 <= order <= self.order:
            raise ValueError(f"cannot truncate a series of order {self.order} to order {order}")
        return self._of(self._c[:order + 1])

    def __repr__(self) -> str:
        return f"Taylor({self._c.tolist()!r})"

    # ---- operands ----

    def _operand(self, other: object) -> Coefficients | None:
        """other's coefficients, truncated to this order (None: not a number we know)."""
        if isinstance(other, Taylor):
            return other._c
        if _is_plain_real(other):
            c = np.zeros(self._c.size)
            c[0] = float(other)  # type: ignore[arg-type]
            return c
        if isinstance(other, (Trace, Record)):
            raise TypeError(f"cannot combine a Taylor with a {type(other).__name__}: Taylor "
                            f"mode does not mix with forward (Trace) or reverse (Record) mode")
        return None

    def _pair(self, other: object) -> tuple[Coefficients, Coefficients] | None:
        b = self._operand(other)
        if b is None:
            return None
        k = min(self._c.size, b.size)
        return self._c[:k], b[:k]

    # ---- arithmetic: direct O(k^2) formulas ----

    def __add__(self, other: object) -> Taylor:
        pair = self._pair(other)
        if pair is None:
            return NotImplemented
        return self._of(pair[0] + pair[1])

    __radd__ = __add__

    def __sub__(self, other: object) -> Taylor:
        pair = self._pair(other)
        if pair is None:
            return NotImplemented
        return self._of(pair[0] - pair[1])

    def __rsub__(self, other: object) -> Taylor:
        pair = self._pair(other)
        if pair is None:
            return NotImplemented
        return self._of(pair[1] - pair[0])

    def __mul__(self, other: object) -> Taylor:
        pair = self._pair(other)
        if pair is None:
            return NotImplemented
        a, b = pair
        return self._of(_cauchy(a, b))

    __rmul__ = __mul__

    def __truediv__(self, other: object) -> Taylor:
        pair = self._pair(other)
        if pair is None:
            return NotImplemented
        return self._of(_divide(*pair))

    def __rtruediv__(self, other: object) -> Taylor:
        pair = self._pair(other)
        if pair is None:
            return NotImplemented
        return self._of(_divide(pair[1], pair[0]))

    def __neg__(self) -> Taylor:
        return self._of(-self._c)

    def __pos__(self) -> Taylor:
        return self

    def __abs__(self) -> Taylor:
        return self._apply("abs", (self,))

    def __pow__(self, other: object, mod: None = None) -> Taylor:
        b = self._operand(other)
        if b is None:
            return NotImplemented
        return _power(self, self._of(b) if not isinstance(other, Taylor) else other)

    def __rpow__(self, other: object, mod: None = None) -> Taylor:
        b = self._operand(other)
        if b is None:
            return NotImplemented
        return _power(self._of(b), self)

    # ---- comparisons look at values, as for Trace and Record ----

    def _number_of(self, other: object) -> float | None:
        if isinstance(other, Taylor):
            return other.number
        b = self._operand(other)
        return None if b is None else float(b[0])

    def __lt__(self, other: object) -> bool:
        v = self._number_of(other)
        return NotImplemented if v is None else self.number < v

    def __le__(self, other: object) -> bool:
        v = self._number_of(other)
        return NotImplemented if v is None else self.number <= v

    def __gt__(self, other: object) -> bool:
        v = self._number_of(other)
        return NotImplemented if v is None else self.number > v

    def __ge__(self, other: object) -> bool:
        v = self._number_of(other)
        return NotImplemented if v is None else self.number >= v

    def __eq__(self, other: object) -> bool:
        v = self._number_of(other)
        return NotImplemented if v is None else self.number == v

    def __ne__(self, other: object) -> bool:
        v = self._number_of(other)
        return NotImplemented if v is None else self.number != v

    def __bool__(self) -> bool:
        return self.number != 0.0

    # ---- the rule table ----

    def _apply(self, name: str, operands: tuple[Taylor, ...]) -> Taylor:
        return _apply_rule(_rules.RULES_BY_NAME[name], operands)

    def _binary(self, name: str, other: object) -> Taylor:
        b = self._operand(other)
        if b is None:
            raise TypeError(f"{name}() of a Taylor takes a number or a Taylor, "
                            f"got {type(other).__name__}")
        return self._apply(name, (self, other if isinstance(other, Taylor) else self._of(b)))


def _real(value: object, what: str) -> float:
    if not _is_plain_real(value):
        raise TypeError(f"{what} must be a real number, got {type(value).__name__}")
    return float(value)  # type: ignore[arg-type]


def _check_order(order: object) -> int:
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)):
        raise TypeError(f"order must be an int, got {type(order).__name__}")
    if order < 0:
        raise ValueError(f"order must be >= 0, got {order}")
    return int(order)


def _divide(a: Coefficients, b: Coefficients) -> Coefficients:
    """Series division a / b: q_m = (a_m - sum_{j=1..m} b_j q_{m-j}) / b_0."""
    if b[0] == 0.0:
        raise ZeroDivisionError("division by a Taylor series whose value is 0")
    q = np.empty(a.size)
    q[0] = a[0] / b[0]
    for m in range(1, a.size):
        q[m] = (a[m] - np.dot(b[1:m + 1], q[m - 1::-1])) / b[0]
    return q


def _power(x: Taylor, y: Taylor) -> Taylor:
    """x ** y: repeated products for a constant integer exponent, else the table's pow."""
    k = min(x.order, y.order)
    exponent = y.number
    if not y._c[1:k + 1].any() and exponent.is_integer() and abs(exponent) <= _MAX_INTEGER_POWER:
        # the value first, exactly as floats give it: at a zero base and a negative
        # exponent it raises ad.PowDomainError, as every engine does (not the series
        # division's ZeroDivisionError)
        value = _core.pow(x.number, exponent)
        n = int(exponent)
        result = np.zeros(k + 1)
        result[0] = 1.0
        base = x._c[:k + 1]
        for bit in bin(abs(n))[2:]:  # square and multiply, most significant bit first
            result = np.convolve(result, result)[:k + 1]
            if bit == "1":
                result = np.convolve(result, base)[:k + 1]
        if n < 0:
            one = np.zeros(k + 1)
            one[0] = 1.0
            result = _divide(one, result)
        result[0] = value
        return Taylor._of(result)
    return _apply_rule(_rules.RULES_BY_NAME["pow"], (x, y))


# ---- series through the rule table ------------------------------------------------------

def _is_zero_series(t: Any) -> bool:
    if isinstance(t, Taylor):
        return not t._c.any()
    return _expressions.number_of(t) == 0.0


def _cauchy(a: Coefficients, b: Coefficients) -> Coefficients:
    """The Cauchy product of two series, each term with the strong zero of the other modes
    (docs/conventions.md): a coefficient that is 0 times inf or NaN contributes 0, so
    0 * sqrt(x) at 0 has the derivatives 0, as in forward and reverse mode."""
    with np.errstate(invalid="ignore"):   # 0 * inf: set to 0 just below
        terms = np.multiply.outer(a, b)
    terms[(a == 0.0)[:, None] | (b == 0.0)[None, :]] = 0.0
    n = a.size
    return np.array([np.trace(terms[:, ::-1], offset=n - 1 - m) for m in range(n)])


@functools.lru_cache(maxsize=1)
def _namespace() -> Mapping[str, Any]:
    """The generic namespace, with the strong-zero helpers judging whole series."""
    return _expressions.series_namespace(_is_zero_series)


@functools.lru_cache(maxsize=None)
def _compiled(rule: _rules.Rule) -> tuple[tuple[Callable[..., Any], ...], tuple[bool, ...]]:
    """The rule's partials as callables over Taylors, and which of them read z."""
    compiled = _expressions.compile_rule(rule, _namespace())
    uses_z = tuple("z" in _expr.variables(p) for p in rule.partials)
    return compiled.partials, uses_z


def _series_of(result: Any, order: int) -> Coefficients:
    if isinstance(result, Taylor):
        return result._c[:order + 1]
    c = np.zeros(order + 1)
    c[0] = _expressions.number_of(result)
    return c


def _apply_rule(rule: _rules.Rule, operands: tuple[Taylor, ...]) -> Taylor:
    """z = rule(*operands) as a series: the value from the core, the rest from the partials.

    Where a partial cannot be evaluated as a series (a derivative that is infinite or
    undefined at the point, like sqrt's at 0) the first derivative is the core's (forward
    mode: sqrt'(0) = +inf, docs/conventions.md) and the coefficients after it are NaN;
    the value itself raises as on floats.
    """
    k = min(t.order for t in operands)
    z = np.zeros(k + 1)
    z[0] = getattr(_core, rule.name)(*(t.number for t in operands))
    partials, uses_z = _compiled(rule)
    active = [i for i, t in enumerate(operands) if t._c[1:k + 1].any() or
              np.isnan(t._c[1:k + 1]).any()]
    if k == 0 or not active:
        return Taylor._of(z)
    args: list[Any] = [None, None]  # (x, y): y is None for unary rules

    def evaluate(i: int, order: int) -> Coefficients:
        for position, t in enumerate(operands):
            args[position] = t.truncate(order)
        zz = Taylor._of(z[:order + 1]) if uses_z[i] else None
        return _series_of(partials[i](args[0], args[1], zz), order)

    # partials that do not read z: once at order k - 1 (order by order only after a failure)
    cache: dict[int, Coefficients] = {}
    for i in active:
        if not uses_z[i]:
            try:
                cache[i] = evaluate(i, k - 1)
            except (ArithmeticError, ValueError):
                pass
    for m in range(1, k + 1):
        total = 0.0
        try:
            for i in active:
                p = cache.get(i)
                if p is None or p.size < m:
                    p = cache[i] = evaluate(i, m - 1)
                x = operands[i]._c
                j = np.arange(1, m + 1)
                with np.errstate(invalid="ignore"):   # inf * 0: NaN, then below
                    total += float(np.dot(j * x[1:m + 1], p[m - 1::-1][:m]))
        except (ArithmeticError, ValueError):
            z[m:] = np.nan
            if m == 1:   # the first derivative as forward mode gives it (tangents x1)
                traces = [_core.Trace(float(t._c[0]), float(t._c[1])) for t in operands]
                z[1] = getattr(_core, rule.name)(*traces).derivative
            break
        z[m] = total / m
    return Taylor._of(z)


def _unary_method(rule: _rules.Rule, name: str) -> Callable[[Taylor], Taylor]:
    def method(self: Taylor) -> Taylor:
        return _apply_rule(rule, (self,))

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"{rule.doc} of the series (rule {rule.name!r} of the table)."
    return method


def _binary_method(rule: _rules.Rule, name: str) -> Callable[[Taylor, object], Taylor]:
    def method(self: Taylor, other: object) -> Taylor:
        if rule.name == "pow":
            return self.__pow__(other)
        return self._binary(rule.name, other)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"{rule.doc} of the series (rule {rule.name!r} of the table)."
    return method


def _reflected_method(rule: _rules.Rule) -> Callable[[Taylor, object], Taylor]:
    # ad.<rule>(number, series): the generic function asks the second operand for
    # _r<name> (polygamma(1.0, x) in digamma's partial, on a series x)
    def method(self: Taylor, other: object) -> Taylor:
        a = self._operand(other)
        if a is None:
            raise TypeError(f"{rule.name}() of a Taylor takes a number or a Taylor, "
                            f"got {type(other).__name__}")
        return self._apply(rule.name, (self._of(a), self))

    method.__name__ = method.__qualname__ = f"_r{rule.name}"
    return method


for _rule in _rules.RULES:
    if _rule.generic:  # not an operator-only row
        for _name in (_rule.name, *_rule.aliases):
            setattr(Taylor, _name, (_unary_method if _rule.arity == 1 else _binary_method)(
                _rule, _name))
        if _rule.arity == 2 and _rule.name != "pow":
            setattr(Taylor, f"_r{_rule.name}", _reflected_method(_rule))
del _rule, _name


def taylor(f: Callable[..., Any], x0: float, order: int, *args: Any) -> Coefficients:
    """The derivatives of order 0..k of a scalar function, in one pass of Taylor series.

    Parameters
    ----------
    f : callable
        ``f(x, *args)`` of a scalar x (it receives a :class:`Taylor`), returning a number.
        Written with operators and the generic functions (``ad.sin``...), as for Traces.
    x0 : float
        The expansion point.
    order : int
        k >= 0, the highest derivative wanted.

    Returns
    -------
    ndarray, shape (k + 1,)
        Index i holds the i-th derivative f^(i)(x0); index 0 is f(x0). (The normalised
        coefficients f^(i)(x0) / i! are ``f(Taylor.variable(x0, k)).coefficients``.)
        The first derivative follows docs/conventions.md as in every mode (sqrt'(0) =
        +inf; 0 * sqrt(x) has derivative 0); higher derivatives that are infinite or
        undefined at x0 (sqrt at 0) come out NaN.

    Examples
    --------
    >>> import easyad as ad
    >>> ad.taylor(ad.sin, 0.0, order=5)
    array([ 0.,  1.,  0., -1.,  0.,  1.])
    >>> ad.taylor(lambda x: x ** 3 + 1, 2.0, order=4)
    array([ 9., 12., 12.,  6.,  0.])
    """
    t = Taylor.variable(_real(x0, "x0"), _check_order(order))
    result = f(t, *args)
    if isinstance(result, np.ndarray) and result.ndim == 0:
        result = result[()]
    if isinstance(result, Taylor):
        return result.derivatives()
    if _is_plain_real(result):
        return Taylor.constant(float(result), order).derivatives()
    name = getattr(f, "__name__", type(f).__name__)
    raise TypeError(f"{name} must return a number (a Taylor or a plain real), "
                    f"got {type(result).__name__}")
