"""What each batched backend step of a recorded tensor program is, decided once for both
devices: the numpy device's step-wise batch (``batch_np``) and the batched OpenCL program
(``batch_cl`` through ``batch_steps``) both execute these records, and neither decides a
shape, stride or transpose of its own.

A batch runs a program at the B points of a chunk. Each operand of a step is either the
point's own (B values, point b's at ``b * size``) or shared (one value for every point:
a constant, an argument given once, a value made only of shared ones). ``plan_step``
takes a step (matmul, linear, linear_vjp, reduce), a point's slot shapes and which
operands are the point's own, and returns a ``StepPlan``: one ``Product`` or
``Reduction`` per output, and linear's ``Bias``.

Products (``op(a) @ op(b)`` at every point, operands 3-d as the backend's ``matmul``
takes them: (batch, rows, cols)):

- both shared: one product for all points (``Layout.ONE`` each); an engine that cannot
  hold a shared result (OpenCL's step outputs are per point) copies it to every point;
- the point's (batch, M, K) against a shared (1, K, N) matrix (x @ W: an MLP's layers,
  their gradients' g @ W^T): the chunk's rows as one matrix, one GEMM of
  B * batch * M rows (``Layout.FLAT``); a point's operand given transposed (g^T x,
  linear_vjp's weight gradient) is copied transposed first, so the GEMM stays one;
- a point's vector against a shared matrix (A @ w, least squares): the vectors are the
  rows of one product with A read transposed in place (the other flag flipped);
- anything else: a stack of B * batch products (``Layout.STACK``: the point's operands
  in place; a shared operand of batch 1 at stride 0, the backend's broadcast), where an
  operand's batch is not the product's (a shared stack, a point's matrix that the
  product repeats) it is copied to one per product first (``Layout.TILE``).

A reduction is over the point's axes shifted by one (the point's axis first), once for a
shared operand. A scatter-add (``Scatter``: repeated indices, which OpenCL adds on the
host) and an assemble of several parts (``Assembly``) write the points' parts of one
(B,) + shape buffer: the index moved by ``b * size`` per point, each part's view given
the point's axis first; a shared or broadcast operand is copied to every point first.
An op of the table with a line loop and a batching rule (prod, cumprod, cumsum, the
recurrence: ``LineOp``) runs once over the chunk by its batching rule, the point's axis
first, so the points' lines are more lines of one kernel; a shared operand is copied to
every point first. ``StepPlan``s are cached by the executors per (step, own operands).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from easyad.compiler.program.plan import broadcast_strides

# the steps planned here
STEPS = ("matmul", "linear", "linear_vjp", "reduce", "scatter_add", "assemble", "op")


class Layout(enum.Enum):
    """How a product reads one operand over the points of a chunk."""
    ONE = "one"        # the shared value as stored (batch 1 broadcasts: stride 0)
    FLAT = "flat"      # the points' matrices as the rows of one matrix (1, B * rows, cols)
    STACK = "stack"    # the points' matrices in place: (B * batch, rows, cols)
    TILE = "tile"      # copied to one matrix per product of each point: (B * n, rows, cols)


@dataclass(frozen=True)
class Read:
    """One operand of a product: ``arg`` (its position in the step's operands), a point's
    value as stored (``stored``: 3-d) and how the product reads it (``layout``).
    ``repeat`` (TILE): copies of the point's value per point; ``transposed`` (FLAT): the
    point's matrices are stored transposed and copied into rows first."""
    arg: int
    own: bool
    layout: Layout
    stored: tuple[int, int, int]
    repeat: int = 1
    transposed: bool = False

    def copy(self, points: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """(shape, strides in elements) of the contiguous copy to make of the operand's
        buffer before the product reads it, or None (read in place)."""
        batch, r, c = self.stored
        if self.layout is Layout.TILE:
            inner = batch * r * c
            return (points, self.repeat, inner), (inner if self.own else 0, 0, 1)
        if self.layout is Layout.FLAT and self.transposed:   # (K, M) matrices as (M, K)
            return (points * batch, c, r), (r * c, 1, c)
        return None

    def shape(self, points: int) -> tuple[int, int, int]:
        """The operand's shape as the product reads it (after ``copy``)."""
        batch, r, c = self.stored
        if self.layout is Layout.ONE:
            return self.stored
        if self.layout is Layout.FLAT:
            return (1, points * batch * c, r) if self.transposed else (1, points * batch * r, c)
        return points * batch * self.repeat, r, c


@dataclass(frozen=True)
class Product:
    """``left @ right`` (each transposed as its flag says) makes an output: per point when
    ``own`` (point b's (batch, M, N) at ``b * size``), else one value for all; ``tile``:
    the one value is copied to every point (``size`` elements a point)."""
    left: Read
    right: Read
    transpose_left: bool
    transpose_right: bool
    own: bool
    tile: bool
    size: int

    def points(self, points: int) -> int:
        """The points the output holds: all, or 1 (one value for all)."""
        return points if self.own or self.tile else 1


class _OfPoints:
    """A result of ``point_shape`` at every point (``own``) or one for all of them."""
    own: bool
    point_shape: tuple[int, ...]

    def shape(self, points: int) -> tuple[int, ...]:
        return ((points,) if self.own else ()) + self.point_shape


@dataclass(frozen=True)
class Reduction(_OfPoints):
    """``op`` over ``axes`` of the operand ``arg`` read as ``shape(points)``; ``tile`` as
    ``Product``'s."""
    arg: int
    op: str
    own: bool
    point_shape: tuple[int, ...]
    axes: tuple[int, ...]
    tile: bool
    size: int


@dataclass(frozen=True)
class Bias:
    """linear's bias, added to its product read as ``out(points)`` (points: the
    product's ``points``): the operand ``arg`` (None: the number ``value``) read as
    ``shape(points)``, a row (or a number) a point where ``own``."""
    arg: int | None
    value: float | None
    own: bool
    stored: tuple[int, ...]     # a point's bias: (columns,) or () (a number: ())
    rows: int
    columns: int

    def out(self, points: int) -> tuple[int, ...]:
        return (points, self.rows, self.columns)

    def shape(self, points: int) -> tuple[int, ...]:
        return (points, 1, math.prod(self.stored)) if self.own else self.stored


@dataclass(frozen=True)
class Scatter(_OfPoints):
    """scatter_add at every point: zeros of ``shape(points)``, the operand ``arg`` (read
    as ``copy(points)`` first where not None) added at ``index_at(points)``."""
    arg: int
    own: bool
    point_shape: tuple[int, ...]
    dtype: Any
    index: np.ndarray = field(compare=False, repr=False)
    unique: bool
    g_shape: tuple[int, ...]
    tile: bool
    size: int

    def index_at(self, points: int) -> np.ndarray:
        if not self.own:
            return self.index
        moved = np.arange(points, dtype=np.int64) * self.size
        return moved.reshape((points,) + (1,) * self.index.ndim) + self.index[None]

    def g_at(self, points: int) -> tuple[int, ...]:
        """g's shape as the scatter reads it (after ``copy``): one value per index entry."""
        return ((points,) if self.own else ()) + self.index.shape

    def copy(self, points: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """(shape, strides) of g broadcast to one value per index entry (of every point
        where own), or None (g is that already)."""
        if self.g_shape == self.index.shape:
            return None
        inner = tuple(broadcast_strides(self.g_shape, self.index.shape))
        if not self.own:
            return self.index.shape, inner
        return (points,) + self.index.shape, (math.prod(self.g_shape),) + inner


@dataclass(frozen=True)
class Assembly(_OfPoints):
    """assemble at every point: zeros of ``shape(points)`` with operand k written into
    ``parts_at(points)[k]``; ``spread[k]``: operand k is shared while the result is per
    point, so it is copied to every point first (``copy(k, points)``)."""
    point_shape: tuple[int, ...]
    dtype: Any
    parts: tuple[Any, ...]          # ir.Part: a point's offset, part shape and strides
    own: bool
    spread: tuple[bool, ...]
    tile: bool
    size: int

    def parts_at(self, points: int) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
        if not self.own:
            return [(q.offset, tuple(q.shape), tuple(q.strides)) for q in self.parts]
        return [(q.offset, (points,) + tuple(q.shape), (self.size,) + tuple(q.strides))
                for q in self.parts]

    def copy(self, k: int, points: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (points, math.prod(self.parts[k].shape)), (0, 1)


@dataclass(frozen=True)
class LineOp(_OfPoints):
    """An op of the table with a line loop at every point: ``op`` with the batched
    ``params`` over operands of shape (points,) + a point's (``spread[k]``: operand k is
    shared, copied to every point first); all operands shared: once (``own`` False),
    copied to every point where the engine holds no shared value (``tile``)."""
    op: Any
    params: Any                    # the op's parameters at one point
    batched: Any                   # its parameters with the point's axis first
    shapes: tuple[tuple[int, ...], ...]
    point_shape: tuple[int, ...]
    dtype: Any
    own: bool
    spread: tuple[bool, ...]
    tile: bool
    size: int

    def operand_shape(self, k: int, points: int) -> tuple[int, ...]:
        return ((points,) if self.own else ()) + self.shapes[k]

    def copy(self, k: int, points: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (points, math.prod(self.shapes[k])), (0, 1)


@dataclass(frozen=True)
class StepPlan:
    """A batched step: one ``Product``/``Reduction``/``Scatter``/``Assembly`` per output,
    in the step's output order; linear's ``bias`` (added to the product's rows) or None."""
    op: str
    results: tuple[Product | Reduction | Scatter | Assembly | LineOp, ...]
    bias: Bias | None = None


def supported(ins: Any, shapes: list[Any]) -> bool:
    """Whether ``plan_step`` plans this step: linear's x a row or rows and its weight a
    matrix, linear_vjp's operands matrices, any matmul or reduce."""
    if ins.op not in STEPS:
        return False
    dims = [len(shapes[i]) if type(i) is int else None for i in ins.ins]
    if ins.op == "linear":
        return dims[0] in (1, 2) and dims[1] == 2 and dims[2] in (None, 0, 1)
    if ins.op == "linear_vjp":
        return all(d in (None, 2) for d in dims) and dims[0] == 2
    if ins.op in ("scatter_add", "assemble"):       # of slots only
        return all(type(i) is int for i in ins.ins)
    if ins.op == "op":          # the table's ops with a line loop and a batching rule
        op = ins.params.op
        return op.loop is not None and op.batch is not None and \
            all(type(i) is int for i in ins.ins)
    return True


def plan_step(ins: Any, shapes: list[Any], own: tuple[bool, ...], hold_shared: bool
              ) -> StepPlan:
    """The plan of ``ins`` (a program instruction that ``supported`` accepts) over a
    chunk: ``own[i]``: whether operand i is the point's own (False for a number or None);
    ``hold_shared``: whether the engine can keep a step's output as one value for all
    points (the numpy device) or needs it per point (OpenCL)."""
    shape = [tuple(shapes[i]) if type(i) is int else None for i in ins.ins]
    p = ins.params
    if ins.op == "matmul":
        return StepPlan("matmul", (_product(0, shape[0], own[0], 1, shape[1], own[1],
                                             p.transpose_a, p.transpose_b, hold_shared),))
    if ins.op == "reduce":
        return StepPlan("reduce", (_reduction(0, p.op, own[0], shape[0], tuple(p.axes),
                                              hold_shared),))
    if ins.op == "scatter_add":
        size = math.prod(p.shape)
        return StepPlan("scatter_add", (Scatter(
            0, own[0], tuple(p.shape), p.dtype, np.asarray(p.index), bool(p.unique),
            shape[0], not own[0] and not hold_shared, size),))
    if ins.op == "assemble":
        mine = any(own)
        return StepPlan("assemble", (Assembly(
            tuple(p.shape), p.dtype, tuple(p.parts), mine,
            tuple(mine and not o for o in own), not mine and not hold_shared,
            math.prod(p.shape)),))
    if ins.op == "op":
        mine = any(own)
        batched, out_axis = p.op.batch(p.params, 0)
        if out_axis != 0:       # (the line ops' rules keep the point's axis first)
            raise AssertionError(f"op {p.op.name!r}: its batching rule moved the batch axis")
        return StepPlan("op", (LineOp(
            p.op, p.params, batched, tuple(shape), tuple(p.shape), p.dtype, mine,
            tuple(mine and not o for o in own), not mine and not hold_shared,
            math.prod(p.shape)),))
    if ins.op == "linear":
        (*_, k), (m, _) = shape[0], shape[1]
        n = shape[0][0] if len(shape[0]) == 2 else 1
        has_bias = ins.ins[2] is not None
        bias_own = has_bias and own[2]
        product = _product(0, (1, n, k), own[0], 1, (1, m, k), own[1], False, True,
                           hold_shared and not bias_own)
        bias = None
        if has_bias:
            slot = type(ins.ins[2]) is int
            bias = Bias(2 if slot else None, None if slot else float(ins.ins[2]), bias_own,
                        shape[2] if slot else (), n, m)
        return StepPlan("linear", (product,), bias)
    # linear_vjp: (g w, g^T x, the sum of g's rows) as ``needs`` asks
    (n, o), needs = shape[0], p.needs
    results: list[Product | Reduction] = []
    if needs[0]:
        results.append(_product(0, (1, n, o), own[0], 2, (1, o, shape[2][1]), own[2],
                                False, False, hold_shared))
    if needs[1]:
        results.append(_product(0, (1, n, o), own[0], 1, (1, n, shape[1][1]), own[1],
                                True, False, hold_shared))
    if needs[2]:
        results.append(_reduction(0, "sum", own[0], (n, o), (0,), hold_shared))
    return StepPlan("linear_vjp", tuple(results))


def _product(ia: int, sa: tuple[int, ...], own_a: bool, ib: int, sb: tuple[int, ...],
             own_b: bool, ta: bool, tb: bool, hold_shared: bool) -> Product:
    """op(a) @ op(b) at every point (``sa``, ``sb``: a point's stored 3-d shapes)."""
    sa3, sb3 = _three(sa), _three(sb)
    n = max(sa3[0], sb3[0])                # the products a point has
    M, K = (sa3[2], sa3[1]) if ta else (sa3[1], sa3[2])
    N = sb3[1] if tb else sb3[2]
    size = n * M * N
    if not own_a and not own_b:            # the same product at every point: once
        return Product(Read(ia, False, Layout.ONE, sa3), Read(ib, False, Layout.ONE, sb3),
                       ta, tb, False, not hold_shared, size)
    if own_a and not own_b and sb3[0] == 1:        # the points' rows, one matrix
        return Product(Read(ia, True, Layout.FLAT, sa3, transposed=ta),
                       Read(ib, False, Layout.ONE, sb3), False, tb, True, False, size)
    if own_b and not own_a and sa3[0] == sb3[0] == 1 and N == 1:
        # a vector a point against a shared matrix: rows @ op(A)^T, op(A) read in place
        vectors = Read(ib, True, Layout.FLAT, (1, 1, K))      # (K, 1) or (1, K): K values
        return Product(vectors, Read(ia, False, Layout.ONE, sa3), False, not ta, True,
                       False, size)
    return Product(_stacked(ia, sa3, own_a, n), _stacked(ib, sb3, own_b, n), ta, tb, True,
                   False, size)


def _stacked(arg: int, shape: tuple[int, int, int], own: bool, n: int) -> Read:
    """An operand of a stack of B * n products."""
    if shape[0] == 1 and not own:          # the same for every product: stride 0
        return Read(arg, False, Layout.ONE, shape)
    if shape[0] != n or not own:           # one per product of each point: a copy
        return Read(arg, own, Layout.TILE, shape, repeat=n // shape[0])
    return Read(arg, True, Layout.STACK, shape)


def _reduction(arg: int, op: str, own: bool, shape: tuple[int, ...], axes: tuple[int, ...],
               hold_shared: bool) -> Reduction:
    size = math.prod(n for d, n in enumerate(shape) if d not in axes)
    if own:
        return Reduction(arg, op, True, shape, tuple(d + 1 for d in axes), False, size)
    return Reduction(arg, op, False, shape, axes, not hold_shared, size)


def _three(shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(shape) != 3:
        raise ValueError(f"a batched product reads 3-d operands (batch, rows, cols), got a "
                         f"slot of shape {shape}")
    return shape[0], shape[1], shape[2]
