"""numpy's and scipy.special's ufuncs on easyad's numbers (Trace, Record, NestedTrace).

Sits above the compiled core, beside ``numeric.py``: the core's classes call
``array_ufunc`` from their ``__array_ufunc__`` (the service "numpy.array_ufunc", registered
here, since the core imports no layer above it). A ufunc that computes a row of the rule
table (numpy's spelling of the row, or scipy.special's function of the row's name or an
alias: ``expit``, ``gammaln``, ``psi``, ``xlogy``...) runs the row's generic function
``ad.<name>``, so it is differentiated in every mode; on arrays (an ndarray among the
operands) element by element, giving an object array as numpy's object loops do. Any
other ufunc, or a call with keywords (``out=``...), runs as numpy runs it without easyad:
its loop over objects, which calls the elements' operators and methods.
"""
from __future__ import annotations

import functools
import sys
from typing import Any

import numpy as np

from easyad import _core
from easyad import _rules as rules


@functools.lru_cache(maxsize=2)
def _functions(with_scipy: bool) -> dict[Any, Any]:
    """{ufunc: the generic function of its row}: numpy's ufuncs named by the rows, and
    with scipy.special imported, scipy's ufuncs named by a row's name or alias."""
    found: dict[Any, Any] = {}
    special = sys.modules.get("scipy.special") if with_scipy else None
    for rule in rules.RULES:
        if not rule.generic or rule.stops_gradient:
            continue          # operators: numpy's object loop calls them; np.positive
            #                   computes stop_gradient's value but passes derivatives
        function = getattr(_core, rule.name)
        spelling = rule.spelling("numpy")
        if spelling is not None and isinstance(getattr(np, spelling, None), np.ufunc):
            found[getattr(np, spelling)] = function
        for name in (rule.name, *rule.aliases):
            ufunc = getattr(special, name, None) if special is not None else None
            if isinstance(ufunc, np.ufunc) and ufunc.nin == rule.arity:
                found.setdefault(ufunc, function)
    return found


def _plain(value: Any) -> Any:
    # a numpy scalar as a Python number: np.float64(2) * trace must not come back here
    return value.item() if isinstance(value, np.generic) else value


def _objects(value: Any) -> Any:
    """An easyad number as a 0-d object array, a numeric array as an object array of
    Python numbers: the operands of numpy's loops over objects."""
    if isinstance(value, np.ndarray):
        return value if value.dtype.kind == "O" else value.astype(object)
    if isinstance(value, (_core.Trace, _core.Record)):
        boxed = np.empty((), dtype=object)
        boxed[()] = value
        return boxed
    return value


def array_ufunc(ufunc: Any, method: str, inputs: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
    """What ``ufunc(*inputs)`` (``method`` "__call__") gives with an easyad number among
    the inputs: the row's generic function, elementwise over arrays; other ufuncs and
    methods through numpy's loops over objects."""
    function = None
    if method == "__call__" and not kwargs:
        function = _functions("scipy.special" in sys.modules).get(ufunc)
    if function is not None:
        if not any(isinstance(v, np.ndarray) for v in inputs):
            return function(*(_plain(v) for v in inputs))
        return np.frompyfunc(function, len(inputs), 1)(*(_objects(v) for v in inputs))
    result = getattr(ufunc, method)(*(_objects(v) for v in inputs), **kwargs)
    if isinstance(result, np.ndarray) and result.ndim == 0 and result.dtype.kind == "O":
        return result[()]
    return result


_core._register_service("numpy.array_ufunc", array_ufunc)
