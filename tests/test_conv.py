"""Convolution and pooling (``ops/_conv.py``, ``ops/_pool.py``, ``nn``'s conv layers):
each op through every engine (``check_everywhere``: reverse, forward, create_graph,
record/replay, eval_shape, batching), and ``nn.functional``/the layers against
torch 2.13.0's with the same weights, forward and backward, float64 and float32."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import easyad as ad
from easyad import ops
from easyad.errors import ShapeError

from _op_engines import Case, check_everywhere


def _split(shapes):
    """One flat operand cut into arrays (check_everywhere differentiates one operand)."""
    sizes = [int(np.prod(s)) for s in shapes]
    ends = np.cumsum([0] + sizes)

    def cut(x):
        return [x[ends[k]:ends[k + 1]].reshape(s) for k, s in enumerate(shapes)]
    return cut, int(ends[-1])


def _case(op, shapes, ours, theirs, batch_axis=None):
    """A case of op with operands of ``shapes`` cut from one flat x; the values' reference
    is the numpy lowering (ours on arrays), torch's function the derivatives'."""
    cut, n = _split(shapes)
    return Case(ops.get(op), lambda x: ours(*cut(x)), lambda x: ours(*cut(x)),
                lambda t: theirs(*cut(t)), (n,), {}, batch_axis=batch_axis)


CASES = {
    "conv1d": _case("conv", [(1, 2, 5), (2, 2, 2)], ops.conv, TF.conv1d),
    "conv2d stride pad groups": _case(
        "conv", [(1, 2, 4, 4), (2, 1, 2, 2)],
        lambda x, w: ops.conv(x, w, stride=2, padding=1, groups=2),
        lambda x, w: TF.conv2d(x, w, stride=2, padding=1, groups=2)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_in_every_engine(name):
    check_everywhere(CASES[name])
