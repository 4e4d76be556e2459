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
from easyad.tensor._base import (BOOL, FLOAT32, FLOAT64, T, TensorBase, common_tape, fold,
                                 live_tape, operand, record, result_dtype, uses, wrap)
from easyad.tensor._steps import Step


def _first_tensor(values: tuple[Any, ...]) -> TensorBase:
    for v in values:
        if isinstance(v, TensorBase):
            return v
    raise TypeError("a tensor operation needs at least one Tensor")


# ---- plans: what a rule's vjp needs, worked out once per rule (not per operation) ----

class _Plan:
    """A rule's kernels for the operands that need an adjoint: the value, and the adjoint
    expressions ``mul0(g, partial)`` (just ``g`` for a partial of 1) over the values they
    read (``saved``: of "x", "y", "z") and ``g``; each prepared once per backend
    (``Backend.prepared_map``)."""

    __slots__ = ("name", "value", "label", "exprs", "saved", "wanted", "arity", "kernels")

    def __init__(self, rule: _rules.Rule, wanted: tuple[int, ...]) -> None:
        partials = [rule.partials[k] for k in wanted]
        self.name, self.value, self.label, self.wanted = \
            rule.name, (rule.value,), rule.name + "_vjp", wanted
        self.arity = len(rule.partials)
        self.exprs = tuple("g" if _expr.constant(p) == 1.0 else f"mul0(g, {p})"
                           for p in partials)
        self.saved = tuple(n for n in ("x", "y", "z") if any(uses(p, n) for p in partials))
        self.kernels: dict[Any, tuple[Any, Any]] = {}

    def on(self, be: Any) -> tuple[Any, Any]:
        """(value kernel, adjoint kernel) on backend ``be``."""
        found = self.kernels.get(be)
        if found is None:
            found = self.kernels[be] = (
                be.prepared_map(self.name, self.value, ("x", "y")[:self.arity]),
                be.prepared_map(self.label, self.exprs, self.saved + ("g",)))
        return found


_PLANS: dict[tuple[str, tuple[int, ...]], _Plan] = {}


def _plan(rule: _rules.Rule, wanted: tuple[int, ...]) -> _Plan:
    plan = _PLANS.get((rule.name, wanted))
    if plan is None:
        plan = _PLANS[(rule.name, wanted)] = _Plan(rule, wanted)
    return plan


class ElementwiseStep(Step):
    """One recorded elementwise operation as data (its node's ``vjp``; ``graph`` is its
    method): the rule's plan, the operands' shapes, dtypes (None: a scalar, whose adjoint
    is a float) and entries, the output's shape and dtype, and the values the adjoint
    expressions read (``plan.saved``). No closure per operation: what a replay of the
    recorded program needs is all here (the label is ``plan.name``)."""

    __slots__ = ("plan", "cls", "be", "saved", "shape", "dtype", "target", "odtypes",
                 "indices", "constants")

    def __init__(self, plan: _Plan, cls: type, be: Any, saved: tuple[Any, ...],
                 shape: tuple[int, ...], dtype: Any, target: tuple[Any, Any],
                 odtypes: tuple[Any, Any], indices: tuple[int, int],
                 constants: tuple[Any, Any] = (None, None)) -> None:
        self.plan, self.cls, self.be, self.saved = plan, cls, be, saved
        self.shape, self.dtype, self.target, self.odtypes, self.indices = \
            shape, dtype, target, odtypes, indices
        self.constants = constants     # the operands that are Python floats (else None)

    def __call__(self, g: Any) -> tuple[Any, ...]:
        """The vjp: one adjoint contribution per operand (None where none is wanted)."""
        plan, shape = self.plan, self.shape
        outs = plan.on(self.be)[1](self.saved + (g,), shape, (self.dtype,) * len(plan.wanted))
        if plan.arity == 1:
            return (outs[0],)
        result: list[Any] = [None, None]
        for k, c in zip(plan.wanted, outs):
            result[k] = fold(self.be, c, shape, self.target[k], self.odtypes[k] is None)
        return result[0], result[1]

    def graph(self, tape: Any, index: int, g: Any) -> tuple[Any, ...]:
        """The vjp in recorded operations (``Node.graph``), for create_graph."""
        plan, cls, be, shape, dtype = self.plan, self.cls, self.be, self.shape, self.dtype
        kept = dict(zip(plan.saved, self.saved))
        x, y = (_graph.handle(cls, be, kept[n], s, dt, tape, i) if n in kept
                else (None if plan.arity == 1 else 0.0)
                for n, s, dt, i in zip(("x", "y"), self.target, self.odtypes, self.indices))
        out = _graph.handle(cls, be, kept["z"], shape, dtype, tape, index) \
            if "z" in kept else None
        compiled = _graph.tensor_rules()[plan.name]
        if plan.arity == 1:
            return (_graph.mul0(g, compiled.partials[0](x, 0.0, out)),)
        result: list[Any] = [None, None]
        for k in plan.wanted:
            scalar = self.odtypes[k] is None
            c = _graph.mul0(g, compiled.partials[k](x, y, out))
            result[k] = _graph.fold(c if scalar else _graph.as_tensor(c, cls, be, dtype),
                                    shape, self.target[k], scalar)
        return result[0], result[1]


