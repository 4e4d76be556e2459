"""The OpenCL executor of batched backend steps (``batch_cl.BatchedCLProgram``):
``matmul``, ``reduce``, ``linear`` and ``linear_vjp`` once for all the points of a chunk,
(and scatter-adds with repeated indices, assembles of several parts, the table's line
ops: prod, cumprod, cumsum, the recurrence), on the batch's
buffers, as ``batch_plan`` plans them (which operand is per point or
shared, which product, what is copied first). This module only carries the plan out with
the backend's ``matmul`` (one GEMM launch a product), ``strided`` (the plan's copies),
``reduce`` and ``map`` (the bias).

Every output of a step here is a buffer of all the points (``hold_shared=False``): a
value that is the same at every point is computed once and copied to every point.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from easyad.compiler.program.batch_plan import (
    Assembly, LineOp, Product, Read, Reduction, Scatter, StepPlan, plan_step)
from easyad.tensor._program import Instruction

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend


def _matmul(be: Backend, a: Any, b: Any, transpose_a: bool, transpose_b: bool) -> Any:
    """Every product of a batched program (one place, so a test can count them)."""
    return be.matmul(a, b, transpose_a, transpose_b)


class BatchStep:
    """A backend step of the batch: ``run(arrays, points, shared)`` sets the outputs'
    buffers of all the points (``shared(root)``: whether a root slot holds one value
    for all points)."""

    __slots__ = ("instruction", "roots", "shapes", "plans")

    def __init__(self, ins: Instruction, r: Callable[[int], int],
                 shapes: list[tuple[int, ...]]) -> None:
        self.instruction = ins
        self.roots = [r(i) if type(i) is int else None for i in ins.ins]
        self.shapes = shapes
        self.plans: dict[tuple[bool, ...], StepPlan] = {}

    def plan(self, own: tuple[bool, ...]) -> StepPlan:
        found = self.plans.get(own)
        if found is None:
            found = self.plans[own] = plan_step(self.instruction, self.shapes, own, False)
        return found

    def run(self, be: Backend, arrays: list[Any], points: int,
            shared: Callable[[int], bool]) -> None:
        ins = self.instruction
        bufs = [arrays[r] if r is not None else v for r, v in zip(self.roots, ins.ins)]
        plan = self.plan(tuple(r is not None and not shared(r) for r in self.roots))
        for o, out in zip(ins.outs, run_plan(be, plan, bufs, points)):
            if getattr(out, "offset", 0):       # the kernels take whole buffers
                out = out.copy()
            arrays[o] = out


def run_plan(be: Backend, plan: StepPlan, bufs: list[Any], points: int) -> list[Any]:
    """The outputs (a buffer of all the points each) of a step planned with
    ``hold_shared=False``; ``bufs``: the step's operands (a buffer of all the points
    where the point's own)."""
    found = []
    for result in plan.results:
        if type(result) is Product:
            out = _product(be, result, bufs, points)
            if plan.bias is not None:
                out = _add_bias(be, plan, result, out, bufs, points)
        elif type(result) is Reduction:
            out = _reduction(be, result, bufs, points)
        elif type(result) is Scatter:
            out = _scatter(be, result, bufs[result.arg], points)
        elif type(result) is LineOp:
            out = line_op(be, result, bufs, points)
            out = _tile(be, out, points, result.size) if result.tile else out
        else:
            out = _assembly(be, result, bufs, points)
        found.append(out)
    return found


def _read(be: Backend, read: Read, buf: Any, points: int) -> Any:
    copy = read.copy(points)
    if copy is not None:
        buf = be.strided(buf, 0, *copy)
    return be.reshape(buf, read.shape(points))


def _tile(be: Backend, buf: Any, points: int, size: int) -> Any:
    """One value of ``size`` elements copied to every point: (points, size)."""
    return be.strided(buf, 0, (points, size), (0, 1))


def _product(be: Backend, p: Product, bufs: list[Any], points: int) -> Any:
    c = _matmul(be, _read(be, p.left, bufs[p.left.arg], points),
                _read(be, p.right, bufs[p.right.arg], points), p.transpose_left,
                p.transpose_right)
    return _tile(be, c, points, p.size) if p.tile else c


def _reduction(be: Backend, r: Reduction, bufs: list[Any], points: int) -> Any:
    total = be.reduce(r.op, be.reshape(bufs[r.arg], r.shape(points)), r.axes)
    return _tile(be, total, points, r.size) if r.tile else total


def _scatter(be: Backend, s: Scatter, g: Any, points: int) -> Any:
    copy = s.copy(points)
    if copy is not None:
        g = be.strided(g, 0, *copy)
    out = be.scatter_add(s.shape(points), s.dtype, s.index_at(points),
                         be.reshape(g, s.g_at(points)), s.unique)
    return _tile(be, out, points, s.size) if s.tile else out


def _assembly(be: Backend, a: Assembly, bufs: list[Any], points: int) -> Any:
    parts = []
    for k, (place, src) in enumerate(zip(a.parts_at(points), bufs)):
        if a.spread[k]:
            src = be.strided(src, 0, *a.copy(k, points))
        parts.append((*place, be.reshape(src, place[1])))
    out = be.assemble(a.shape(points), a.dtype, parts)
    return _tile(be, out, points, a.size) if a.tile else out


def line_op(be: Backend, o: LineOp, bufs: Any, points: int) -> Any:
    """The op once over the chunk: its kernel's lines run over every point's lines (the
    numpy device's executor calls this too)."""
    if not o.own:
        return be.op(o.op, o.params, [be.reshape(b, s) for b, s in zip(bufs, o.shapes)],
                     o.point_shape, o.dtype)
    args = []
    for k, buf in enumerate(bufs):
        if o.spread[k]:
            buf = be.strided(buf, 0, *o.copy(k, points))
        args.append(be.reshape(buf, o.operand_shape(k, points)))
    return be.op(o.op, o.batched, args, o.shape(points), o.dtype)


def _add_bias(be: Backend, plan: StepPlan, p: Product, out: Any, bufs: list[Any],
              points: int) -> Any:
    """linear's product plus its bias (one map: a row a point, or one for all)."""
    bias = plan.bias
    assert bias is not None
    shape = bias.out(p.points(points))
    b = bufs[bias.arg] if bias.arg is not None else bias.value
    if bias.arg is not None:
        b = be.reshape(b, bias.shape(points))
    return be.map("linear_bias", ("x + b",), {"x": be.reshape(out, shape), "b": b}, shape,
                  (out.dtype,))[0]
