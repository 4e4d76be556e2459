"""One op of the op table through every engine, against numpy and torch.func.

``check_everywhere(case)`` runs ``L(x) = sum(w * sin(op(x)))`` (nonlinear, so second
derivatives are not zero) through: numpy arrays; eager Tensors on numpy and every OpenCL
device (value, gradient, create_graph's Hessian-vector product); TraceTensor (a
directional derivative); object arrays of NestedTraces (v^T H v); ``ad.record`` of scalar
code (object arrays of Records: value, gradient, Hessian, and ``compile()``);
``ad.record(tensor=True)`` replayed at a new point on numpy and every OpenCL device;
``ad.eval_shape``; and the op's batching rule against a loop over slices. The references
are numpy's function (values) and torch.func (gradients, Hessians) in float64.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.func import grad as tgrad
from torch.func import hessian as thessian

import easyad as ad
from easyad import ops

from conftest import OPENCL


@dataclasses.dataclass
class Case:
    op: Any                              # the table's Op
    ours: Callable[[Any], Any]           # x -> the op through easyad's public call
    numpy: Callable[[np.ndarray], np.ndarray]
    torch: Callable[[Any], Any]
    shape: tuple[int, ...]
    params: dict[str, Any]               # the op's keyword parameters (for ops.batched)
    batch_axis: int | None = 0           # None: no batching check (e.g. a flattening call)
    scalar_engines: bool = True          # False: an op with no scalar form (objects=False,
    #                                      e.g. a LAPACK call): no object-array checks


def _loss(case: Case, w: np.ndarray) -> Callable[[Any], Any]:
    def f(x: Any) -> Any:
        return ad.sum(ad.sin(case.ours(x)) * w)
    return f


def _references(case: Case, x: np.ndarray, w: np.ndarray, v: np.ndarray
                ) -> tuple[float, np.ndarray, np.ndarray]:
    tw = torch.tensor(w, dtype=torch.float64)

    def f(t: Any) -> Any:
        return torch.sum(torch.sin(case.torch(t)) * tw)
    tx = torch.tensor(x, dtype=torch.float64)
    value = float(f(tx))
    gradient = tgrad(f)(tx).numpy()
    n = x.size
    hessian = thessian(f)(tx).reshape(n, n).numpy()
    hv = (hessian @ v.reshape(-1)).reshape(x.shape)
    return value, gradient, hv


def check_everywhere(case: Case, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=case.shape)
    w = rng.normal(size=case.numpy(x).shape)
    v = rng.normal(size=case.shape)
    value, gradient, hv = _references(case, x, w, v)
    f = _loss(case, w)
    close = np.testing.assert_allclose

    # numpy arrays: the numpy lowering itself
    close(case.ours(x), case.numpy(x), rtol=0, atol=0)

    # eager tensors, every device: value, gradient, create_graph's H v
    for device in ["numpy", *OPENCL]:
        lst = ad.WengertList()
        t = ad.Tensor.variable(x, lst, device=device)
        close(case.ours(t).value, case.numpy(x), rtol=1e-13, atol=1e-13, err_msg=device)
        y = f(t)
        assert abs(y.number - value) <= 1e-12 * max(1.0, abs(value)), device
        d = y.derivatives(create_graph=True)
        close(d[t].value, gradient, rtol=1e-11, atol=1e-12, err_msg=device)
        second = ad.sum(d[t] * v).derivatives()[t]
        close(second, hv, rtol=1e-10, atol=1e-11, err_msg=f"{device} H v")

    # forward mode: the derivative along v
    tt = ad.TraceTensor.variable(x, v)
    assert abs(f(tt).derivative - float(np.sum(gradient * v))) <= 1e-11

    x1 = x + 0.25 * v
    v1, g1, hv1 = _references(case, x1, w, v)
    if case.scalar_engines:
        _scalar_engines(case, f, x, v, hv, x1, v1, g1, hv1)

    # ad.record of tensor code, replayed at x1 on every device
    for device in ["numpy", *OPENCL]:
        T = ad.record(f, x, tensor=True, device=device)
        assert type(T).__name__ == "TensorFunction"
        assert abs(float(T(x1)) - v1) <= 1e-12 * max(1.0, abs(v1)), device
        close(T.gradient(x1), g1, rtol=1e-11, atol=1e-12, err_msg=f"replayed {device}")
        hessian = np.asarray(T.hessian(x1)).reshape(x.size, x.size)
        close((hessian @ v.reshape(-1)).reshape(x.shape), hv1, rtol=1e-10, atol=1e-11,
              err_msg=f"replayed Hessian {device}")

    # eval_shape: the shape rule, nothing run
    spec = ad.eval_shape(case.ours, ad.ShapeDtype(case.shape, np.float32))
    assert spec.shape == case.numpy(x).shape and spec.dtype == np.float32

    # the batching rule: one call over a batch axis equals the loop over its slices
    if case.batch_axis is None:
        return
    stack = rng.normal(size=case.shape[:case.batch_axis] + (3,) + case.shape[case.batch_axis:])
    by_rule = ops.batched(case.op, stack, case.batch_axis, **case.params)
    slices = [case.numpy(np.take(stack, k, axis=case.batch_axis)) for k in range(3)]
    close(by_rule, np.stack(slices, axis=case.batch_axis), rtol=0, atol=0)
    by_rule_t = ops.batched(case.op, ad.Tensor.constant(stack), case.batch_axis, **case.params)
    close(by_rule_t.value, by_rule, rtol=0, atol=0)


def _scalar_engines(case: Case, f: Any, x: np.ndarray, v: np.ndarray, hv: np.ndarray,
                    x1: np.ndarray, v1: float, g1: np.ndarray, hv1: np.ndarray) -> None:
    close = np.testing.assert_allclose
    # forward over forward on object arrays of NestedTraces: v^T H v
    nested = np.empty(case.shape, dtype=object)
    for i in np.ndindex(case.shape):
        nested[i] = ad.Trace(ad.Trace(x[i], v[i]), ad.Trace(v[i], 0.0))
    vhv = f(nested).derivative.derivative
    assert abs(vhv - float(np.sum(v * hv))) <= 1e-10 * max(1.0, abs(vhv))

    # ad.record of scalar code (object arrays of Records): the scalar engines
    F = ad.record(lambda z: f(z.reshape(case.shape)), x.reshape(-1))   # takes one 1-d point
    assert type(F).__name__ == "Function"
    flat = x1.reshape(-1)
    assert abs(F(flat) - v1) <= 1e-12 * max(1.0, abs(v1))
    close(F.gradient(flat), g1.reshape(-1), rtol=1e-11, atol=1e-12)
    close(F.hessian(flat) @ v.reshape(-1), hv1.reshape(-1), rtol=1e-10, atol=1e-11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ad.CompilerWarning)   # no compiler: the VM
        C = F.compile()
    close(C.gradient(flat), g1.reshape(-1), rtol=1e-11, atol=1e-12, err_msg="compiled")
