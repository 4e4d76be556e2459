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
    "conv2d dilation asymmetric padding": _case(
        "conv", [(2, 3, 4), (2, 2, 2, 2)],
        lambda x, w: ops.conv(x, w, padding=(1, 0, 0, 1), dilation=(1, 2)),
        lambda x, w: TF.conv2d(TF.pad(x, (0, 1, 1, 0)), w, dilation=(1, 2))),
    "conv_transpose": _case(
        "conv_transpose", [(1, 2, 2, 2), (2, 1, 2, 2)],
        lambda g, w: ops.conv_transpose(g, w, size=(3, 3), stride=2, padding=1, groups=2),
        lambda g, w: TF.conv_transpose2d(g, w, stride=2, padding=1, output_padding=1,
                                         groups=2)),
    "conv_weight": _case(
        "conv_weight", [(1, 2, 4), (1, 3, 3)],
        lambda x, g: ops.call(ops.get("conv_weight"), (x, g), {"size": (2,)}),
        # the conv's vjp in its weight (linear in w: any point)
        lambda x, g: torch.func.vjp(lambda w: TF.conv1d(x, w),
                                    torch.zeros(3, 2, 2, dtype=x.dtype))[1](g)[0]),
    "max_pool": Case(ops.get("max_pool"), lambda x: ops.max_pool(x, (2, 2), 1, 1),
                     lambda x: ops.max_pool(x, (2, 2), 1, 1),
                     lambda t: TF.max_pool2d(t, 2, 1, 1), (2, 3, 3), {"kernel": (2, 2),
                     "stride": (1,), "padding": (1,)}, batch_axis=0, scalar_engines=False),
    "avg_pool": Case(ops.get("avg_pool"), lambda x: ops.avg_pool(x, (3,), 2, 1, False),
                     lambda x: ops.avg_pool(x, (3,), 2, 1, False),
                     lambda t: TF.avg_pool1d(t, 3, 2, 1, count_include_pad=False), (2, 5),
                     {"kernel": (3,), "stride": (2,), "padding": (1,),
                      "count_include_pad": False}, batch_axis=0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_in_every_engine(name):
    check_everywhere(CASES[name])
