"""Which transforms are open while ``f`` runs: the state behind nested transforms with
closures (``_evaluation.py`` opens the levels; the tensor layer reads them).

Every transform call opens a level. A forward level is a Trace depth: the transform makes
its inputs one depth above every level open around it (and above its point), so a Trace
of an outer transform that f's closure holds meets them as a constant of the outer level,
never as the same perturbation. Reverse levels share one list: a reverse transform inside
another records onto the open list (sweeps with create_graph), so the Records a closure
holds are on the tape it differentiates. The state: (the depth of the innermost open
forward level, the open list or None); (0, None) outside every transform.
"""
from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

LEVEL: contextvars.ContextVar[tuple[int, Any]] = contextvars.ContextVar(
    "easyad_transform_level", default=(0, None))
OUTSIDE = (0, None)


def inside() -> bool:
    """Whether a transform is running ``f`` (values of different levels may meet)."""
    return LEVEL.get() != OUTSIDE


@contextmanager
def opened(depth: int, tape: Any) -> Iterator[None]:
    token = LEVEL.set((depth, tape))
    try:
        yield
    finally:
        LEVEL.reset(token)


# ---- vmap (easyad/transforms/vmap.py): batched values and the transforms above them ----

class BatchedBase:
    """The base of vmap's batched values, here so that the layers below the transforms
    (the op table's call, the tensor functions) recognise one without importing it: a
    value of this class answers ``_batched_apply(op, params, args)`` and
    ``_elementwise(function, args)`` (an elementwise function of plain operands, run on
    the whole batch: the strong-zero helpers of recorded sweeps)."""

    __slots__ = ()


# how many vmaps are running (a cheap test for the op table's call and the derivative
# transforms, which then look for batched operands), and the hook the derivative
# transforms call with batched arguments: ``LIFT[0](name, f, args, options)`` returns their
# result, or NotImplemented when nothing of theirs is batched (vmap.py sets it)
VMAPS = [0]
LIFT: list[Any] = [None]
