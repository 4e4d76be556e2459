"""The older structural ops moved into the op table (reshape, transpose, sum, max, min,
where, getitem and put, matmul): each through every engine (``check_everywhere``),
max/min's tie rule everywhere, where's operands and getitem's indices of every kind."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import easyad as ad
from easyad import ops

from _op_engines import Case, check_everywhere
from conftest import OPENCL

CASES = {
    "reshape": Case(ops.get("reshape"), lambda x: x.reshape(4, -1),
                    lambda x: x.reshape(4, -1), lambda t: t.reshape(4, -1),
                    (2, 3, 2), {"shape": (4, -1)}, batch_axis=0),
    "transpose 3-d": Case(ops.get("transpose"), lambda x: x.transpose(2, 0, 1),
                          lambda x: x.transpose(2, 0, 1), lambda t: t.permute(2, 0, 1),
                          (2, 3, 2), {"axes": (2, 0, 1)}, batch_axis=1),
    "sum axes keepdims": Case(ops.get("sum"), lambda x: x.sum(axis=(0, 2), keepdims=True),
                              lambda x: x.sum(axis=(0, 2), keepdims=True),
                              lambda t: t.sum(dim=(0, 2), keepdim=True),
                              (2, 3, 2), {"axes": (0, 2), "keepdims": True}, batch_axis=1),
    "max axis": Case(ops.get("max"), lambda x: x.max(axis=1), lambda x: x.max(axis=1),
                     lambda t: torch.amax(t, dim=1), (3, 4), {"axes": (1,)}, batch_axis=0),
    "min negative axis kept": Case(ops.get("min"), lambda x: x.min(axis=(-2,), keepdims=True),
                                   lambda x: x.min(axis=(-2,), keepdims=True),
                                   lambda t: torch.amin(t, dim=(0,), keepdim=True),
                                   (2, 4), {"axes": (-2,), "keepdims": True}, batch_axis=2),
    # (0.2: no element crosses it between the point and the replay's, check_everywhere's
    # x and x1 at seed 0, so the scalar recording's guards hold)
    "where": Case(ops.get("where"), lambda x: ad.where(x > 0.2, x * x, x),
                  lambda x: np.where(x > 0.2, x * x, x),
                  lambda t: torch.where(t > 0.2, t * t, t), (2, 3), {},
                  batch_axis=None),        # (ops.batched takes one operand)
    "getitem basic": Case(ops.get("getitem"), lambda x: x[1:, ::2], lambda x: x[1:, ::2],
                          lambda t: t[1:, ::2], (3, 4),
                          {"key": (slice(1, None), slice(None, None, 2))}, batch_axis=0),
    "getitem take": Case(ops.get("getitem"), lambda x: x[[0, 2, 0], 1],
                         lambda x: x[[0, 2, 0], 1], lambda t: t[[0, 2, 0], 1], (3, 4),
                         {"key": ([0, 2, 0], 1)}, batch_axis=0),
    "put": Case(ops.get("put"),
                lambda x: ops.call(ops.get("put"), (x,), {"shape": (4, 3), "key": slice(1, 3)}),
                lambda x: np.pad(x, ((1, 1), (0, 0))),
                lambda t: torch.nn.functional.pad(t, (0, 0, 1, 1)), (2, 3), {},
                batch_axis=None),          # (no batching rule: the shape is a parameter)
    "matmul broadcast batch": Case(ops.get("matmul"), lambda x: x @ x[0], lambda x: x @ x[0],
                                   lambda t: t @ t[0], (2, 3, 3), {},
                                   batch_axis=None),   # (ops.batched takes one operand)
    "matmul vector": Case(ops.get("matmul"), lambda x: x[:, 0] @ x, lambda x: x[:, 0] @ x,
                          lambda t: t[:, 0] @ t, (3, 3), {}, batch_axis=None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_in_every_engine(name):
    check_everywhere(CASES[name])


def test_ties_share_the_adjoint_evenly_in_every_engine():
    """docs/tensors.md: a max's adjoint is split evenly among the tied elements; its
    tangent is the mean of theirs. Eager (the core's fast path on numpy, the table on
    OpenCL), the table's general path (tuple axes), replayed and forward mode."""
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])
    want = {"max": np.array([[0.0, 0.5, 0.5], [0.5, 0.5, 0.0]]),
            "min": np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])}
    for op, grad in want.items():
        for axis in (1, (1,)):
            def f(t, op=op, axis=axis):
                return ad.sum(getattr(t, op)(axis=axis))
            for device in ["numpy", *OPENCL]:
                lst = ad.WengertList()
                t = ad.Tensor.variable(x, lst, device=device)
                d = f(t).derivatives(create_graph=True)
                np.testing.assert_array_equal(d[t].value, grad, err_msg=f"{op} {device}")
                F = ad.record(f, x, tensor=True, device=device)
                np.testing.assert_array_equal(F.gradient(x), grad, err_msg=f"{op} replayed")
            tangent = ad.TraceTensor.variable(x, np.arange(6.0).reshape(2, 3))
            assert f(tangent).derivative == float(np.sum(grad * np.arange(6.0).reshape(2, 3)))


