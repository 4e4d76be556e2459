"""The Numeric protocol: what generic easyad code may use, whatever number kind it gets.

A function written against these protocols (operators, comparisons and the generic
functions ``ad.sin``, ``ad.exp``...) runs unchanged on floats, ints, numpy arrays, Traces
(forward mode) and Records (reverse mode). Sits above the compiled core.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Numeric(Protocol):
    """Closed under + - * / ** and negation, with plain numbers on either side.

    >>> import easyad as ad
    >>> all(isinstance(v, ad.Numeric) for v in (1.5, ad.Trace.variable(1.0),
    ...                                         ad.WengertList().variable(1.0)))
    True
    >>> isinstance("1.5", ad.Numeric)
    False
    """

    def __add__(self, other: Any, /) -> Any: ...
    def __radd__(self, other: Any, /) -> Any: ...
    def __sub__(self, other: Any, /) -> Any: ...
    def __rsub__(self, other: Any, /) -> Any: ...
    def __mul__(self, other: Any, /) -> Any: ...
    def __rmul__(self, other: Any, /) -> Any: ...
    def __truediv__(self, other: Any, /) -> Any: ...
    def __rtruediv__(self, other: Any, /) -> Any: ...
    def __pow__(self, other: Any, /) -> Any: ...
    def __neg__(self) -> Any: ...


@runtime_checkable
class Real(Numeric, Protocol):
    """A Numeric that is ordered and has an absolute value: what branches and ad.abs need.

    The elementary functions are the generic ``ad.sin(x)``..., defined for every Real.

    >>> import easyad as ad
    >>> def relu(x: ad.Real) -> ad.Real:
    ...     return x if x > 0 else 0.0 * x
    >>> relu(ad.Trace.variable(2.0)).derivative, relu(-1.0)
    (1.0, -0.0)
    """

    def __lt__(self, other: Any, /) -> Any: ...
    def __le__(self, other: Any, /) -> Any: ...
    def __gt__(self, other: Any, /) -> Any: ...
    def __ge__(self, other: Any, /) -> Any: ...
    def __abs__(self) -> Any: ...


__all__ = ["Numeric", "Real"]
