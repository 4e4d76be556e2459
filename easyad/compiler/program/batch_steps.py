"""Backend steps of a batched OpenCL program (``batch_cl.BatchedCLProgram``): ``matmul``,
``reduce``, ``linear``, ``linear_vjp``, assembles of several parts and the table's line
ops (prod, cumprod, cumsum, recurrence) run once for all the points of a chunk, on the
batch's buffers.

A slot is either the point's own (a buffer of B points, point b's value at ``b * size``)
or shared (a constant, an argument given once: the same value at every point).

- **matmul**: one batched product (``_matmul``, the backend's ``matmul``: one GEMM
  launch for the whole chunk). A shared operand is read with a batch stride of 0, as the
  kernels read a shared input. Where a point's operand is (rows, K) and the other shared
  (x @ W: the layers of an MLP, their gradients' g @ W^T), the chunk's rows are one
  matrix, one plain GEMM of points * rows rows; where a point's operand is a vector and
  the other a shared matrix (A @ w), the points' vectors are the rows of one product with
  the matrix transposed (read in place). Transposed operands (A^T B, A B^T: the backward
  pass) are handed to the GEMM as they are. A shared operand with a batch axis of its
  own, or a point's operand that the product's batch axis repeats, is tiled to one per
  point first (a copy); two shared operands give one product, tiled to every point.
- **reduce**: over the point's axes shifted by one (one backend reduction for all the
  points); a shared operand is reduced once and tiled.
- **op** (an op of the table with a line loop, ``runs``): the op's kernel once over the
  chunk, by the op's batching rule (the batch axis first: the points' lines are more
  lines of one launch); a shared operand tiled to every point.
- **assemble** (parts written into zeros: a concatenation, the shift of cumprod's and
  prod's derivatives): one assemble of the chunk, each part's view given a points axis.
- **linear** (x @ w^T + b) and **linear_vjp** (g w, g^T x, the sum of g's rows): their
  products as matmul's, the bias added by one map (shared, or a row a point), the bias
  gradient as reduce's.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from easyad.tensor._program import Instruction

def _matmul(be: Any, a: Any, b: Any, transpose_a: bool, transpose_b: bool) -> Any:
    """Every product of a batched program (one place, so a test can count them)."""
    return be.matmul(a, b, transpose_a, transpose_b)


def _tile(be: Any, buf: Any, points: int, repeat: int, inner: int, shared: bool) -> Any:
    """(points * repeat, inner) contiguous: ``buf`` holds ``inner`` values (shared) or one
    ``inner`` block per point, each repeated ``repeat`` times within its point."""
    strides = (0 if shared else inner, 0, 1)
    return be.strided(buf, 0, (points, repeat, inner), strides)


class BatchStep:
    """A backend step of the batch: ``run(arrays, points, shared)`` sets the outputs'
    buffers of all the points (``shared(root)``: whether a root slot holds one value
    for all points)."""

    __slots__ = ("instruction", "roots", "shapes", "run_step")

    def __init__(self, ins: Instruction, r: Callable[[int], int],
                 shapes: list[tuple[int, ...]]) -> None:
        self.instruction = ins
        self.roots = [r(i) if type(i) is int else None for i in ins.ins]
        self.shapes = [tuple(shapes[i]) if type(i) is int else None for i in ins.ins]
        self.run_step = _RUN[ins.op]

    def run(self, be: Any, arrays: list[Any], points: int,
            shared: Callable[[int], bool]) -> None:
        outs = self.run_step(self, be, arrays, points, shared)
        for o, out in zip(self.instruction.outs, outs):
            if getattr(out, "offset", 0):       # the kernels take whole buffers
                out = out.copy()
            arrays[o] = out


def _product(be: Any, points: int, a: Any, own_a: bool, sa: tuple[int, ...], b: Any,
             own_b: bool, sb: tuple[int, ...], ta: bool, tb: bool) -> Any:
    """op(a) @ op(b) at every point (a's and b's shapes ``sa``, ``sb`` a point's, 3-d):
    the points' products one after another, (points * batch, M, N) in memory."""
    n = max(sa[0], sb[0])
    M, K = (sa[2], sa[1]) if ta else (sa[1], sa[2])
    N = sb[1] if tb else sb[2]
    if not own_a and not own_b:        # the same product at every point: once, tiled
        c = _matmul(be, be.reshape(a, sa), be.reshape(b, sb), ta, tb)
        return _tile(be, c, points, 1, c.size, True)
    if own_a and not own_b and not ta and sb[0] == 1:   # the points' rows, one matrix
        return _matmul(be, be.reshape(a, (1, points * sa[0] * M, K)),
                       be.reshape(b, sb), False, tb)
    if own_b and not own_a and sa[0] == sb[0] == 1 and N == 1:
        # a vector a point against a shared matrix: rows @ op(A)^T, op(A) read in place
        return _matmul(be, be.reshape(b, (1, points, K)), be.reshape(a, sa), False, not ta)

    def operand(buf: Any, shape: tuple[int, ...], own: bool) -> Any:
        inner = math.prod(shape[1:])
        if shape[0] == 1 and not own:           # shared by every product: stride 0
            return be.reshape(buf, shape)
        if shape[0] != n or not own:            # one per product of each point: tiled
            buf = _tile(be, buf, points, n // shape[0], shape[0] * inner, not own)
        return be.reshape(buf, (points * n,) + shape[1:])
    return _matmul(be, operand(a, sa, own_a), operand(b, sb, own_b), ta, tb)


def _reduction(be: Any, points: int, op: str, buf: Any, own: bool, shape: tuple[int, ...],
               axes: tuple[int, ...]) -> Any:
    """The reduction of a point's ``shape`` over ``axes`` at every point."""
    if not own:          # once, tiled
        total = be.reduce(op, be.reshape(buf, shape), axes)
        return _tile(be, total, points, 1, total.size, True)
    return be.reduce(op, be.reshape(buf, (points,) + shape), tuple(d + 1 for d in axes))


def _operands(step: BatchStep, arrays: list[Any], shared: Callable[[int], bool]
              ) -> list[tuple[Any, bool]]:
    """(buffer, whether each point has its own) of the step's slot operands."""
    return [(arrays[r], not shared(r)) if r is not None else (None, False)
            for r in step.roots]


def _matmul_step(step: BatchStep, be: Any, arrays: list[Any], points: int,
                 shared: Callable[[int], bool]) -> list[Any]:
    p = step.instruction.params
    (a, own_a), (b, own_b) = _operands(step, arrays, shared)
    sa, sb = step.shapes
    return [_product(be, points, a, own_a, sa, b, own_b, sb, p.transpose_a, p.transpose_b)]


def _reduce_step(step: BatchStep, be: Any, arrays: list[Any], points: int,
                 shared: Callable[[int], bool]) -> list[Any]:
    p = step.instruction.params
    ((a, own),), (shape,) = _operands(step, arrays, shared), step.shapes
    return [_reduction(be, points, p.op, a, own, shape, tuple(p.axes))]


def _linear_step(step: BatchStep, be: Any, arrays: list[Any], points: int,
                 shared: Callable[[int], bool]) -> list[Any]:
    """x @ w^T + b: one product, then the bias (shared, or one row a point)."""
    (x, own_x), (w, own_w), (b, own_b) = _operands(step, arrays, shared)
    (n, k), (m, _) = step.shapes[0], step.shapes[1]
    out = _product(be, points, x, own_x, (1, n, k), w, own_w, (1, m, k), False, True)
    bias = b if b is not None else step.instruction.ins[2]
    if bias is None:
        return [out]
    dtype = (out.dtype,)
    if own_b:        # a bias row a point, over the point's n rows
        shape = step.shapes[2]
        b3 = be.reshape(bias, (points, 1, m) if shape == (m,) else (points, 1, 1))
        return be.map("linear_bias", ("x + b",), {"x": be.reshape(out, (points, n, m)),
                                                   "b": b3}, (points, n, m), dtype)
    return be.map("linear_bias", ("x + b",), {"x": be.reshape(out, (points * n, m)),
                                               "b": bias}, (points * n, m), dtype)


def _linear_vjp_step(step: BatchStep, be: Any, arrays: list[Any], points: int,
                     shared: Callable[[int], bool]) -> list[Any]:
    """(g w, g^T x, the sum of g's rows) at every point, as ``needs`` asks."""
    needs = step.instruction.params.needs
    (g, own_g), (x, own_x), (w, own_w) = _operands(step, arrays, shared)
    n, o = step.shapes[0]
    found = []
    if needs[0]:
        k = step.shapes[2][1]
        found.append(_product(be, points, g, own_g, (1, n, o), w, own_w, (1, o, k), False,
                              False))
    if needs[1]:
        k = step.shapes[1][1]
        found.append(_product(be, points, g, own_g, (1, n, o), x, own_x, (1, n, k), True,
                              False))
    if needs[2]:
        found.append(_reduction(be, points, "sum", g, own_g, (n, o), (0,)))
    return found


def _op_step(step: BatchStep, be: Any, arrays: list[Any], points: int,
             shared: Callable[[int], bool]) -> list[Any]:
    """An op of the table with a line loop (prod, cumprod, cumsum, recurrence: ``runs``)
    at every point: the op once over the chunk by its batching rule (a point's operand
    with the batch axis first; its kernel's lines then run over every point's lines),
    shared operands tiled to every point; all shared: once, tiled."""
    t = step.instruction.params
    operands = _operands(step, arrays, shared)
    if not any(own for _, own in operands):
        out = be.op(t.op, t.params, [be.reshape(a, s) for (a, _), s in
                                     zip(operands, step.shapes)], t.shape, t.dtype)
        return [_tile(be, out, points, 1, out.size, True)]
    bufs = []
    for (a, own), shape in zip(operands, step.shapes):
        size = math.prod(shape)
        if not own:
            a = _tile(be, a, points, 1, size, True)
        bufs.append(be.reshape(a, (points,) + shape))
    params, out_axis = t.op.batch(t.params, 0)
    if out_axis != 0:       # (the line ops' rules keep the batch axis first)
        raise AssertionError(f"op {t.op.name!r}: its batching rule moved the batch axis")
    return [be.op(t.op, params, bufs, (points,) + tuple(t.shape), t.dtype)]


def _assemble_step(step: BatchStep, be: Any, arrays: list[Any], points: int,
                   shared: Callable[[int], bool]) -> list[Any]:
    """Parts written into zeros at every point: one assemble of the chunk, each part's
    view with a leading points axis (a point's output ``size`` apart); a shared part
    broadcast to its view and tiled, a point's own given the view's dimensions."""
    p = step.instruction.params
    size = math.prod(p.shape)
    parts = []
    for part, (buf, own), shape in zip(p.parts, _operands(step, arrays, shared),
                                       step.shapes):
        view = tuple(part.shape)
        if own:
            src = be.reshape(buf, (points,) + (1,) * (len(view) - len(shape)) + shape)
        else:
            src = be.reshape(buf, shape)
            if shape != view:
                src = be.map("broadcast", ("g",), {"g": src}, view, (src.dtype,))[0]
            src = be.reshape(_tile(be, src, points, 1, math.prod(view), True),
                             (points,) + view)
        parts.append((part.offset, (points,) + view, (size,) + tuple(part.strides), src))
    return [be.assemble((points,) + tuple(p.shape), p.dtype, parts)]


def runs(ins: Instruction) -> bool:
    """Whether a backend step runs once for all the points here (``STEPS``; an op of
    the table: one with a line loop and a batching rule, its operands slots)."""
    if ins.op == "assemble":
        return all(type(i) is int for i in ins.ins)
    if ins.op != "op":
        return ins.op in STEPS
    op = ins.params.op
    return op.loop is not None and op.batch is not None and \
        all(type(i) is int for i in ins.ins)


_RUN = {"matmul": _matmul_step, "reduce": _reduce_step, "linear": _linear_step,
        "linear_vjp": _linear_vjp_step, "op": _op_step, "assemble": _assemble_step}
STEPS = ("guard",) + tuple(_RUN)     # the backend steps a batched program runs