def test_shape_rules_raise_before_any_kernel():
    t = ad.Tensor.constant(np.zeros((2, 3)))
    with pytest.raises(ad.ShapeError, match="cannot reshape"):
        ops.call(ops.get("reshape"), (t,), {"shape": (4, 2)})
    with pytest.raises(ad.ShapeError, match="not a permutation"):
        ops.call(ops.get("transpose"), (t,), {"axes": (0, 0)})
    with pytest.raises(ad.ShapeError, match="out of range"):
        ops.call(ops.get("sum"), (t,), {"axes": (2,)})
    with pytest.raises(ValueError, match="empty tensor"):
        ops.call(ops.get("max"), (ad.Tensor.constant(np.zeros((0, 3))),), {"axes": (1,)})
    with pytest.raises(TypeError, match="parameter 'keepdims' must be bool"):
        ops.call(ops.get("sum"), (t,), {"keepdims": 1})
    spec = ad.eval_shape(lambda z: z.transpose(1, 0, 2).reshape(6, -1).max(axis=0),
                         ad.ShapeDtype((2, 3, 4), np.float32))
    assert spec.shape == (4,) and spec.dtype == np.float32


def test_reshape_and_transpose_keep_bools_and_zero_d_tensors():
    mask = ad.Tensor.constant(np.array([[1.0, -1.0, 2.0]])) > 0.0
    assert mask.dtype == np.bool_
    assert mask.reshape(3, 1).dtype == np.bool_
    assert mask.transpose(1, 0).dtype == np.bool_
    one = ad.Tensor.variable(np.array([2.5]), ad.WengertList(), device=OPENCL[0]) \
        if OPENCL else ad.Tensor.variable(np.array([2.5]), ad.WengertList())
    zero_d = ops.call(ops.get("reshape"), (one,), {"shape": ()})
    assert isinstance(zero_d, ad.Tensor) and zero_d.shape == ()
    assert one.sum(axis=(0,)).number == 2.5          # a reduction's 0-d result: a number


def test_where_takes_numbers_records_and_array_conditions():
    """where's operands keep their kinds: a scalar Record's adjoint is a number (the
    count of elements it was chosen for), a float stays a literal, a numpy or list
    condition is made bool; every device, eager and create_graph, by hand."""
    x = np.array([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]])
    for device in ["numpy", *OPENCL]:
        lst = ad.WengertList()
        t = ad.Tensor.variable(x, lst, device=device)
        r = lst.variable(2.0)
        y = ad.where(t > 0, t * t, r)
        np.testing.assert_array_equal(y.value, np.where(x > 0, x * x, 2.0))
        d = ad.sum(y).derivatives(create_graph=True)
        np.testing.assert_array_equal(d[t].value, np.where(x > 0, 2 * x, 0.0))
        assert d[r].number == 3.0
        y32 = ad.where([[True, False, True]] * 2, t.astype(np.float32), 0.5)
        assert y32.dtype == np.float32
        np.testing.assert_array_equal(y32.value, np.where([[1, 0, 1]] * 2, x, 0.5))
    spec = ad.eval_shape(lambda z: ad.where(z > 0, z, 0.0), ad.ShapeDtype((2, 3), np.float32))
    assert spec.shape == (2, 3) and spec.dtype == np.float32
    with pytest.raises(ad.ShapeError, match="where"):
        ad.where(ad.Tensor.constant(x) > 0, ad.Tensor.constant(np.ones(4)), 0.0)


def test_getitem_of_every_kind_of_index_and_its_adjoint():
    """Ints, slices, None, Ellipsis, negative steps, integer arrays with repeats, masks:
    the value is numpy's, the adjoint adds up at repeated elements (np.add.at by hand),
    eager on every device and replayed."""
    x = np.arange(24.0).reshape(2, 3, 4) / 7.0
    keys = [(1, slice(None, None, -1), None, 2), (Ellipsis, 1), ([1, 1, 0], slice(1, 3)),
            (slice(None), [2, 0, 2], [3, 3, 0]), x[..., 0] > 1.0, -1]
    for key in keys:
        want = np.zeros_like(x)
        np.add.at(want, key, 1.0)
        for device in ["numpy", *OPENCL]:
            lst = ad.WengertList()
            t = ad.Tensor.variable(x, lst, device=device)
            y = t[key]
            np.testing.assert_array_equal(y.value, x[key], err_msg=f"{key} {device}")
            np.testing.assert_array_equal(ad.sum(y).derivatives()[t], want)
            F = ad.record(lambda z, key=key: ad.sum(z[key] * 1.0), x, tensor=True,
                          device=device)
            np.testing.assert_array_equal(F.gradient(x), want, err_msg=f"replayed {key}")
    with pytest.raises(IndexError, match="out of bounds"):
        ad.Tensor.constant(x)[:, 3]
    with pytest.raises(ValueError, match="put: an operand of shape"):
        ops.call(ops.get("put"), (ad.Tensor.constant(np.ones(3)),), {"shape": (4,),
                                                                     "key": slice(0, 2)})


def test_batching_rules_of_the_ops_with_several_operands():
    """where's and matmul's batching rules (ops.batched takes one operand): every operand
    given a batch axis first, one call equals the loop over the slices (numpy lowering
    and eager tensors)."""
    rng = np.random.default_rng(3)
    calls = {"where": (rng.normal(size=(3, 2, 4)) > 0, rng.normal(size=(3, 2, 4)),
                       rng.normal(size=(3, 1, 4))),
             "matmul": (rng.normal(size=(3, 2, 4)), rng.normal(size=(3, 4, 5)))}
    reference = {"where": np.where, "matmul": np.matmul}
    for name, operands in calls.items():
        op = ops.get(name)
        params, out_axis = op.batch(op.bind({}), 0)
        assert out_axis == 0
        want = np.stack([reference[name](*(v[k] for v in operands)) for k in range(3)])
        np.testing.assert_array_equal(ops.apply(op, params, operands), want)
        tensors = tuple(ad.Tensor.constant(v) if v.dtype != bool else v for v in operands)
        np.testing.assert_array_equal(ops.apply(op, params, tensors).value, want)
    with pytest.raises(NotImplementedError, match="batch axis first"):
        ops.get("matmul").batch(ops.get("matmul").bind({}), 1)
