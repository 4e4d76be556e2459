"""Backend steps of a batched OpenCL program (``batch_cl.BatchedCLProgram``): ``matmul``
and ``reduce`` run once for all the points of a chunk, on the batch's buffers.

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
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from easyad.tensor._program import Instruction

STEPS = ("guard", "matmul", "reduce")     # the backend steps a batched program runs


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
        self.roots = [r(i) for i in ins.ins]
        self.shapes = [tuple(shapes[i]) for i in ins.ins] + [tuple(shapes[o]) for o in ins.outs]
        self.run_step = _matmul_step if ins.op == "matmul" else _reduce_step

    def run(self, be: Any, arrays: list[Any], points: int,
            shared: Callable[[int], bool]) -> None:
        out = self.run_step(self, be, arrays, points, shared)
        if getattr(out, "offset", 0):       # the kernels take whole buffers
            out = out.copy()
        arrays[self.instruction.outs[0]] = out


def _matmul_step(step: BatchStep, be: Any, arrays: list[Any], points: int,
                 shared: Callable[[int], bool]) -> Any:
    p = step.instruction.params
    ta, tb = p.transpose_a, p.transpose_b
    (ra, rb), (sa, sb, so) = step.roots, step.shapes
    a, b = arrays[ra], arrays[rb]
    own_a, own_b = not shared(ra), not shared(rb)
    n, M, N = so
    K = sa[1] if ta else sa[2]
    if not own_a and not own_b:        # the same product at every point: once, tiled
        c = _matmul(be, be.reshape(a, sa), be.reshape(b, sb), ta, tb)
        return _tile(be, c, points, 1, c.size, True)
    if own_a and not own_b and not ta and sb[0] == 1:     # the points' rows, one matrix: one GEMM
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


def _reduce_step(step: BatchStep, be: Any, arrays: list[Any], points: int,
                 shared: Callable[[int], bool]) -> Any:
    p = step.instruction.params
    (root,), (shape, _) = step.roots, step.shapes
    if shared(root):          # once, tiled
        total = be.reduce(p.op, be.reshape(arrays[root], shape), tuple(p.axes))
        return _tile(be, total, points, 1, total.size, True)
    return be.reduce(p.op, be.reshape(arrays[root], (points,) + shape),
                     tuple(d + 1 for d in p.axes))
