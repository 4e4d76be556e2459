"""Issue 26's "done when": every numpy and linear algebra function of the registry
(``tests/_coverage.py``) in every transform, against torch.func in float64 (1e-10).

The matrix is generated from the registry: one test per row and transform. Each runs
``L(x) = sum(w * sin(f(x)))`` (nonlinear, so second derivatives are not zero) at the row's
sample: ``reverse`` (eager Tensor: value and gradient), ``forward`` (TraceTensor: the
derivative along v), ``create_graph`` (the gradient differentiated again: H v),
``replay`` (``ad.record(tensor=True)`` replayed at another point: value, gradient,
Hessian-vector product; fused C but for the ufuncs' rows, prod's, cumprod's and
cumsum's ops C functions of it), ``opencl`` (eager on the
first OpenCL device, the same three, with the table ops that ran on host copies equal to
the row's ``host``; and replayed there kernel by kernel: value, gradient). The coverage
table of docs/scientific.md is the registry's rendering. The tolerance is 1e-10 but
where a row says otherwise (torch's polygamma: see tests/_coverage.py).
"""
from __future__ import annotations

import functools
import pathlib

import numpy as np
import pytest
import torch
from torch.func import grad as tgrad
from torch.func import hessian as thessian

import easyad as ad
from easyad.compiler.program.fused_c import FusedProgram
from easyad.ops import _table

from _coverage import ROWS, row_ids, table
from conftest import OPENCL

BY_ID = dict(zip(row_ids(), ROWS))
LINE_OPS = {"np.prod", "np.cumprod", "np.cumsum"}     # rows replayed through table_c
TRANSFORMS = ["reverse", "forward", "create_graph", "replay", "opencl"]


@functools.cache
def _sample(rid: str):
    row = BY_ID[rid]
    rng = np.random.default_rng(sum(map(ord, rid)))
    x = rng.uniform(-1.0, 1.0, size=row.shape)
    v = rng.uniform(-1.0, 1.0, size=row.shape)
    w = rng.normal(size=np.shape(row.call(x)))
    return x, v, w


@functools.cache
def _reference(rid: str, at: str):
    """torch.func's value, gradient and H v of the loss, at the sample or the replay
    point (x + v/10)."""
    row = BY_ID[rid]
    x, v, w = _sample(rid)
    point = x if at == "x" else x + 0.1 * v
    tw = torch.tensor(w, dtype=torch.float64)

    def loss(t):
        return torch.sum(torch.sin(row.torch(t)) * tw)
    t = torch.tensor(point, dtype=torch.float64)
    hessian = thessian(loss)(t).reshape(x.size, x.size).numpy()
    return float(loss(t)), tgrad(loss)(t).numpy(), (hessian @ v.reshape(-1)).reshape(x.shape)


def _loss(rid: str):
    row = BY_ID[rid]
    w = _sample(rid)[2]
    return lambda x: ad.sum(ad.sin(row.call(x)) * w)


def _tol(rid: str) -> dict[str, float]:
    return {"rtol": BY_ID[rid].tol, "atol": BY_ID[rid].tol}


def _close_number(rid, ours, expected, what):
    assert abs(ours - expected) <= BY_ID[rid].tol * max(1.0, abs(expected)), \
        (what, ours, expected)


def _eager(rid: str, device: str) -> None:
    x, v, _ = _sample(rid)
    value, gradient, hv = _reference(rid, "x")
    t = ad.Tensor.variable(x, ad.WengertList(), device=device)
    y = _loss(rid)(t)
    _close_number(rid, y.number, value, f"value on {device}")
    d = y.derivatives(create_graph=True)
    np.testing.assert_allclose(d[t].value, gradient, **_tol(rid), err_msg=device)
    second = ad.sum(d[t] * v).derivatives()[t]
    np.testing.assert_allclose(second, hv, **_tol(rid), err_msg=f"H v on {device}")