def unary(rule: _rules.Rule, t: T) -> T:
    """``rule`` applied to every element of ``t``, recorded with its vjp."""
    be, cls = t._backend, type(t)
    if t._dtype == BOOL:
        t = t.astype(np.float64)
    tape = live_tape(t)
    plan = _plan(rule, (0,))
    forward = plan.on(be)[0]
    shape, dtype = t._shape, t._dtype
    dtypes = (dtype,)
    (z,) = forward((t._data,), shape, dtypes)
    if tape is None:
        return wrap(cls, be, z, shape, dtype)
    values = {"x": t._data, "z": z}
    step = ElementwiseStep(plan, cls, be, tuple(values[n] for n in plan.saved), shape, dtype,
                           (shape, ()), (dtype, None), (t._index, -1))
    return record(cls, plan.name, be, z, shape, dtype, tape, (t._index,), step, step.graph)


def _same_kind(a: Any, b: Any) -> bool:
    # the fast path of binary: a float tensor with a float or int, or two tensors of one
    # backend, float dtype and shape on one (or no) list, none of them stale
    t = a if isinstance(a, TensorBase) else b
    other = b if t is a else a
    dtype, tape = t._dtype, t._tape
    if (dtype is not FLOAT64 and dtype is not FLOAT32) or (
            tape is not None and tape.generation != t._generation):
        return False
    if type(other) is float or type(other) is int:     # (bool is not int's type)
        return True
    return (isinstance(other, TensorBase) and other._backend is t._backend
            and other._dtype is dtype and other._shape == t._shape
            and (other._tape is tape or other._tape is None or tape is None)
            and (other._tape is None or other._tape.generation == other._generation))


def _operands(rule: _rules.Rule, a: Any, b: Any) -> Any:
    """(backend, class, data, shapes, indices, operand dtypes (None: a scalar), dtype,
    shape, tape) of a binary operation, or None for an operand tensors do not take."""
    if _same_kind(a, b):
        t = a if isinstance(a, TensorBase) else b
        tape = t._tape
        if t is not a:      # a is a number: a float operand, as operand() makes it
            return (t._backend, type(t), (float(a), t._data), ((), t._shape), (-1, t._index),
                    (None, t._dtype), t._dtype, t._shape, tape)
        if type(b) is float or type(b) is int:
            return (t._backend, type(t), (t._data, float(b)), (t._shape, ()), (t._index, -1),
                    (t._dtype, None), t._dtype, t._shape, tape)
        if tape is None:
            tape = b._tape
        return (t._backend, type(t), (a._data, b._data), (a._shape, b._shape),
                (a._index, b._index), (t._dtype, t._dtype), t._dtype, t._shape, tape)
    first = _first_tensor((a, b))
    be = first._backend
    A, B = operand(a, be), operand(b, be)
    if A is None or B is None:
        return None
    dtype = result_dtype([A, B])
    shape = A.shape if A.shape == B.shape else shapes.broadcast(rule.name, A.shape, B.shape)
    tape = common_tape(rule.name, [A, B])
    return (be, type(first), (A.data, B.data), (A.shape, B.shape), (A.index, B.index),
            (A.dtype, B.dtype), dtype, shape, tape)


def binary(rule: _rules.Rule, a: Any, b: Any) -> Any:
    """``rule`` of two operands (one at least a tensor) with broadcasting; NotImplemented
    for an operand tensors do not take."""
    found = _operands(rule, a, b)
    if found is None:
        return NotImplemented
    be, cls, (x, y), target, indices, odtypes, dtype, shape, tape = found
    needs_a, needs_b = indices[0] >= 0, indices[1] >= 0
    live = tape is not None and (needs_a or needs_b)
    plan = _plan(rule, (0, 1) if needs_a and needs_b else (1,) if needs_b else (0,))
    forward = plan.on(be)[0]
    (z,) = forward((x, y), shape, (dtype,))
    if not live:
        return wrap(cls, be, z, shape, dtype)
    values = {"x": x, "y": y, "z": z}
    step = ElementwiseStep(plan, cls, be, tuple(values[n] for n in plan.saved), shape, dtype,
                           target, odtypes, indices,
                           (x if type(x) is float else None, y if type(y) is float else None))
    return record(cls, rule.name, be, z, shape, dtype, tape, indices, step, step.graph)


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
