"""User-defined operations: a scalar function with its derivatives, usable in every mode.

(Array operations, ``ad.define(name, f, vjp=...)``, are made by the tensor layer's
``ArrayPrimitive``, ``easyad/tensor/_custom.py``, which registers itself here.)

``ad.define(name, f, df, d2f=None)`` (or the ``@ad.primitive(derivative=df)`` decorator)
makes an operation that runs on floats, Traces (forward), Records (one tape entry with
cached partials, as a table rule's), replayed Functions (a registered callback), recorded
backward sweeps (``create_graph``), Hessians and nested Traces (Trace of Trace, Trace of
Record) when ``d2f`` is given, and Taylor series (``ad.taylor``: the derivative functions
are called on the series when written with easyad operations, else on floats, which gives
orders up to the derivatives given). ``derivative=
"numeric"`` differentiates a black box by central differences (approximate, documented).
Built on the public core plus the tape's ``_push_custom`` hook.
"""
from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from easyad import _core
from easyad._core import NestedTrace, Record, Trace

_Partials = Callable[..., Any]


def _real(v: Any) -> float | None:
    # plain real numbers only: float() would also take a string, or read a one-element
    # tensor and drop its derivative silently
    if isinstance(v, numbers.Real) or (isinstance(v, np.ndarray) and v.ndim == 0
                                       and v.dtype.kind in "biuf"):
        return float(v)
    return None


def _central(g: Callable[..., Any], xs: tuple[float, ...], k: int) -> tuple[Any, Any, float]:
    """g at xs moved up and down along argument k, and the step (~ cbrt(eps) * |x_k|)."""
    h = 6e-6 * max(1.0, abs(xs[k]))
    up, down = list(xs), list(xs)
    up[k] += h
    down[k] -= h
    return g(*up), g(*down), h


def _numeric_first(f: Callable[..., float], arity: int) -> _Partials:
    # central differences: error ~ 1e-10 relative
    def df(*xs: float) -> Any:
        out = []
        for k in range(arity):
            hi, lo, h = _central(f, xs, k)
            out.append((hi - lo) / (2 * h))
        return out[0] if arity == 1 else tuple(out)
    return df


def _numeric_second(df: _Partials, arity: int) -> _Partials:
    def d2f(*xs: float) -> Any:
        rows = []
        for k in range(arity):
            hi, lo, h = _central(df, xs, k)
            hi = (hi,) if arity == 1 else hi
            lo = (lo,) if arity == 1 else lo
            rows.append([(a - b) / (2 * h) for a, b in zip(hi, lo)])
        return rows[0][0] if arity == 1 else tuple(tuple(r) for r in rows)
    return d2f


