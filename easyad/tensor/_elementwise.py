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


# ---- plans: what a rule's vjp needs, worked out once per rule (not per operation) ----

class _Plan:
    """A rule's adjoint kernel for the operands that need one: the expressions
    ``mul0(g, partial)`` (just ``g`` for a partial of 1), the values they read ("x", "y",
    "z") and the labels."""

    __slots__ = ("name", "value", "label", "exprs", "saved", "wanted")

    def __init__(self, rule: _rules.Rule, wanted: tuple[int, ...]) -> None:
        partials = [rule.partials[k] for k in wanted]
        self.name, self.value, self.label, self.wanted = \
            rule.name, (rule.value,), rule.name + "_vjp", wanted
        self.exprs = tuple("g" if _expr.constant(p) == 1.0 else f"mul0(g, {p})"
                           for p in partials)
        self.saved = tuple(n for n in ("x", "y", "z") if any(uses(p, n) for p in partials))


_PLANS: dict[tuple[str, tuple[int, ...]], _Plan] = {}


def _plan(rule: _rules.Rule, wanted: tuple[int, ...]) -> _Plan:
    plan = _PLANS.get((rule.name, wanted))
    if plan is None:
        plan = _PLANS[(rule.name, wanted)] = _Plan(rule, wanted)
    return plan


def unary(rule: _rules.Rule, t: T) -> T:
    """``rule`` applied to every element of ``t``, recorded with its vjp."""
    be, cls = t._backend, type(t)
    if t._dtype == BOOL:
        t = t.astype(np.float64)
    tape = live_tape(t)
    plan = _plan(rule, (0,))
    shape, dtype = t._shape, t._dtype
    (z,) = be.map(plan.name, plan.value, {"x": t._data}, shape, (dtype,))
    if tape is None:
        return wrap(cls, be, z, shape, dtype)
    saved = {n: v for n, v in (("x", t._data), ("z", z)) if n in plan.saved}
    label, exprs = plan.label, plan.exprs

    def vjp(g: Any) -> tuple[Any]:
        saved["g"] = g
        try:
            return tuple(be.map(label, exprs, saved, shape, (dtype,)))
        finally:
            del saved["g"]
    x_index = t._index

    def graph(tape: Any, index: int, g: Any) -> tuple[Any]:
        x, out = (_graph.handle(cls, be, saved.get(n), shape, dtype, tape, i) if n in saved
                  else None for n, i in (("x", x_index), ("z", index)))
        partial = _graph.tensor_rules()[plan.name].partials[0](x, 0.0, out)
        return (_graph.mul0(g, partial),)
    return record(cls, plan.name, be, z, shape, dtype, tape, (x_index,), vjp, graph)


def binary(rule: _rules.Rule, a: Any, b: Any) -> Any:
    """``rule`` of two operands (one at least a tensor) with broadcasting; NotImplemented
    for an operand tensors do not take."""
    first = _first_tensor((a, b))
    be, cls = first._backend, type(first)
    A, B = operand(a, be), operand(b, be)
    if A is None or B is None:
        return NotImplemented
    dtype = result_dtype([A, B])
    shape = A.shape if A.shape == B.shape else shapes.broadcast(rule.name, A.shape, B.shape)
    tape = common_tape(rule.name, [A, B])
    (z,) = be.map(rule.name, (rule.value,), {"x": A.data, "y": B.data}, shape, (dtype,))
    if tape is None or not (A.index >= 0 or B.index >= 0):
        return wrap(cls, be, z, shape, dtype)
    # (index, is a scalar): not the Operands, which hold the tape (a cycle through the vjp)
    wanted = [(k, o.dtype is None) for k, o in enumerate((A, B)) if o.index >= 0]
    plan = _plan(rule, tuple(k for k, _ in wanted))
    values = {"x": A.data, "y": B.data, "z": z}
    saved = {n: values[n] for n in plan.saved}
    label, exprs, target = plan.label, plan.exprs, (A.shape, B.shape)
    dtypes = (dtype,) * len(exprs)

    def vjp(g: Any) -> tuple[Any, Any]:
        saved["g"] = g
        try:
            outs = be.map(label, exprs, saved, shape, dtypes)
        finally:
            del saved["g"]
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
