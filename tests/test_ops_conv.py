"""The convolution and pooling ops of the table (``ops/_conv.py``, ``ops/_pool.py``,
OpenCL kernels in ``ops/_conv_cl.py``) through every engine (``check_everywhere``:
reverse, forward, create_graph, record/replay on every device, eval_shape, batching),
against torch.func; their derivative ops (conv_transpose, conv_weight, max_pool_gather,
max_pool_scatter, avg_pool_transpose) are cases of their own."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from easyad import ops

from _op_engines import Case, check_everywhere


def _split(shapes):
    """One flat operand cut into arrays (check_everywhere differentiates one operand)."""
    sizes = [int(np.prod(s)) for s in shapes]
    ends = np.cumsum([0] + sizes)

    def cut(x):
        return [x[ends[k]:ends[k + 1]].reshape(s) for k, s in enumerate(shapes)]
    return cut, int(ends[-1])


def _case(op, shapes, ours, theirs, batch_axis=None, scalar_engines=True):
    """A case of op with operands of ``shapes`` cut from one flat x; the values' reference
    is the numpy lowering (ours on arrays), torch's function the derivatives'."""
    cut, n = _split(shapes)
    return Case(ops.get(op), lambda x: ours(*cut(x)), lambda x: ours(*cut(x)),
                lambda t: theirs(*cut(t)), (n,), {}, batch_axis=batch_axis,
                scalar_engines=scalar_engines)


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


def _torch_gather(h, x):
    # h at the elements torch's max_pool2d(x) chooses
    _, at = TF.max_pool2d(x.detach(), 2, 1, 1, return_indices=True)
    return h.flatten(-2).gather(-1, at.flatten(-2)).reshape(at.shape)


def _torch_scatter(g, x):
    # max_pool2d's vjp at x (x held fixed), applied to g
    return torch.func.vjp(lambda z: TF.max_pool2d(z, 2, 1, 1), x.detach())[1](g)[0]


CASES.update({
    "max_pool_gather": _case(
        "max_pool_gather", [(1, 2, 3, 3), (1, 2, 3, 3)],
        lambda h, x: ops.call(ops.get("max_pool_gather"), (h, x),
                              {"kernel": (2, 2), "stride": (1,), "padding": (1,)}),
        _torch_gather, scalar_engines=False),
    "max_pool_scatter": _case(
        "max_pool_scatter", [(1, 2, 4, 4), (1, 2, 3, 3)],
        lambda g, x: ops.call(ops.get("max_pool_scatter"), (g, x),
                              {"kernel": (2, 2), "stride": (1,), "padding": (1,)}),
        _torch_scatter, scalar_engines=False),
    "avg_pool_transpose": Case(
        ops.get("avg_pool_transpose"),
        lambda g: ops.call(ops.get("avg_pool_transpose"), (g,), {
            "kernel": (3,), "stride": (2,), "padding": (1,), "size": (5,)}),
        lambda g: ops.call(ops.get("avg_pool_transpose"), (g,), {
            "kernel": (3,), "stride": (2,), "padding": (1,), "size": (5,)}),
        lambda g: torch.func.vjp(lambda z: TF.avg_pool1d(z, 3, 2, 1),
                                 torch.zeros(2, 5, dtype=g.dtype))[1](g)[0],
        (2, 3), {"kernel": (3,), "stride": (2,), "padding": (1,), "size": (5,)},
        batch_axis=0),
})


@pytest.mark.parametrize("name", list(CASES))
def test_op_in_every_engine(name):
    check_everywhere(CASES[name])
