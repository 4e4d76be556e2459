"""Elementwise operations from the rule table: one kernel per rule for the value, one for
the adjoints, and comparisons.

The value expression, and ``mul0(g, partial)`` for the adjoint of each operand, are handed
to the device's backend, which compiles them (numpy namespace, or an OpenCL kernel). The
methods ``t.sin()``, ``t + u``... are generated from the table
(``_generated/tensor_methods.py``) and call the core's dispatch
(``_engine/tensors.pxi``: ``RulePlan``, ``ElementwiseStep``), which runs the common case in
C (a float tensor with a number or a tensor of its shape) and hands the rest to ``unary``
and ``binary`` here: broadcasting, promotion, arrays, Records, and the errors.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad import _core, _expr, _rules
from easyad._core import ElementwiseStep, RulePlan
from easyad.tensor import _graph
from easyad.tensor import _shapes as shapes
from easyad.tensor._base import (BOOL, T, TensorBase, common_tape, live_tape, operand, record,
                                 result_dtype, wrap)


def _first_tensor(values: tuple[Any, ...]) -> TensorBase:
    for v in values:
        if isinstance(v, TensorBase):
            return v
    raise TypeError("a tensor operation needs at least one Tensor")


# ---- plans: what a rule's vjp needs, worked out once per rule (not per operation) ----

_PLANS: dict[tuple[str, tuple[int, ...]], RulePlan] = {}


def _plan(rule: _rules.Rule, wanted: tuple[int, ...]) -> RulePlan:
    """The rule's kernels for the operands ``wanted`` (see the core's ``RulePlan``): the
    adjoint expressions ``mul0(g, partial)`` (``g`` for a partial of 1) and the values
    they read."""
    plan = _PLANS.get((rule.name, wanted))
    if plan is None:
        exprs, saved = _expr.adjoint_map(rule.partials[k] for k in wanted)
        plan = _PLANS[(rule.name, wanted)] = RulePlan(rule.name, rule.value, exprs, saved,
                                                      wanted, len(rule.partials))
    return plan


def step_graph(step: ElementwiseStep, tape: Any, index: int, g: Any) -> tuple[Any, ...]:
    """An ElementwiseStep's vjp in recorded operations (``Node.graph``), for
    create_graph: the rule table's partials on tensors (``_graph.tensor_rules``)."""
    plan, cls, be, shape, dtype = step.plan, step.cls, step.be, step.shape, step.dtype
    kept = dict(zip(plan.saved, step.saved))
    x, y = (_graph.handle(cls, be, kept[n], s, dt, tape, i) if n in kept
            else (None if plan.arity == 1 else 0.0)
            for n, s, dt, i in zip(("x", "y"), step.target, step.odtypes, step.indices))
    out = _graph.handle(cls, be, kept["z"], shape, dtype, tape, index) \
        if "z" in kept else None
    compiled = _graph.tensor_rules()[plan.name]
    if plan.arity == 1:
        return (_graph.mul0(g, compiled.partials[0](x, 0.0, out)),)
    result: list[Any] = [None, None]
    for k in plan.wanted:
        scalar = step.odtypes[k] is None
        c = _graph.mul0(g, compiled.partials[k](x, y, out))
        result[k] = _graph.fold(c if scalar else _graph.as_tensor(c, cls, be, dtype),
                                shape, step.target[k], scalar)
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
    return record(cls, plan.name, be, z, shape, dtype, tape, (t._index,), step)


def _operands(rule: _rules.Rule, a: Any, b: Any) -> Any:
    """(backend, class, data, shapes, indices, operand dtypes (None: a scalar), dtype,
    shape, tape) of a binary operation, or None for an operand tensors do not take."""
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
                           tuple(target), tuple(odtypes), tuple(indices))
    return record(cls, rule.name, be, z, shape, dtype, tape, tuple(indices), step)


# the core's dispatch (Tensor's rule hooks) takes the common cases in C and hands these
# the rest: broadcasting, promotion, arrays, Records, and the errors
_core._register_service("elementwise.plan", _plan)
_core._register_service("elementwise.step_graph", step_graph)
_core._register_service("elementwise.unary", unary)
_core._register_service("elementwise.binary", binary)


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