class Primitive:
    """A user-defined scalar operation of one or two arguments (see ``ad.define``).

    Examples
    --------
    >>> import math, easyad as ad
    >>> cube = ad.Primitive("cube", lambda t: t ** 3, lambda t: 3 * t * t, lambda t: 6 * t)
    >>> cube.arity, cube(ad.Trace.variable(2.0)).derivative
    (1, 12.0)
    >>> ad.record(lambda x: cube(x[0]), [1.0]).hessian([2.0])
    array([[12.]])
    """

    def __init__(self, name: str, f: Callable[..., float], df: _Partials | str | None,
                 d2f: _Partials | None = None, arity: int | None = None) -> None:
        if not callable(f):
            raise TypeError(f"f must be callable, got {type(f).__name__}")
        if arity is None:
            params = [p for p in inspect.signature(f).parameters.values()
                      if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                             p.POSITIONAL_OR_KEYWORD)]
            arity = len(params)
        if arity not in (1, 2):
            raise ValueError(f"primitive {name!r} must take 1 or 2 arguments, f takes {arity}")
        self.name = name
        self.f = f
        self.arity = arity
        self.numeric = df == "numeric"
        if df == "numeric":
            df = _numeric_first(f, arity)
            if d2f is None:
                d2f = _numeric_second(df, arity)
        elif df is not None and not callable(df):
            raise TypeError(f"df must be callable or 'numeric', got {df!r}")
        self.df = df
        self.d2f = d2f
        self.__doc__ = getattr(f, "__doc__", None)
        self.__name__ = name

    def __repr__(self) -> str:
        return f"<easyad primitive {self.name!r} of {self.arity} argument(s)>"

    def __reduce__(self) -> Any:
        return (Primitive, (self.name, self.f, "numeric" if self.numeric else self.df,
                            None if self.numeric else self.d2f, self.arity))

    # ---- derivatives as plain numbers ----
    def _need(self, order: int) -> _Partials:
        rule = self.df if order == 1 else self.d2f
        if rule is None:
            raise self._missing(order)
        return rule

    def _partials(self, *xs: float) -> tuple[float, ...]:
        d = self._need(1)(*xs)
        return (float(d),) if self.arity == 1 else tuple(float(v) for v in d)

    def _replay(self, x: float, y: float) -> tuple[float, float, float]:
        args = (x,) if self.arity == 1 else (x, y)
        partials = self._partials(*args) + (0.0,)
        return float(self.f(*args)), partials[0], partials[1]

    def _replay_second(self, x: float, y: float) -> tuple[float, float, float] | None:
        if self.d2f is None:
            return None
        if self.arity == 1:
            return float(self.d2f(x)), 0.0, 0.0
        (hxx, hxy), (_, hyy) = self.d2f(x, y)
        return float(hxx), float(hxy), float(hyy)

    def _partial_records(self, x: Any, y: Any) -> tuple[Any, ...]:
        """The partials as differentiable values (for create_graph): primitives of d2f."""
        d2f = self._need(2)
        if self.arity == 1:
            return (Primitive(f"{self.name}'", self._need(1), d2f, None, 1)(x),)
        first = [Primitive(f"d{self.name}/d{k}", (lambda a, b, k=k: self._partials(a, b)[k]),
                           (lambda a, b, k=k: tuple(d2f(a, b)[k])), None, 2)
                 for k in range(2)]
        return first[0](x, y), first[1](x, y)

    def _derived(self, k: int) -> Primitive:
        """d f / d x_k as a Primitive of its own: its derivative is row k of d2f (None
        when d2f was not given: using it then raises, naming this primitive's d2f)."""
        first = self._need(1)
        d2f = self.d2f
        if self.arity == 1:
            partial: Callable[..., Any] = first
            second: _Partials | None = d2f
        else:
            def partial(a: Any, b: Any) -> Any:
                return first(a, b)[k]
            second = None if d2f is None else (lambda a, b: tuple(d2f(a, b)[k]))
        return _DerivedPrimitive(self, k, partial, second)

    def _missing(self, order: int) -> ValueError:
        which = "derivative (df)" if order == 1 else "second derivative (d2f)"
        return ValueError(f"primitive {self.name!r} has no {which}; pass it to ad.define "
                          f"or ad.primitive, or use derivative='numeric'")

    # ---- nested Traces: the chain rule one level at a time ----
    def _nested(self, args: tuple[Any, ...]) -> Any:
        # f(p + d eps) = f(p) + f'(p) d eps, with p and d of the level below (Traces or
        # Records); f' is itself a Primitive, so the levels below differentiate it too
        primals = [a.number if type(a) is NestedTrace else a for a in args]
        tangents = [a.derivative if type(a) is NestedTrace else 0.0 for a in args]
        value = self(*primals)
        tangent: Any = 0.0
        for k, d in enumerate(tangents):
            if isinstance(d, (int, float)) and d == 0.0:
                continue   # a constant at this level
            tangent = tangent + self._derived(k)(*primals) * d
        return Trace(value, tangent)

    # ---- Taylor series: z' = sum_k f_k(u) u_k', coefficient by coefficient ----
    def _series(self, args: tuple[Any, ...]) -> Any:
        from easyad.taylor import Taylor
        if any(isinstance(a, (Trace, Record)) for a in args):
            raise TypeError(f"{self.name}(): a Taylor series does not mix with forward "
                            f"(Trace) or reverse (Record) mode")
        order = min(a.order for a in args if isinstance(a, Taylor))
        us = [a.truncate(order) if isinstance(a, Taylor) else Taylor.constant(a, order)
              for a in args]
        z = [float(self.f(*(u.number for u in us)))]
        active = [k for k, u in enumerate(us) if order and u.coefficients[1:].any()]
        if not active:
            return Taylor.constant(z[0], order)
        below = [u.truncate(order - 1) for u in us]
        partials = {k: self._partial_series(k, below).coefficients for k in active}
        for m in range(1, order + 1):
            j = range(1, m + 1)
            z.append(sum(sum(i * us[k].coefficients[i] * partials[k][m - i] for i in j)
                         for k in active) / m)
        return Taylor(z)

    def _partial_series(self, k: int, us: list[Any]) -> Any:
        """The series of d f / d x_k at the series ``us``: df itself on the series when it
        is written with easyad operations (exact to any order), else the derived primitive
        on floats, one order at a time down to the derivatives given."""
        from easyad.taylor import Taylor
        first = self._need(1)
        if not self.numeric and us[0].order > 0:
            try:
                d = first(*us)
                d = d if self.arity == 1 else d[k]
                if isinstance(d, Taylor):
                    return d
                return Taylor.constant(float(d), us[0].order)   # a constant derivative
            except TypeError:
                pass   # df calls math on floats: go on with the derived primitive
        return self._derived(k)._series(tuple(us))

    # ---- the operation, in every mode ----
    def __call__(self, *args: Any) -> Any:
        if len(args) != self.arity:
            raise TypeError(f"{self.name}() takes {self.arity} argument(s), got {len(args)}")
        if any(type(a) is NestedTrace for a in args):
            return self._nested(args)
        if any(getattr(type(a), "_is_taylor_series", False) for a in args):
            return self._series(args)
        numbers = [a.number if isinstance(a, (Trace, Record)) else _real(a) for a in args]
        if any(v is None for v in numbers):
            bad = next(a for a, v in zip(args, numbers) if v is None)
            raise TypeError(f"{self.name}() takes numbers, Traces or Records, got "
                            f"{type(bad).__name__}; an operation on arrays or Tensors is "
                            f"made with ad.primitive(vjp=...) (see ad.ArrayPrimitive)")
        xs = [float(v) for v in numbers]  # type: ignore[arg-type]
        kinds = {type(a) for a in args if isinstance(a, (Trace, Record))}
        if len(kinds) > 1:
            raise TypeError(f"{self.name}(): forward mode (Trace) and reverse mode (Record) "
                            f"do not mix")
        value = float(self.f(*xs))
        if not kinds:
            return value
        partials = self._partials(*xs)
        if Trace in kinds:
            tangent = 0.0
            for a, p in zip(args, partials):
                if isinstance(a, Trace) and a.derivative != 0.0 and p != 0.0:
                    tangent += p * a.derivative
            return Trace(value, tangent)
        records = [a if isinstance(a, Record) else None for a in args]
        tapes = {r.tape for r in records if r is not None and r.tape is not None}
        if len(tapes) > 1:
            from easyad.errors import TapeMismatchError
            raise TapeMismatchError(f"{self.name}() mixes records of two different lists")
        if not tapes:
            return Record.constant(value)
        tape = tapes.pop()
        index = [r.index if r is not None and r.tape is not None else -1 for r in records]
        index += [-1] * (2 - len(index))
        slots = [partials[k] if index[k] >= 0 else xs[k] for k in range(self.arity)]
        slots += [0.0] * (2 - len(slots))
        return tape._push_custom(self, index[0], index[1], value, slots[0], slots[1])


