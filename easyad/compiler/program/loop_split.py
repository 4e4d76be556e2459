"""Where the C renderer (``cstyle.Renderer``) splits an elementwise loop into an outer
loop over its first k axes around an inner vector loop over the rest. The same elements
in the same order either way: nothing computed changes, only what gcc can vectorise.

- An operand the same along the first axes (a batch's values under a Jacobian's basis)
  is read in order by the inner index instead of gathered at a reduced flat index (gcc's
  vector gathers; a 16 x 64 x 16 tangent loop ran 10% faster), where the inner loop is
  at least ``inner`` elements.
- An operand the same along the last axes (a batch's x[0] under the basis) is gathered
  at a divided index in a flat loop: the widest inner loop of at least ``lanes``
  elements in which every operand is read in order or not at all (the renderer loads
  the latter once per outer step; the forward batched Jacobian's tangent loop as
  1024 x 16: 3x faster).
- Sums (max, min) over the last axes into more than one number: an outer loop over what
  they keep, each a running value in a register over the inner loop, added in the same
  order as the flat loop's ``+=`` into memory (the reverse batched Jacobian's sum over
  the elements: 2.6x faster).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from easyad.compiler.program.plan import Plan, broadcast_strides, contiguous
from easyad.tensor._program import Instruction


def outer_split(plan: Plan, groups: list[tuple[Any, list[Instruction]]], inner: int,
                lanes: int) -> tuple[tuple[int, ...], int, bool] | None:
    """(the loop's shape, k, whether reduces sum over the inner axes), or None."""
    shapes = {tuple(shape) for shape, _ in groups}
    if len(shapes) != 1:
        return None
    shape = shapes.pop()
    members = [ins for _, group in groups for ins in group]
    if any(ins.op not in ("map", "strided", "take", "reduce") or plan.is_pad(ins)
           for ins in members):
        return None
    reduces = [ins for ins in members if ins.op == "reduce"]
    if reduces:
        ks = {len(shape) - len(ins.params.axes) if tuple(ins.params.axes) == tuple(
            range(len(shape) - len(ins.params.axes), len(shape))) else -1
            for ins in reduces}
        if len(ks) != 1:          # (-1: a reduce over other axes than the last)
            return None
        k = ks.pop()
        return (shape, k, True) if 0 < k < len(shape) else None
    best, divided = 0, False
    for strides in _operand_strides(plan, members, shape):
        divided |= len(shape) > 1 and shape[-1] > 1 and strides[-1] == 0 and any(strides)
        k = 0
        while k < len(shape) - 1 and (strides[k] == 0 or shape[k] == 1):
            k += 1
        if math.prod(shape[:k]) > 1:
            best = max(best, k)
    if divided and not (best and math.prod(shape[best:]) >= inner and
                        in_order(plan, members, shape, best)):
        for k in range(1, len(shape)):
            if math.prod(shape[k:]) >= lanes and in_order(plan, members, shape, k):
                return shape, k, False
    if not best or math.prod(shape[best:]) < inner:
        return None
    return shape, best, False


def in_order(plan: Plan, members: list[Instruction], shape: tuple[int, ...], k: int) -> bool:
    """Whether every operand of the loop's maps, split at axis k, is read by the inner
    index in order (a contiguous run) or not at all (the same along the inner axes)."""
    inner = shape[k:]
    return all(all(s == 0 for s in strides[k:]) or contiguous(inner, strides[k:])
               for strides in _operand_strides(plan, members, shape))


def _operand_strides(plan: Plan, members: list[Instruction], shape: tuple[int, ...]
                     ) -> Iterator[list[int]]:
    """The strides, broadcast to the loop's shape, of every slot the loop's maps read."""
    p = plan.program
    for ins in members:
        if ins.op == "map":
            for i in ins.ins:
                if type(i) is int and p.shapes[i] is not None:
                    yield broadcast_strides(p.shapes[i], shape)
