"""Elementwise operations from the rule table: one kernel per rule for the value, one for
the adjoints, and comparisons.

The value expression, and ``mul0(g, partial)`` for the adjoint of each operand, are handed
to the device's backend, which compiles them (numpy namespace, or an OpenCL kernel). The
methods ``t.sin()``, ``t + u``... that call these are generated from the table
(``_rule_methods.py``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad import _expr, _rules
from easyad.tensor import _graph
from easyad.tensor import _shapes as shapes
from easyad.tensor._base import (BOOL, T, TensorBase, common_tape, fold, live_tape, operand,
                                 record, result_dtype, uses, wrap)


def _first_tensor(values: tuple[Any, ...]) -> TensorBase:
    for v in values:
        if isinstance(v, TensorBase):
            return v
    raise TypeError("a tensor operation needs at least one Tensor")


def unary(rule: _rules.Rule, t: T) -> T:
    """``rule`` applied to every element of ``t``, recorded with its vjp."""
    be, cls = t._backend, type(t)
    if t._dtype == BOOL:
        t = t.astype(np.float64)
    tape = live_tape(t)
    (z,) = be.map(rule.name, (rule.value,), {"x": t._data}, t._shape, (t._dtype,))
    if tape is None:
        return wrap(cls, be, z, t._shape, t._dtype)
    partial = rule.partials[0]
    saved = {n: v for n, v in (("x", t._data), ("z", z)) if uses(partial, n)}
    shape, dtype, label = t._shape, t._dtype, rule.name + "_vjp"
    expr = (f"mul0(g, {partial})",)

    def vjp(g: Any) -> tuple[Any]:
        return tuple(be.map(label, expr, {"g": g, **saved}, shape, (dtype,)))
    x_index, name = t._index, rule.name

    def graph(tape: Any, index: int, g: Any) -> tuple[Any]:
        x, out = (_graph.handle(cls, be, saved.get(n), shape, dtype, tape, i) if n in saved
                  else None for n, i in (("x", x_index), ("z", index)))
        partial = _graph.tensor_rules()[name].partials[0](x, 0.0, out)
        return (_graph.mul0(g, partial),)
    return record(cls, rule.name, be, z, shape, dtype, tape, (t._index,), vjp, graph)


def binary(rule: _rules.Rule, a: Any, b: Any) -> Any:
    """``rule`` of two operands (one at least a tensor) with broadcasting; NotImplemented
    for an operand tensors do not take."""
    first = _first_tensor((a, b))
    be, cls = first._backend, type(first)
    A, B = operand(a, be), operand(b, be)
    if A is None or B is None:
        return NotImplemented
    dtype = result_dtype([A, B])
    shape = shapes.broadcast(rule.name, A.shape, B.shape)
    tape = common_tape(rule.name, [A, B])
    (z,) = be.map(rule.name, (rule.value,), {"x": A.data, "y": B.data}, shape, (dtype,))
    if tape is None or not (A.needs_adjoint or B.needs_adjoint):
        return wrap(cls, be, z, shape, dtype)
    # (index, is a scalar): not the Operands, which hold the tape (a cycle through the vjp)
    wanted = [(k, o.dtype is None) for k, o in enumerate((A, B)) if o.needs_adjoint]
    partials = [rule.partials[k] for k, _ in wanted]
    values = {"x": A.data, "y": B.data, "z": z}
    saved = {n: v for n, v in values.items() if any(uses(p, n) for p in partials)}
    exprs = tuple("g" if _expr.constant(p) == 1.0 else f"mul0(g, {p})" for p in partials)
    label, target = rule.name + "_vjp", [A.shape, B.shape]

    def vjp(g: Any) -> tuple[Any, Any]:
        outs = be.map(label, exprs, {"g": g, **saved}, shape, (dtype,) * len(exprs))
        result: list[Any] = [None, None]
        for (k, scalar), c in zip(wanted, outs):
            result[k] = fold(be, c, shape, target[k], scalar)
        return result[0], result[1]
    parts = [(n, o.shape, o.dtype, o.index) for n, o in (("x", A), ("y", B))]
    name = rule.name

    def graph(tape: Any, index: int, g: Any) -> tuple[Any, Any]:
        x, y = (_graph.handle(cls, be, saved[n], s, dt, tape, i) if n in saved else 0.0
                for n, s, dt, i in parts)
        out = _graph.handle(cls, be, saved["z"], shape, dtype, tape, index) \
            if "z" in saved else None
        compiled = _graph.tensor_rules()[name]
        result: list[Any] = [None, None]
        for k, scalar in wanted:
            c = _graph.mul0(g, compiled.partials[k](x, y, out))
            result[k] = _graph.fold(c if scalar else _graph.as_tensor(c, cls, be, dtype),
                                    shape, target[k], scalar)
        return result[0], result[1]
    return record(cls, rule.name, be, z, shape, dtype, tape, (A.index, B.index), vjp, graph)


def compare(symbol: str, a: Any, b: Any) -> Any:
    """``a symbol b`` elementwise: a constant boolean tensor (no derivative)."""
    first = _first_tensor((a, b))
    be, cls = first._backend, type(first)
    A, B = operand(a, be), operand(b, be)
    if A is None or B is None:
        return NotImplemented
    shape = shapes.broadcast(f"comparison {symbol}", A.shape, B.shape)
    (out,) = be.map("compare", (f"x {symbol} y",), {"x": A.data, "y": B.data}, shape, (BOOL,))
    return wrap(cls, be, out, shape, BOOL)
