"""The op table's built-in ops (flip, cumsum) through every engine, and the table's own
checks: typed parameters, shape rules, registration."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import easyad as ad
from easyad import ops

from _op_engines import Case, check_everywhere

CASES = {
    "flip axis 1": Case(ops.get("flip"), lambda x: ad.flip(x, axis=1),
                        lambda x: np.flip(x, axis=1), lambda t: torch.flip(t, (1,)),
                        (3, 4), {"axes": (1,)}, batch_axis=1),
    "flip every axis": Case(ops.get("flip"), lambda x: ad.flip(x),
                            lambda x: np.flip(x), lambda t: torch.flip(t, (0, 1, 2)),
                            (2, 3, 2), {"axes": None}),
    "flip negative axis": Case(ops.get("flip"), lambda x: ad.flip(x, axis=(-1, 0)),
                               lambda x: np.flip(x, axis=(-1, 0)),
                               lambda t: torch.flip(t, (0, 1)), (3, 2), {"axes": (-1, 0)},
                               batch_axis=2),
    "cumsum axis 0": Case(ops.get("cumsum"), lambda x: ad.cumsum(x, axis=0),
                          lambda x: np.cumsum(x, axis=0), lambda t: torch.cumsum(t, 0),
                          (4, 3), {"axis": 0}, batch_axis=0),
    "cumsum axis -1": Case(ops.get("cumsum"), lambda x: ad.cumsum(x, axis=-1),
                           lambda x: np.cumsum(x, axis=-1), lambda t: torch.cumsum(t, -1),
                           (2, 3, 4), {"axis": -1}, batch_axis=1),
    "cumsum flattened": Case(ops.get("cumsum"), lambda x: ad.cumsum(x),
                             lambda x: np.cumsum(x), lambda t: torch.cumsum(t.reshape(-1), 0),
                             (2, 3), {"axis": 0}, batch_axis=None),
    "concatenate": Case(ops.get("concatenate"), lambda x: ad.concatenate([x[:, :2], x], axis=1),
                        lambda x: np.concatenate([x[:, :2], x], axis=1),
                        lambda t: torch.cat([t[:, :2], t], 1), (3, 4), {"axis": 1},
                        batch_axis=None),        # (ops.batched takes one operand)
    "stack": Case(ops.get("concatenate"), lambda x: ad.stack([x, 2.0 * x, x], axis=-1),
                  lambda x: np.stack([x, 2.0 * x, x], axis=-1),
                  lambda t: torch.stack([t, 2.0 * t, t], -1), (2, 3), {"axis": 0},
                  batch_axis=None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_in_every_engine(name):
    check_everywhere(CASES[name])


def test_numpy_functions_dispatch_to_the_table():
    x = np.arange(6.0).reshape(2, 3)
    t = ad.Tensor.constant(x)
    np.testing.assert_array_equal(np.flip(t, axis=0).value, np.flip(x, axis=0))
    np.testing.assert_array_equal(np.cumsum(t, axis=1).value, np.cumsum(x, axis=1))
    tt = ad.TraceTensor.variable(x)
    np.testing.assert_array_equal(np.cumsum(tt, axis=1).tangent, np.cumsum(np.ones((2, 3)), 1))


def test_float32_and_big_endian_operands_keep_their_dtype():
    x = np.array([[1.5, -2.0, 3.25]], dtype=">f4")
    for device in ["numpy", *[d.name for d in ad.devices() if d.kind == "opencl"]]:
        out = ad.cumsum(ad.Tensor.constant(x, device=device), axis=1)
        assert out.dtype is np.dtype(np.float32)
        np.testing.assert_array_equal(out.value, np.cumsum(x.astype(np.float32), axis=1))


def test_parameters_are_typed_and_checked_before_any_kernel():
    x = ad.Tensor.constant(np.zeros((2, 3)))
    with pytest.raises(TypeError, match="parameter 'axis' must be int"):
        ad.cumsum(x, axis=1.5)
    with pytest.raises(TypeError, match="parameter 'axis' must be int"):
        ad.cumsum(x, axis=True)
    with pytest.raises(np.exceptions.AxisError, match="axis 2 is out of bounds"):
        ad.cumsum(x, axis=2)
    with pytest.raises(ValueError, match="repeated"):
        ad.flip(x, axis=(1, -1))
    with pytest.raises(TypeError, match="unexpected parameter"):
        ops.call(ops.get("flip"), (x,), {"axis": 0})
    with pytest.raises(ValueError, match="0-d operand has no axis"):
        ops.call(ops.get("cumsum"), (ad.Tensor.constant(np.array(1.0)),), {"axis": 0})
    assert ad.cumsum(np.int64(7)).tolist() == [7.0]          # numpy's axis=None: flattened


def test_registration_is_checked():
    @dataclasses.dataclass(frozen=True)
    class P:
        axis: int
    flip = ops.get("flip")
    with pytest.raises(ValueError, match="registered already"):
        ops.register(dataclasses.replace(flip))
    with pytest.raises(TypeError, match="only a linear op may leave it out"):
        ops.register(ops.Op("nonlinear_no_jvp", P, flip.rule, flip.numpy, flip.vjp))
    with pytest.raises(KeyError, match="registered"):
        ops.get("no_such_op")
    import pickle
    assert pickle.loads(pickle.dumps(flip)) is flip      # by name: one definition


def test_object_arrays_run_the_scalar_form_and_tensors_refuse_records():
    lst = ad.WengertList()
    xs = np.array([lst.variable(1.0), lst.variable(2.0), lst.variable(4.0)], dtype=object)
    out = ad.cumsum(xs)
    assert [r.number for r in out] == [1.0, 3.0, 7.0]
    d = (out[2] * out[1]).derivatives()
    assert [d[r] for r in xs] == [10.0, 10.0, 3.0]      # 2*x0 + x1*2 + ... by hand


def test_every_op_of_the_table_is_checked_here():
    """Each op of the table has a case here or in a ``tests/test_ops_*.py`` module's CASES
    (which runs them through ``check_everywhere`` itself)."""
    import importlib
    import pathlib
    cases = dict(CASES)
    for path in sorted(pathlib.Path(__file__).parent.glob("test_ops_*.py")):
        cases.update(getattr(importlib.import_module(path.stem), "CASES", {}))
    assert set(ops.OPS) <= {case.op.name for case in cases.values()}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_extremes_agree_bit_for_bit_across_engines(dtype):
    """Signed zeros, infinities, NaN and overflow through the numpy lowering, every OpenCL
    kernel and the replayed programs (fused on numpy, kernels on OpenCL): the same bits."""
    big = np.finfo(dtype).max
    x = np.array([[-0.0, 1.0, np.inf, -np.inf, 2.0],
                  [np.nan, -0.0, -0.0, big, big],
                  [0.5, -0.5, 1e-30, -1e-30, 3.0]], dtype=dtype)
    with np.errstate(all="ignore"):
        want = {"flip": np.flip(x, axis=1), "cumsum0": np.cumsum(x, axis=0),
                "cumsum1": np.cumsum(x, axis=1)}

    def run(v):
        return {"flip": ad.flip(v, axis=1), "cumsum0": ad.cumsum(v, axis=0),
                "cumsum1": ad.cumsum(v, axis=1)}
    devices = ["numpy", *[d.name for d in ad.devices() if d.kind == "opencl"]]
    for device in devices:
        got = run(ad.Tensor.constant(x, device=device))
        for name, w in want.items():
            _same_bits(got[name].value, w, f"{name} eager {device}")
        for name in want:
            F = ad.record(lambda v, name=name: run(v)[name] * 1.0, x, tensor=True,
                          device=device)
            _same_bits(np.asarray(F(x)), want[name], f"{name} replayed {device}")


def _same_bits(got, want, what):
    assert got.dtype == want.dtype, what
    same = (got == want) & (np.signbit(got) == np.signbit(want)) | \
        (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{what}: {got} != {want}"