def _carries_derivatives(value: Any) -> bool:
    return isinstance(value, (Trace, Record)) or getattr(type(value), "_is_taylor_series", False)


class _DerivedPrimitive(Primitive):
    """A partial derivative of a user primitive, as an operation (nested Traces, Taylor
    series); a derivative it lacks is named after the primitive the user defined."""

    def __init__(self, parent: Primitive, k: int, f: Callable[..., float],
                 df: _Partials | None) -> None:
        name = f"d{parent.name}/d{k}" if parent.arity == 2 else f"{parent.name}'"
        super().__init__(name, f, df, None, parent.arity)
        self.parent, self.k, self.numeric = parent, k, parent.numeric
        self.root: Primitive = parent.root if isinstance(parent, _DerivedPrimitive) else parent

    def __call__(self, *args: Any) -> Any:
        if self.df is None and not self.numeric and any(_carries_derivatives(a) for a in args):
            # the last derivative given: written with easyad operations, it differentiates
            # itself (a third derivative from d2f(Trace of Traces)); calling math raises
            try:
                return self.f(*args)
            except TypeError:
                raise self._missing(2) from None
        return super().__call__(*args)

    def __reduce__(self) -> Any:
        # (a Trace of Records puts it on the tape) made again from the user's primitive
        return (_derived_of, (self.parent, self.k))

    def _missing(self, order: int) -> ValueError:
        return ValueError(
            f"primitive {self.root.name!r}: this mode needs a derivative of higher order than "
            f"ad.define was given (df, d2f on floats): write df/d2f with easyad operations "
            f"(ad.exp, ad.sin, + - * /...) so they take Traces and Taylor series, or use a "
            f"lower order")


def _derived_of(parent: Primitive, k: int) -> Primitive:
    return parent._derived(k)