def _replayed(rid: str, device: str, hessian: bool) -> None:
    x, v, _ = _sample(rid)
    value, gradient, hv = _reference(rid, "x1")
    x1 = x + 0.1 * v
    # fused programs cost a compilation each (~1 s without a warm cache): the ufuncs' rows,
    # and every row on OpenCL, replay kernel by kernel (the fused loops of every rule are
    # tested by the every-rule programs of tests/test_tensor_record*.py, fused OpenCL
    # programs of the table's ops by tests/test_ops*.py's check_everywhere)
    fuse = BY_ID[rid].kind != "ufunc" and device == "numpy"
    T = ad.record(_loss(rid), x, tensor=True, device=device, fuse=fuse)
    _close_number(rid, float(T(x1)), value, f"replayed value on {device}")
    np.testing.assert_allclose(T.gradient(x1), gradient, **_tol(rid), err_msg=device)
    if hessian:
        np.testing.assert_allclose(np.asarray(T.hvp(x1, v)), hv, **_tol(rid))
    if fuse:         # the table's line ops ran as the fused program's C, none as a step
        lowered = 0
        for bound in T._bound.values():
            if isinstance(bound, FusedProgram):
                steps = [item for kind, item in bound.plan.schedule if kind == "py"
                         and item.op == "op" and item.params.op.loop is not None]
                assert all(id(item) in bound.lowered for item in steps), rid
                lowered += len(steps)
        assert lowered or BY_ID[rid].name not in LINE_OPS, rid


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("rid", list(BY_ID))
def test_function_in_transform(rid, transform, monkeypatch):
    x, v, _ = _sample(rid)
    if transform == "reverse":
        value, gradient, _ = _reference(rid, "x")
        got_value, got = ad.value_and_grad(_loss(rid))(x)
        _close_number(rid, float(got_value), value, "value")
        np.testing.assert_allclose(got, gradient, **_tol(rid))
    elif transform == "forward":
        gradient = _reference(rid, "x")[1]
        tt = ad.TraceTensor.variable(x, v)
        _close_number(rid, _loss(rid)(tt).derivative, float(np.sum(gradient * v)), "jvp")
    elif transform == "create_graph":
        _eager(rid, "numpy")
    elif transform == "replay":
        _replayed(rid, "numpy", hessian=True)
    else:
        if not OPENCL:
            pytest.skip("no working OpenCL device")
        on_host = set()
        lower = _table.Op.lower

        def watched(op, be, params, bufs, shape, dtype):
            if be.kind == "opencl" and not (op.opencl is not None and be.proven_op(op, dtype)) \
                    and op.composite is None:
                on_host.add(op.name)
            return lower(op, be, params, bufs, shape, dtype)
        monkeypatch.setattr(_table.Op, "lower", watched)
        _eager(rid, OPENCL[0])
        assert on_host == set(BY_ID[rid].host), \
            f"{rid}: ran on host copies {sorted(on_host)}, the registry says {BY_ID[rid].host}"
        monkeypatch.undo()
        _replayed(rid, OPENCL[0], hessian=False)


def test_every_listed_function_has_a_row():
    """The issue's list, against the registry (a function dropped from it fails here)."""
    listed = (
        "sum prod mean var std max min cumsum cumprod argmax argmin argsort reshape "
        "transpose moveaxis swapaxes squeeze expand_dims broadcast_to concatenate stack "
        "split tile repeat flip roll pad diag diagonal trace triu tril where clip sort take "
        "take_along_axis outer inner dot matmul einsum tensordot kron logaddexp logaddexp2 "
        "copysign fmax fmin").split()
    linalg = ("norm solve inv det slogdet cholesky eigh eigvalsh svd qr lstsq pinv "
              "matrix_power").split()
    names = {row.name for row in ROWS}
    missing = [f for f in listed if f"np.{f}" not in names]
    missing += [f for f in linalg if f"np.linalg.{f}" not in names]
    missing += [f for f in ("expm", "solve_triangular", "cho_solve", "lu_solve")
                if f"ad.linalg.{f}" not in names]
    assert not missing
    from easyad import _rules
    ufuncs = {r.name for r in _rules.RULES if r.generic and not r.stops_gradient
              and not r.integer_order}
    spelled = {row.name.rsplit(".", 1)[1] for row in ROWS if row.kind == "ufunc"}
    # a row spells numpy's name, which may be the rule's alias (arcsin for asin)
    spellings = {r.name: {r.name, *r.aliases} for r in _rules.RULES}
    assert [u for u in sorted(ufuncs) if not spellings[u] & spelled] == []


def test_docs_table_is_the_registry():
    text = (pathlib.Path(__file__).parent.parent / "docs" / "scientific.md").read_text()
    rendered = table()
    assert rendered in text, ("docs/scientific.md's coverage table differs from the "
                              "registry: paste the output of `python tests/_coverage.py`")
