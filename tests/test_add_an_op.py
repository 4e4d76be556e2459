"""Adding a structural op is one registration of the op table (plus its kernel).

docs/internals.md ("How to add an op") promises it; this test does it. It registers
``roll`` (numpy.roll along one axis) as ONE ``ops.Op``: typed parameters, the shape rule,
the vjp written with easyad operations (the op itself, rolled back), the batching rule, the
numpy lowering (which also runs on object arrays of Records and Traces) and a composite
lowering for every other backend (one gather of the Backend Protocol: ``take``). Nothing
else is edited. Then ``roll`` works in every engine, checked against numpy and torch.func
(``tests/_op_engines.py``): eager Tensors on numpy and every OpenCL device, reverse mode and
create_graph, TraceTensor, NestedTrace, ``ad.record`` of scalar code with ``compile()``,
``ad.record(tensor=True)`` replayed on every device, ``eval_shape`` and batching.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from easyad import ops

from _op_engines import Case, check_everywhere


@dataclasses.dataclass(frozen=True)
class RollParams:
    shift: int
    axis: int


def _rule(p, shape):
    if not -len(shape) <= p.axis < len(shape):
        raise np.exceptions.AxisError(f"roll: axis {p.axis} is out of bounds for "
                                      f"{len(shape)} dimension(s)")
    return shape, RollParams(p.shift, p.axis % len(shape))


def _composite(be, p, buf):
    shape = tuple(buf.shape)
    index = np.roll(np.arange(int(np.prod(shape))).reshape(shape), p.shift, p.axis)
    return be.reshape(be.take(buf, index.reshape(-1)), shape)


@pytest.fixture
def roll():
    op = ops.register(ops.Op(
        name="roll_for_test", params=RollParams, rule=_rule,
        numpy=lambda p, x: np.roll(x, p.shift, axis=p.axis),
        vjp=lambda p, g, x, out: (ops.apply(op, RollParams(-p.shift, p.axis), (g,)),),
        batch=lambda p, b: (RollParams(p.shift, p.axis + (p.axis >= b)), b),
        composite=_composite, linear=True, objects=True))
    try:
        yield op
    finally:
        ops.unregister("roll_for_test")


@pytest.mark.parametrize("shift, axis, shape", [(1, 0, (4, 3)), (-2, 1, (2, 5)),
                                                (3, -1, (2, 2, 3))])
def test_a_registered_op_works_in_every_engine(roll, shift, axis, shape):
    def ours(x):
        return ops.call(roll, (x,), {"shift": shift, "axis": axis})
    check_everywhere(Case(roll, ours, lambda x: np.roll(x, shift, axis=axis),
                          lambda t: torch.roll(t, shift, axis), shape,
                          {"shift": shift, "axis": axis}, batch_axis=0))


def test_a_registered_op_checks_its_parameters(roll):
    with pytest.raises(TypeError, match="parameter 'shift' must be int"):
        ops.call(roll, (np.zeros(3),), {"shift": "1", "axis": 0})
    with pytest.raises(np.exceptions.AxisError, match="out of bounds"):
        ops.call(roll, (np.zeros(3),), {"shift": 1, "axis": 1})