# the array primitives live in the tensor layer (easyad/tensor/_custom.py), above this
# module; it registers its class here at import, so define/primitive can make them
_ARRAY: list[Any] = []


def _register_array(cls: Any) -> None:
    _ARRAY[:] = [cls]


def _array_primitive(name: str, f: Callable[..., Any], vjp: Any, jvp: Any, shape: Any,
                     differentiable: bool) -> Any:
    if not _ARRAY:
        raise RuntimeError("easyad's array primitives are not registered: import easyad")
    return _ARRAY[0](name, f, vjp=vjp, jvp=jvp, shape=shape, differentiable=differentiable)


def define(name: str, f: Callable[..., Any], df: _Partials | str | None = None,
           d2f: _Partials | None = None, *, vjp: Any = None, jvp: Any = None,
           shape: Any = None, differentiable: bool = False, array: bool = False) -> Any:
    """Declare an operation with its derivative(s); works in every easyad mode.

    A scalar operation (a Primitive): ``df(x)`` returns f'(x) (for f(x, y): the pair of
    partials); ``d2f`` the second derivative (for two arguments: the 2x2 Hessian), needed
    by Hessians and ``create_graph``. ``df="numeric"`` uses central differences
    (approximate).

    An array operation (an ``ArrayPrimitive``, made when ``vjp``, ``jvp``, ``shape``,
    ``differentiable`` or ``array=True`` is given): ``f`` takes numpy arrays (any number of
    them; numbers too) and returns one array; ``vjp(g, *xs, out)`` returns one cotangent
    per input (None: central differences), ``jvp(tangents, *xs, out)`` the output's
    tangent (optional), ``shape(*specs)`` the output's shape for ``ad.eval_shape``
    (optional), ``differentiable=True``: the vjp is written with easyad operations, so
    second derivatives go through it. See ``ArrayPrimitive``.

    Examples
    --------
    >>> import math, easyad as ad
    >>> softplus = ad.define("softplus", lambda x: math.log1p(math.exp(x)),
    ...                      lambda x: 1 / (1 + math.exp(-x)))
    >>> lst = ad.WengertList()
    >>> x = lst.variable(0.0)
    >>> (softplus(x) * 2).derivatives()[x]
    1.0
    >>> import numpy as np
    >>> norm = ad.define("norm", lambda v: np.sqrt(np.sum(v * v)),
    ...                  vjp=lambda g, v, out: g * v / out)
    >>> ad.grad(lambda v: norm(v))([3.0, 4.0])
    array([0.6, 0.8])
    """
    if vjp is not None or jvp is not None or shape is not None or differentiable or array:
        if df is not None or d2f is not None:
            raise TypeError(f"primitive {name!r}: give df/d2f (a scalar operation) or "
                            f"vjp/jvp (an array operation), not both")
        return _array_primitive(name, f, vjp, jvp, shape, differentiable)
    return Primitive(name, f, df, d2f)


def primitive(derivative: _Partials | str | None = None, second: _Partials | None = None,
              name: str | None = None, *, vjp: Any = None, jvp: Any = None,
              shape: Any = None, differentiable: bool = False,
              array: bool = False) -> Callable[[Callable[..., Any]], Any]:
    """Decorator form of ``define``: ``@ad.primitive(derivative=df, second=d2f)`` for a
    scalar operation, ``@ad.primitive(vjp=..., jvp=..., differentiable=...)`` (or
    ``array=True``, then ``@f.defvjp``) for an array operation.

    Examples
    --------
    >>> import math, easyad as ad
    >>> @ad.primitive(derivative="numeric")
    ... def bessel_like(x):
    ...     return math.sin(x) / x
    >>> round(bessel_like(ad.Trace.variable(1.0)).derivative, 6)
    -0.301169
    >>> import numpy as np
    >>> @ad.primitive(array=True)
    ... def cumsum(x):
    ...     return np.cumsum(x)
    >>> @cumsum.defvjp
    ... def _(g, x, out):
    ...     return np.cumsum(g[::-1])[::-1]
    >>> ad.grad(lambda x: ad.sum(cumsum(x)))([1.0, 2.0, 3.0])
    array([3., 2., 1.])
    """
    def wrap(f: Callable[..., Any]) -> Any:
        return define(name or f.__name__, f, derivative, second, vjp=vjp, jvp=jvp,
                      shape=shape, differentiable=differentiable, array=array)
    return wrap


# unpickling a WengertList in the core checks its user primitives are Primitives
_core._register_service("primitives.Primitive", Primitive)

__all__ = ["Primitive", "define", "primitive"]
